#!/usr/bin/env bash
# Nightly shard job: shard K of N (K counts from 1) of the `nightly` tier on this runner's GPU.
#   ci/nightly.sh K N [extra relattn run arguments]
# The CI system runs N of these per architecture (the fan-out is the CI's: relattn only picks
# the shard's cases, deterministically and disjointly). The report lands in
# $RELATTN_OUT/nightly-shard-K-of-N/<arch>/ so the shards' artifacts never collide; ci/merge.sh
# combines them. Runs with --require-gpu: a runner without a usable GPU exits 3 (and writes no
# report, so the merge sees the shard missing). Exit code: relattn's, unchanged.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [[ $# -lt 2 ]] || ! [[ $1 =~ ^[0-9]+$ && $2 =~ ^[0-9]+$ ]] || (( $1 < 1 || $1 > $2 )); then
    echo "usage: ci/nightly.sh K N   (1 <= K <= N)" >&2
    exit 2
fi
k=$1
n=$2
shift 2

out="${RELATTN_OUT:-reports-out}/nightly-shard-$k-of-$n"
bin=$(relattn_bin)

rc=0
"$bin" run --require-gpu --matrix nightly --shard "$k/$n" --out "$out" "$@" || rc=$?
collect_junit "$out"
exit "$rc"
