#!/usr/bin/env bash
# GPU check of vLLM's Triton op and of `--sanitize memcheck` (one H200), in steps:
#
#   ci/gpu-triton-sanitize.sh [STEP ...]        (no STEP: every step, in this order)
#
#   triton-regressions  run --matrix regressions --paths none --impl triton
#   triton-ci           run --matrix ci --paths none --impl triton (the whole tier, about 4
#                       minutes; $TRITON_CI_SHARD=K/N runs one part)
#   triton-bench        bench --paths fallback --impl triton on the five bench shapes
#   native-sanitize     run --matrix regressions (native paths) unsanitized, then with
#                       --sanitize memcheck; $SANITIZE_FILTER leaves out the long cases
#   vllm-sanitize       the same with --paths none --impl vllm
#   tiles-sanitize      the padded-query-tile cases (rel_logits_tile_overrun,
#                       rel_logits_padding_rows_read, padding_row_writes, warmup_spec_verify9)
#                       with --sanitize memcheck through $TILE_IMPLS (vllm,fa4,flex,triton)
#   mutant              mutants --only rel_row_past_end --sanitize memcheck: the planted read
#                       past the last rel_logits row, built without the bounds check, must be
#                       caught by memcheck alone on every path it is in
#   worker-mutant       the same for a worker: the faulty worker's GPU_OOB read past a tensor
#                       (a Triton kernel) on $OOB_TRIALS (4 smoke trials), run unsanitized (every
#                       trial passes: the read changes nothing) and with --sanitize memcheck
#                       (those trials fail as out-of-bounds accesses, the others pass)
#
# Needs: a relattn binary ($RELATTN_BIN, else a release build here); compute-sanitizer on PATH
# or in $RELATTN_SANITIZER (sanitize steps); RELATTN_VLLM_ROOT = an unpacked vLLM wheel
# (adapters/tools/fetch_vllm.sh DEST for triton; with --kernels for vllm and fa4); torch and Triton
# (the H200 machine has both); for vllm and fa4 the CuTe DSL packages on PYTHONPATH
# (adapters/tools/unpack_wheels.sh, adapters/tools/install_packages.sh --wheels).
#
# Writes under ${OUT:-gpu-triton-sanitize-out}: logs/STEP*.log (each command's output),
# reports/STEP*/ (relattn reports), timings.tsv (step, command, exit code, wall seconds), and
# bench.json. Every step runs whatever the previous ones gave; the exit code is 0 when every
# command exited 0 or 1 (a failing trial is a finding, not a broken check) and worker-mutant
# caught its planted reads, else the first other code (2 bad input, 3 no GPU or no
# compute-sanitizer; 1 when the planted reads were not caught).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

start_logged gpu-triton-sanitize-out

TRITON_CI_SHARD="${TRITON_CI_SHARD:-}"
OOB_TRIALS="${OOB_TRIALS:-prefill_128x16,all_zero_table}"
TILE_IMPLS="${TILE_IMPLS:-vllm,fa4,flex,triton}"
TIMEOUT="${WORKER_TIMEOUT_S:-300}"
SANITIZE_FILTER="${SANITIZE_FILTER:-$SANITIZED_FILTER}"
TILE_FILTER="regression=rel_logits_tile_overrun,rel_logits_padding_rows_read,padding_row_writes,warmup_spec_verify9"

# step NAME ARGS...: run relattn with ARGS, log and time it, keep the first unexpected exit code
# (common.sh).
step() { logged_step 3 "$@"; }

# caught PLAIN SANITIZED: whether the planted reads ($OOB_TRIALS) were caught: every faulty
# trial passed unsanitized, and sanitized exactly the planted ones failed as out-of-bounds
# accesses. Prints the verdict; exit 1 when not.
caught() {
    python3 - "$OOB_TRIALS" "$@" <<'EOF'
import glob, json, os, sys
planted = [p for p in sys.argv[1].split(",") if p]
def rows(folder):
    out = []
    for path in glob.glob(os.path.join(folder, "*", "results.jsonl")):
        out += [json.loads(line) for line in open(path) if line.strip()]
    return [r for r in out if r["path"] == "faulty/faulty"]
plain, sanitized = rows(sys.argv[2]), rows(sys.argv[3])
wrong = [r["trial"] for r in plain if r["status"] != "pass"]
for r in sanitized:
    hit = any(p in r["trial"] for p in planted)
    oob = r["status"] == "fail" and "out-of-bounds access" in (r.get("message") or "")
    if hit != oob or (not hit and r["status"] != "pass"):
        wrong.append(r["trial"])
hits = sum(any(p in r["trial"] for p in planted) for r in sanitized)
ok = bool(plain and sanitized and hits and not wrong)
print(f"worker-mutant: {'caught' if ok else 'NOT CAUGHT'}: {hits} planted of {len(sanitized)} "
      f"trials; unexpected: {wrong[:5] or 'none'}")
sys.exit(0 if ok else 1)
EOF
}

run_step() {
    case $1 in
    triton-regressions)
        step "$1" run --require-gpu --matrix regressions --paths none --impl triton \
            --no-compile-checks --worker-timeout-s "$TIMEOUT" --out "$out/reports/$1" ;;
    triton-ci)
        step "$1" run --require-gpu --matrix ci ${TRITON_CI_SHARD:+--shard "$TRITON_CI_SHARD"} --paths none \
            --impl triton --no-compile-checks --worker-timeout-s "$TIMEOUT" --out "$out/reports/$1" ;;
    triton-bench)
        step "$1" bench --paths fallback --impl triton \
            --shapes decode8k_b32,decode128k,prefill8k,prefill8k_local,mixed --row-budget-s 4 \
            --worker-timeout-s "$TIMEOUT" --json "$out/bench.json" ;;
    native-sanitize)
        step "$1-plain" run --require-gpu --matrix regressions --filter "$SANITIZE_FILTER" \
            --bounds-check off --no-compile-checks --out "$out/reports/$1-plain"
        step "$1" run --require-gpu --matrix regressions --filter "$SANITIZE_FILTER" \
            --sanitize memcheck --no-compile-checks --out "$out/reports/$1" ;;
    vllm-sanitize)
        step "$1-plain" run --require-gpu --matrix regressions --filter "$SANITIZE_FILTER" \
            --paths none --impl vllm --worker-timeout-s "$TIMEOUT" --out "$out/reports/$1-plain"
        step "$1" run --require-gpu --matrix regressions --filter "$SANITIZE_FILTER" \
            --paths none --impl vllm --sanitize memcheck --worker-timeout-s "$TIMEOUT" \
            --out "$out/reports/$1" ;;
    tiles-sanitize)
        step "$1" run --require-gpu --matrix regressions --filter "$TILE_FILTER" --paths none \
            --impl "$TILE_IMPLS" --sanitize memcheck --worker-timeout-s "$TIMEOUT" \
            --out "$out/reports/$1" ;;
    mutant)
        step "$1" mutants --only rel_row_past_end --sanitize memcheck ;;
    worker-mutant)
        export RELATTN_FAULTY_GPU_OOB="$OOB_TRIALS"
        step "$1-plain" run --require-gpu --matrix smoke --paths none --impl faulty \
            --no-compile-checks --out "$out/reports/$1-plain"
        step "$1" run --require-gpu --matrix smoke --paths none --impl faulty \
            --sanitize memcheck --no-compile-checks --out "$out/reports/$1"
        unset RELATTN_FAULTY_GPU_OOB
        caught "$out/reports/$1-plain" "$out/reports/$1" || { [[ $status -ne 0 ]] || status=1; } ;;
    *)
        echo "gpu-triton-sanitize.sh: unknown step $1 (steps: triton-regressions triton-ci" \
            "triton-bench native-sanitize vllm-sanitize tiles-sanitize mutant worker-mutant)" >&2
        exit 2 ;;
    esac
}

steps=("$@")
if [[ ${#steps[@]} -eq 0 ]]; then
    steps=(triton-regressions triton-ci triton-bench native-sanitize vllm-sanitize tiles-sanitize
        mutant worker-mutant)
fi
for s in "${steps[@]}"; do
    run_step "$s"
done
echo "timings: $timings"
column -t -s $'\t' "$timings" 2>/dev/null || cat "$timings"
exit "$status"
