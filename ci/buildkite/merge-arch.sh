#!/usr/bin/env bash
# Buildkite merge step for one architecture of the nightly:
#   ci/buildkite/merge-arch.sh ARCH        (ARCH: sm90 or sm100)
# Downloads the shards' report artifacts of this build, fetches the baseline (the last good
# nightly's merged report, kept under $RELATTN_BASELINE_URL/ARCH), runs ci/merge.sh with a
# strict diff (--strict-coverage added to $RELATTN_DIFF_ARGS), and on the default branch
# promotes the merged report to be the next baseline only when all of these hold: the diff ran
# against a baseline and found no regression, it was strict (no --allow-missing), and the
# merged report is complete (every shard of the shard set, every run finished). The first
# night has no baseline to diff against: set RELATTN_BOOTSTRAP_BASELINE=1 once to promote a
# complete merged report without a diff.
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

diff_args="${RELATTN_DIFF_ARGS:-}"
if [[ " $diff_args " != *" --strict-coverage "* && " $diff_args " != *" --allow-missing "* ]]; then
    diff_args="$diff_args --strict-coverage"
fi

rc=0
RELATTN_DIFF_ARGS="$diff_args" RELATTN_MERGED_OUT="merged/$arch" ci/merge.sh "$baseline" "nightly/$arch"/nightly-shard-* || rc=$?
buildkite-agent artifact upload "merged/$arch/**/*"
if [[ -f "merged/$arch/$arch/summary.md" ]]; then
    buildkite-agent annotate --style "$([[ $rc -eq 0 ]] && echo success || echo error)" \
        --context "nightly-$arch" < "merged/$arch/$arch/summary.md"
fi

promote=no
if [[ $rc -eq 0 && -n "${RELATTN_BASELINE_URL:-}" \
      && "${BUILDKITE_BRANCH:-}" == "${BUILDKITE_PIPELINE_DEFAULT_BRANCH:-main}" ]]; then
    if ! report_complete "merged/$arch"; then
        echo "--- :warning: merged report for $arch is INCOMPLETE: not promoted to baseline"
    elif [[ $baseline == "-" ]]; then
        if [[ "${RELATTN_BOOTSTRAP_BASELINE:-}" == 1 ]]; then
            promote=yes
        else
            echo "--- no baseline for $arch: set RELATTN_BOOTSTRAP_BASELINE=1 to promote this one"
        fi
    elif strict_diff_args "$diff_args"; then
        promote=yes
    else
        echo "--- :warning: diff for $arch was not strict (--allow-missing): not promoted"
    fi
fi
if [[ $promote == yes ]]; then
    aws s3 sync --only-show-errors --delete "merged/$arch" "$RELATTN_BASELINE_URL/$arch"
fi
exit "$rc"
