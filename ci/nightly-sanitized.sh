#!/usr/bin/env bash
# The nightly sanitized tier (one GPU): the regressions tier under every compute-sanitizer tool,
# through the native paths and the workers, beside the same runs unsanitized, then the planted
# defects each tool must catch.
#
#   ci/nightly-sanitized.sh [STEP ...]     (no STEP: every step, in this order)
#
#   plain       run --matrix regressions (native paths, --bounds-check off), then the same with
#               --paths none --impl $IMPLS: the times the sanitized runs compare with
#   memcheck    the same two runs with --sanitize memcheck (padding after every allocation)
#   initcheck   ... --sanitize initcheck (reads of memory never written)
#   racecheck   ... --sanitize racecheck (shared-memory races)
#   synccheck   ... --sanitize synccheck (barrier misuse)
#   planted     the planted defects, each unsanitized and sanitized: the faulty worker's read
#               past a tensor into the one allocated after it (GPU_NEIGHBOR, smoke tier) and
#               its gather of rel_logits row cu_seqlens_q[B] (GPU_ROW_GATHER) on the padded and
#               the exact-rows variants of rel_logits_padding_rows_read, under memcheck; then
#               `relattn mutants` for rel_row_past_end (memcheck), empty_split_published
#               (initcheck) and combine_max_unsynced (racecheck)
#
# $FILTER (default: the long and large regression cases left out, as in
# ci/gpu-triton-sanitize.sh) narrows every run; $IMPLS (default vllm,triton,fa4,flex) names the
# workers (set and empty: the native paths only); NATIVE=0 leaves the native paths out. Needs: a relattn binary ($RELATTN_BIN, else a release build here); compute-sanitizer
# on PATH or in $RELATTN_SANITIZER; for the workers RELATTN_VLLM_ROOT (adapters/tools/
# fetch_vllm.sh --kernels), torch, Triton and the CuTe DSL packages on PYTHONPATH (docs/ci.md).
#
# Writes under ${OUT:-nightly-sanitized-out}: logs/STEP*.log, reports/STEP*/, timings.tsv (step,
# command, exit code, wall seconds). Exit 0 when every run exited 0 or 1 (a failing trial is a
# finding) and every planted defect was caught where it must be and not where it must not;
# else 1 for a planted defect not caught, or the first other exit code (2 bad input, 3 no GPU
# or no compute-sanitizer).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

start_logged nightly-sanitized-out
IMPLS="${IMPLS-vllm,triton,fa4,flex}"
NATIVE="${NATIVE:-1}"
TIMEOUT="${WORKER_TIMEOUT_S:-300}"
FILTER="${FILTER:-$SANITIZED_FILTER}"
GATHER_CASES="rel_logits_padding_rows_read"
NEIGHBOUR_TRIALS="prefill_128x16,all_zero_table"

# step NAME ARGS...: relattn ARGS, logged and timed (common.sh).
step() { logged_step 2 "$@"; }

# sanitized_pair NAME [--sanitize TOOL]: the native run and the workers' run of the tier.
sanitized_pair() {
    local name=$1
    shift
    if [[ $NATIVE != 0 ]]; then
        step "$name-native" run --require-gpu --matrix regressions --filter "$FILTER" \
            --bounds-check off --no-compile-checks "$@" --out "$out/reports/$name-native"
    fi
    [[ -n $IMPLS ]] || return 0
    step "$name-workers" run --require-gpu --matrix regressions --filter "$FILTER" --paths none \
        --impl "$IMPLS" --worker-timeout-s "$TIMEOUT" "$@" --out "$out/reports/$name-workers"
}

# caught NAME PLAIN SANITIZED MUST MUST_NOT: the faulty worker's rows: every trial passed
# unsanitized; sanitized, the trials whose names contain a MUST substring failed as
# out-of-bounds accesses and every other trial (those naming a MUST_NOT substring among them)
# passed. Prints the verdict; exit 1 when it does not hold.
caught() {
    python3 - "$@" <<'EOF'
import glob, json, os, sys
name, plain_dir, sanitized_dir, must, must_not = sys.argv[1:6]
must = [m for m in must.split(",") if m]
must_not = [m for m in must_not.split(",") if m]
def rows(folder):
    out = []
    for path in glob.glob(os.path.join(folder, "*", "results.jsonl")):
        out += [json.loads(line) for line in open(path) if line.strip()]
    return [r for r in out if r["path"] == "faulty/faulty"]
plain, sanitized = rows(plain_dir), rows(sanitized_dir)
wrong = [("plain", r["trial"]) for r in plain if r["status"] != "pass"]
hits = spared = 0
for r in sanitized:
    hit = any(m in r["trial"] for m in must) and not any(m in r["trial"] for m in must_not)
    spared += any(m in r["trial"] for m in must_not)
    oob = r["status"] == "fail" and "out-of-bounds access" in (r.get("message") or "")
    hits += hit
    if hit != oob or (not hit and r["status"] != "pass"):
        wrong.append(("sanitized", r["trial"]))
ok = bool(plain and sanitized and hits and not wrong and (spared or not must_not))
print(f"{name}: {'caught' if ok else 'NOT CAUGHT'}: {hits} planted trials failed sanitized, "
      f"{spared} spared as they must be, of {len(sanitized)}; unexpected: {wrong[:5] or 'none'}")
sys.exit(0 if ok else 1)
EOF
}

planted() {
    local smoke=(run --require-gpu --matrix smoke --paths none --impl faulty --no-compile-checks)
    local gather=(run --require-gpu --matrix regressions --filter "regression=$GATHER_CASES"
        --paths none --impl faulty --no-compile-checks)
    export RELATTN_FAULTY_GPU_NEIGHBOR="$NEIGHBOUR_TRIALS"
    step neighbour-plain "${smoke[@]}" --out "$out/reports/neighbour-plain"
    step neighbour "${smoke[@]}" --sanitize memcheck --out "$out/reports/neighbour"
    unset RELATTN_FAULTY_GPU_NEIGHBOR
    caught neighbour "$out/reports/neighbour-plain" "$out/reports/neighbour" \
        "$NEIGHBOUR_TRIALS" "" || { [[ $status -ne 0 ]] || status=1; }
    # Both variants of the case read row cu_seqlens_q[B]: inside the allocation (a padding row)
    # in the padded one, past its end in the exact one, so only the exact one may fail.
    export RELATTN_FAULTY_GPU_ROW_GATHER="$GATHER_CASES"
    step row-gather-plain "${gather[@]}" --out "$out/reports/row-gather-plain"
    step row-gather "${gather[@]}" --sanitize memcheck --out "$out/reports/row-gather"
    unset RELATTN_FAULTY_GPU_ROW_GATHER
    caught row-gather "$out/reports/row-gather-plain" "$out/reports/row-gather" \
        "rows_exact" "" || { [[ $status -ne 0 ]] || status=1; }
    step mutant-memcheck mutants --only rel_row_past_end --sanitize memcheck
    step mutant-initcheck mutants --only empty_split_published --sanitize initcheck
    step mutant-racecheck mutants --only combine_max_unsynced --sanitize racecheck
    local m
    for m in memcheck initcheck racecheck; do
        if ! grep -q "every planted defect was caught" "$out/logs/mutant-$m.log"; then
            echo "mutant-$m: NOT CAUGHT (log: $out/logs/mutant-$m.log)"
            [[ $status -ne 0 ]] || status=1
        fi
    done
}

run_step() {
    case $1 in
    plain) sanitized_pair plain ;;
    memcheck | initcheck | racecheck | synccheck) sanitized_pair "$1" --sanitize "$1" ;;
    planted) planted ;;
    *)
        echo "nightly-sanitized.sh: unknown step $1 (steps: plain memcheck initcheck racecheck" \
            "synccheck planted)" >&2
        exit 2 ;;
    esac
}

steps=("$@")
if [[ ${#steps[@]} -eq 0 ]]; then
    steps=(plain memcheck initcheck racecheck synccheck planted)
fi
for s in "${steps[@]}"; do
    run_step "$s"
done
column -t -s $'\t' "$timings" 2>/dev/null || cat "$timings"
exit "$status"
