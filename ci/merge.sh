#!/usr/bin/env bash
# Merge job: combine the nightly shards' reports, then diff the result against a baseline.
#   ci/merge.sh BASELINE_DIR SHARD_DIR...
# BASELINE_DIR is an earlier merged report (e.g. the last good nightly); "-" merges without a
# diff (the first night, before any baseline exists). Each SHARD_DIR is what ci/nightly.sh wrote.
#
# Writes $RELATTN_MERGED_OUT (default reports-merged): the merged report (<arch>/ directories),
# junit/, and diff.txt + diff.json. Extra `relattn report diff` options come from
# $RELATTN_DIFF_ARGS, e.g. "--error-factor 3 --strict-coverage" (add "--timing --throughput-drop
# 15" to judge throughput too; docs/reports.md says why it is off by default).
# Exit code: 0 no regression, 1 regression, 2 unreadable report or conflicting shards.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [[ $# -lt 2 ]]; then
    echo "usage: ci/merge.sh BASELINE_DIR|- SHARD_DIR..." >&2
    exit 2
fi
baseline=$1
shift

if [[ $baseline != "-" && ! -d $baseline ]]; then
    echo "ci/merge.sh: baseline $baseline is not a directory (give \"-\" to merge without a diff)" >&2
    exit 2
fi

out="${RELATTN_MERGED_OUT:-reports-merged}"
read -r -a diff_args <<< "${RELATTN_DIFF_ARGS:-}"
bin=$(relattn_bin)

"$bin" report merge "$@" --out "$out"
collect_junit "$out"
"$bin" report show "$out"

if [[ $baseline == "-" ]]; then
    echo "no baseline given: merged only, no diff" | tee "$out/diff.txt"
    exit 0
fi
# The JSON is for tools; its exit code is the same verdict as the text run's below.
"$bin" report diff "$baseline" "$out" "${diff_args[@]}" --json > "$out/diff.json" || true
rc=0
"$bin" report diff "$baseline" "$out" "${diff_args[@]}" > "$out/diff.txt" || rc=$?
cat "$out/diff.txt"
exit "$rc"
