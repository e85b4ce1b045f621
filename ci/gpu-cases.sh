#!/usr/bin/env bash
# The GPU check of case folders and capture, on one GPU machine:
#
#   ci/gpu-cases.sh RELATTN_BIN VLLM_ROOT [STEP] [ARGS...]
#
# RELATTN_BIN: a relattn binary; VLLM_ROOT: vLLM's files with the kernels
# (adapters/tools/fetch_vllm.sh DEST --kernels, or a source checkout); python3 must import torch,
# numpy and the CuTe DSL packages of docs/workers.md (adapters/tools/install_packages.sh DIR
# prints the PYTHONPATH). Everything is written under $OUT/gpu-cases when OUT is set, else under
# ${RELATTN_OUT:-reports-out}/gpu-cases: the cases, the reports, one log per step. ARGS go to
# every `relattn run` (e.g. --no-compile-checks). STEP, to run the check in parts:
#
#   make     20 case files (GPU_CASES_COUNT) from adapters/tests/make_case_folder.py --size gpu,
#            numpy written independently of relattn's generator: global and local layers (the
#            model's window and a narrower one), pages 16 to 256 with 128, bf16 and fp16, the
#            model's head pairs (G 2 to 8), decodes, prefills, chunks, prefill + decode mixes,
#            long decodes up to 131,072 keys, padding rows, zero-length requests
#   run      relattn run --cases CASES --impl vllm: the native paths and vLLM's op in one
#            report (runs/), then the pass/fail/skip/error counts per path. vLLM's paths
#            compile each new kernel variant (5 to 30 s each): GPU_CASES_FILTER (default
#            `path!=vllm/vllm_op_sheared,vllm/vllm_op_splits`, the production call only) and
#            GPU_CASES_SHARD (K/N: the Kth of N parts, each a report of its own) bound the time
#   capture  the vllm worker with capture on (RELATTN_CAPTURE_DIR) over a fifth of the cases
#            (vllm_op only), then relattn run --cases CAPTURED --impl vllm, the counts per
#            path, each captured output (`captured_out`, the op's own at capture time)
#            judged against relattn's reference, and the op run again on each captured call
#            (`relattn exec --impl vllm --path vllm_op`) compared with `captured_out`
#            (`capture.py compare`: the same bits in every real row, or what differs)
#   all      make, run, capture (default)
#
# Exit: 0 when every step ran and no native path failed or errored (vLLM's failures are
# findings, listed in the counts and in adapters/FINDINGS.md, not this script's failure); 1 when
# a native path failed or errored, or a captured call run again did not give its captured output;
# otherwise the failing step's exit code (2: bad input, 3: no usable GPU).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage() { echo "gpu-cases.sh: $*; usage: ci/gpu-cases.sh RELATTN_BIN VLLM_ROOT [make|run|capture|all] [ARGS...]" >&2; exit 2; }

[[ $# -ge 2 ]] || usage "give the relattn binary and the vLLM root"
bin=$1
root=$2
shift 2
step=all
if [[ $# -gt 0 && $1 != -* ]]; then
    step=$1
    shift
fi
case $step in make|run|capture|all) ;; *) usage "unknown step $step" ;; esac
[[ -x $bin ]] || usage "$bin is not an executable relattn binary"
[[ -f $root/vllm/models/inkling/nvidia/ops/fa4_rel_attention.py ]] ||
    usage "$root holds no vllm/models/inkling/nvidia/ops/fa4_rel_attention.py"
root=$(cd "$root" && pwd)

base="${OUT:-${RELATTN_OUT:-reports-out}}/gpu-cases"
cases="$base/cases"
count=${GPU_CASES_COUNT:-20}
filter=${GPU_CASES_FILTER:-path!=vllm/vllm_op_sheared,vllm/vllm_op_splits}
python=${RELATTN_PYTHON:-python3}
mkdir -p "$base"
export RELATTN_VLLM_ROOT=$root RELATTN_ADAPTERS="$here/adapters"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=${FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED:-1}

# `relattn run ...` with its output in $base/$1.log (and on the terminal); returns its exit code.
logged() {
    local log="$base/$1.log" rc=0
    shift
    echo "gpu-cases.sh: $*" | tee "$log" >&2
    "$@" 2>&1 | tee -a "$log" >&2 || rc=${PIPESTATUS[0]}
    echo "gpu-cases.sh: exit $rc" | tee -a "$log" >&2
    return "$rc"
}

# Pass/fail/skip/error per path of the reports under the folders given; exit 1 when a native
# path (no `/` in its name) failed or errored.
counts() {
    "$python" - "$@" <<'EOF'
import collections, glob, json, os, sys
table = collections.defaultdict(collections.Counter)
for folder in sys.argv[1:]:
    for path in glob.glob(os.path.join(folder, "*", "results.jsonl")):
        for line in open(path):
            if line.strip():
                row = json.loads(line)
                table[row["path"]][row["status"]] += 1
print(f"{'path':28} {'pass':>6} {'fail':>6} {'skip':>6} {'error':>6}")
for path in sorted(table):
    c = table[path]
    print(f"{path:28} {c['pass']:>6} {c['fail']:>6} {c['skip']:>6} {c['error']:>6}")
bad = [p for p in table if "/" not in p and (table[p]["fail"] or table[p]["error"])]
sys.exit(1 if bad else 0)
EOF
}

status=0
note() {   # keep the first non-zero exit code
    if [[ $status -eq 0 ]]; then status=$1; fi
}

if [[ $step == make || $step == all ]]; then
    rm -rf "$cases"
    logged make "$python" "$here/adapters/tests/make_case_folder.py" "$cases" --count "$count" --size gpu
    ls "$cases" >"$base/cases.txt"
fi

if [[ $step == run || $step == all ]]; then
    [[ -d $cases ]] || usage "no case folder $cases: run the make step first"
    shard=${GPU_CASES_SHARD:-}
    out="$base/runs/cases${shard:+-${shard/\//of}}"
    rm -rf "$out"
    rc=0
    logged "run${shard:+-${shard/\//of}}" "$bin" run --cases "$cases" --impl vllm --filter "$filter" \
        --worker-timeout-s 600 --out "$out" ${shard:+--shard "$shard"} "$@" || rc=$?
    [[ $rc -le 1 ]] || note "$rc"
    echo "gpu-cases.sh: the case folder, per path:" >&2
    counts "$base/runs"/cases* | tee "$base/run-counts.txt" || note 1
fi

if [[ $step == capture || $step == all ]]; then
    [[ -d $cases ]] || usage "no case folder $cases: run the make step first"
    captured="$base/captured"
    rm -rf "$captured" "$base/capture-run" "$base/captured-run"
    rc=0
    RELATTN_CAPTURE_DIR=$captured logged capture-calls "$bin" run --cases "$cases" --shard 1/5 \
        --paths none --impl vllm -k impl::vllm::vllm_op:: --worker-timeout-s 600 \
        --out "$base/capture-run" "$@" || rc=$?
    [[ $rc -le 1 ]] || note "$rc"
    files=$(find "$captured" -name '*.safetensors' 2>/dev/null | wc -l)
    echo "gpu-cases.sh: $files calls captured in $captured" >&2
    if [[ $files -eq 0 ]]; then
        echo "gpu-cases.sh: nothing was captured (see capture-calls.log)" >&2
        note 2
    else
        rc=0
        logged captured-run "$bin" run --cases "$captured" --impl vllm --filter "$filter" \
            --worker-timeout-s 600 --out "$base/captured-run" "$@" || rc=$?
        [[ $rc -le 1 ]] || note "$rc"
        echo "gpu-cases.sh: the captured calls, per path:" >&2
        counts "$base/captured-run" | tee "$base/captured-counts.txt" || note 1
        # The op's own output at capture time against relattn's reference.
        : >"$base/captured-judge.txt"
        for f in "$captured"/*.safetensors; do
            out_file="$base/captured-out.safetensors"
            "$python" "$here/adapters/tools/capture.py" output "$f" --output "$out_file"
            verdict=$("$bin" judge --input "$f" --output "$out_file" 2>/dev/null | head -n1 || true)
            echo "$(basename "$f"): $verdict" >>"$base/captured-judge.txt"
        done
        rm -f "$base/captured-out.safetensors"
        echo "gpu-cases.sh: the captured outputs judged: $(grep -c ': PASS' "$base/captured-judge.txt") pass, $(grep -c ': FAIL' "$base/captured-judge.txt") fail (captured-judge.txt)" >&2
        # The op run again on each captured call's inputs: the same bits as at capture time?
        : >"$base/captured-reproduce.txt"
        : >"$base/reproduce.log"
        for f in "$captured"/*.safetensors; do
            out_file="$base/rerun-out.safetensors"
            rm -f "$out_file"
            if "$bin" exec --impl vllm --path vllm_op --input "$f" --output "$out_file" \
                --worker-timeout-s 600 >>"$base/reproduce.log" 2>&1; then
                rc=0
                "$python" "$here/adapters/tools/capture.py" compare "$f" "$out_file" \
                    >>"$base/captured-reproduce.txt" 2>>"$base/reproduce.log" || rc=$?
                if [[ $rc -gt 1 ]]; then
                    echo "$(basename "$f"): NOT RUN: capture.py compare exited $rc (reproduce.log)" \
                        >>"$base/captured-reproduce.txt"
                fi
            else
                echo "$(basename "$f"): NOT RUN: relattn exec failed (reproduce.log)" \
                    >>"$base/captured-reproduce.txt"
            fi
        done
        rm -f "$base/rerun-out.safetensors"
        echo "gpu-cases.sh: the captured calls run again: $(grep -c ': REPRODUCED' "$base/captured-reproduce.txt") reproduced, $(grep -c ': DIFFERS' "$base/captured-reproduce.txt") differ, $(grep -c ': NOT RUN' "$base/captured-reproduce.txt") not run (captured-reproduce.txt)" >&2
        if grep -q ': DIFFERS\|: NOT RUN' "$base/captured-reproduce.txt"; then note 1; fi
    fi
fi

echo "gpu-cases.sh: done (exit $status); logs and reports in $base" >&2
exit "$status"
