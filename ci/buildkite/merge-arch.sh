#!/usr/bin/env bash
# Buildkite merge step for one architecture of the nightly:
#   ci/buildkite/merge-arch.sh ARCH        (ARCH: sm90 or sm100)
# Downloads the shards' report artifacts of this build, fetches the baseline (the last good
# nightly's merged report, kept under $RELATTN_BASELINE_URL/ARCH), runs ci/merge.sh, and on the
# default branch promotes the merged report to be the next baseline when it did not regress.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
cd "$repo_root"

arch=${1:?usage: ci/buildkite/merge-arch.sh ARCH}
buildkite-agent artifact download "nightly/$arch/**/*" .

baseline=-
if [[ -n "${RELATTN_BASELINE_URL:-}" ]]; then
    mkdir -p "baseline/$arch"
    aws s3 sync --only-show-errors "$RELATTN_BASELINE_URL/$arch" "baseline/$arch" || true
    if [[ -n "$(ls -A "baseline/$arch")" ]]; then
        baseline="baseline/$arch"
    fi
fi
if [[ $baseline == "-" ]]; then
    echo "--- :warning: no baseline for $arch yet: merging without a diff"
fi

rc=0
RELATTN_MERGED_OUT="merged/$arch" ci/merge.sh "$baseline" "nightly/$arch"/nightly-shard-* || rc=$?
buildkite-agent artifact upload "merged/$arch/**/*"
if [[ -f "merged/$arch/$arch/summary.md" ]]; then
    buildkite-agent annotate --style "$([[ $rc -eq 0 ]] && echo success || echo error)" \
        --context "nightly-$arch" < "merged/$arch/$arch/summary.md"
fi

if [[ $rc -eq 0 && -n "${RELATTN_BASELINE_URL:-}" \
      && "${BUILDKITE_BRANCH:-}" == "${BUILDKITE_PIPELINE_DEFAULT_BRANCH:-main}" ]]; then
    aws s3 sync --only-show-errors --delete "merged/$arch" "$RELATTN_BASELINE_URL/$arch"
fi
exit "$rc"
