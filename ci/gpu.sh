#!/usr/bin/env bash
# GPU job (one GPU runner, per commit): the `ci` tier, then the named `regressions` tier, on the
# runner's GPU. Extra arguments go to both runs (e.g. `--paths all`).
#
# Reports land in $RELATTN_OUT/ci/<arch>/ and $RELATTN_OUT/regressions/<arch>/ (each tier in its
# own directory: both would write the same <arch>/ otherwise), with every junit.xml also copied
# to $RELATTN_OUT/junit/ for the CI's test views. Upload $RELATTN_OUT as the job's artifact.
#
# Both tiers run with --require-gpu: a runner without a usable GPU exits 3 instead of passing
# on the CPU part alone. Both tiers always run; the exit code is the first failing run's, passed
# through unchanged (1 = a trial failed, 2 = bad input, 3 = no usable GPU on this runner).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

out="${RELATTN_OUT:-reports-out}"
bin=$(relattn_bin)

status=0
for tier in ci regressions; do
    rc=0
    "$bin" run --require-gpu --matrix "$tier" --out "$out/$tier" "$@" || rc=$?
    echo "relattn run --matrix $tier: exit $rc"
    if [[ $status -eq 0 ]]; then
        status=$rc
    fi
done
collect_junit "$out"
exit "$status"
