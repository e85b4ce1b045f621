#!/usr/bin/env bash
# Speed of runs through the workers (and of the native main job), cold and warm, on one GPU
# machine: each measured run from an empty relattn cache folder (cold: no NVRTC CUBINs, no
# CuTe DSL, FA4, Triton or Inductor cache), then again on the cache it left (warm).
#
#   ci/gpu-workers-speed.sh [MEASURE[:cold|:warm] ...]     (no MEASURE: every one, in this order)
#
# MEASURE:cold runs only the cold half of a cold-and-warm measure; MEASURE:warm only the warm
# half, on the cache an earlier cold run of it left under $CACHE_ROOT (a time-limited machine
# can split the two across calls).
#
#   native        run --matrix ci                                  (the main job)
#   vllm-reg      run --matrix regressions --paths none --impl vllm
#   vllm-reg-one  the same with one process, on vllm-reg's warm cache (run after vllm-reg)
#   triton-ci     run --matrix ci --paths none --impl triton
#   vllm-ci       run --matrix ci --paths none --impl vllm
#   both-ci       run --matrix ci --paths none --impl vllm,triton
#   same-verdicts the regressions tier through the workers ($VERDICT_IMPLS, default vllm,triton)
#                 with one process and with the default pool (warm), diffed both ways with
#                 `report diff` and compared row by row (status and message): the pool must not
#                 change a verdict
#   side-by-side  8 runs of the regressions tier through the workers at once ($SIDE_IMPLS,
#                 default vllm,triton), each with --processes 8: every one must finish with a
#                 complete report
#
# Needs: a relattn binary ($RELATTN_BIN, else a release build here); RELATTN_VLLM_ROOT = an
# unpacked vLLM wheel with its kernels (adapters/tools/fetch_vllm.sh DEST --kernels); torch and
# Triton; the CuTe DSL packages on PYTHONPATH (adapters/tools/unpack_wheels.sh) for vllm.
# $WORKER_PROCESSES (default: relattn's own default) sets --worker-processes of the measured
# runs; $XFAIL (a known-bug file, e.g. adapters/known/vllm-0.34.0.toml) is given as --xfail to
# the runs through the workers; $CACHE_ROOT (default $OUT/cache) holds the cache folders.
#
# Writes under ${OUT:-gpu-workers-speed-out}: logs/NAME-{cold,warm}.log, speed.tsv (measure,
# cache, trials, wall s, trials/s, kernels compiled, compile s, counts) and speed.md (the same
# as a table, as docs/bench.md shows it). Exit 0 when every run exited 0 or 1 (a failing trial
# is a finding) and the verdict and side-by-side checks held; else 1, or the first other code.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

out="${OUT:-gpu-workers-speed-out}"
bin=$(relattn_bin) || exit 2
cache_root="${CACHE_ROOT:-$out/cache}"
mkdir -p "$out/logs" "$out/reports" "$cache_root"
tsv="$out/speed.tsv"
[[ -f $tsv ]] || printf 'measure\tcache\ttrials\twall_s\ttrials_per_s\tkernels\tcompile_s\tcounts\n' >"$tsv"
pool=()
[[ -n "${WORKER_PROCESSES:-}" ]] && pool=(--worker-processes "$WORKER_PROCESSES")
xfail=()
[[ -n "${XFAIL:-}" ]] && xfail=(--xfail "$XFAIL")
status=0

# measured NAME CACHE ARGS...: one run with RELATTN_CACHE_DIR=$cache_root/NAME, its figures in
# speed.tsv (from the run's last two lines: the timing line and the counts line).
measured() {
    local name=$1 cache=$2 rc=0 log
    shift 2
    log="$out/logs/$name-$cache.log"
    echo "== $name ($cache): relattn $*" | tee "$log"
    RELATTN_CACHE_DIR="$cache_root/${CACHE_NAME:-$name}" "$bin" "$@" "${pool[@]}" \
        --out "$out/reports/$name-$cache" >>"$log" 2>&1 || rc=$?
    python3 - "$log" "$name" "$cache" "$rc" >>"$tsv" <<'PY'
import re, sys
log, name, cache, rc = sys.argv[1:]
text = open(log, errors="replace").read()
timing = re.search(r"time: wall ([\d.]+) s;.*workers compiled (\d+) kernels in ([\d.]+) s", text)
counts = re.search(r"relattn run: (.*) in [\d.]+ s; report in", text)
wall, kernels, compile_s = timing.groups() if timing else ("nan", "-", "-")
trials = sum(int(n) for n in re.findall(r"(\d+) \w+", counts.group(1))) if counts else 0
rate = f"{trials / float(wall):.1f}" if timing and float(wall) > 0 else "-"
summary = counts.group(1) if counts else f"exit {rc}, no final line"
print("\t".join([name, cache, str(trials), wall, rate, kernels, compile_s, summary]))
PY
    echo "== $name ($cache): exit $rc"; tail -n 2 "$log"
    if [[ $rc -gt 1 && $status -eq 0 ]]; then status=$rc; fi
}

cold_and_warm() {
    local name=$1
    shift
    if [[ -n ${WARM_ONLY:-} && ! -d $cache_root/$name ]]; then
        echo "$name:warm needs the cache of an earlier cold run of $name in $cache_root" >&2
        exit 2
    fi
    if [[ -z ${WARM_ONLY:-} ]]; then
        rm -rf "${cache_root:?}/$name"
        measured "$name" cold "$@"
    fi
    [[ -n ${COLD_ONLY:-} ]] || measured "$name" warm "$@"
}

# same_verdicts A B: the two reports' rows agree trial by trial (status and message).
same_verdicts() {
    "$bin" report diff "$1" "$2" >"$out/logs/diff-ab.log" 2>&1 || status=1
    "$bin" report diff "$2" "$1" >"$out/logs/diff-ba.log" 2>&1 || status=1
    python3 - "$1" "$2" <<'PY' || status=1
import glob, json, os, re, sys
def rows(folder):
    got = {}
    for path in glob.glob(os.path.join(folder, "*", "results.jsonl")):
        for line in open(path):
            r = json.loads(line)
            # Kept files are named after the report's folder.
            got[r["trial"]] = (r["status"], re.sub(re.escape(folder), "REPORT", r.get("message") or ""))
    return got
a, b = rows(sys.argv[1]), rows(sys.argv[2])
differ = [t for t in a.keys() | b.keys() if a.get(t) != b.get(t)]
print(f"same-verdicts: {len(a)} and {len(b)} trials, {len(differ)} differ: {sorted(differ)[:5]}")
sys.exit(1 if differ or not a else 0)
PY
}

run_measure() {
    case $1 in
        native) cold_and_warm native run --matrix ci --require-gpu ;;
        vllm-reg) cold_and_warm vllm-reg run --matrix regressions --paths none --impl vllm --require-gpu "${xfail[@]}" ;;
        vllm-reg-one)
            CACHE_NAME=vllm-reg measured vllm-reg-one warm run --matrix regressions --paths none \
                --impl vllm --require-gpu "${xfail[@]}" --worker-processes 1 ;;
        triton-ci) cold_and_warm triton-ci run --matrix ci --paths none --impl triton --require-gpu "${xfail[@]}" ;;
        vllm-ci) cold_and_warm vllm-ci run --matrix ci --paths none --impl vllm --require-gpu "${xfail[@]}" ;;
        both-ci) cold_and_warm both-ci run --matrix ci --paths none --impl vllm,triton --require-gpu "${xfail[@]}" ;;
        same-verdicts)
            local args=(run --matrix regressions --paths none --impl "${VERDICT_IMPLS:-vllm,triton}"
                --require-gpu "${xfail[@]}")
            RELATTN_CACHE_DIR="$cache_root/both-ci" "$bin" "${args[@]}" --worker-processes 1 \
                --out "$out/reports/one" >"$out/logs/same-one.log" 2>&1
            RELATTN_CACHE_DIR="$cache_root/both-ci" "$bin" "${args[@]}" \
                --out "$out/reports/pool" >"$out/logs/same-pool.log" 2>&1
            tail -n 1 "$out/logs/same-one.log" "$out/logs/same-pool.log"
            same_verdicts "$out/reports/one" "$out/reports/pool" ;;
        side-by-side)
            local i pids=() ok=0
            for i in 1 2 3 4 5 6 7 8; do
                RELATTN_CACHE_DIR="$cache_root/both-ci" "$bin" run --matrix regressions \
                    --paths none --impl "${SIDE_IMPLS:-vllm,triton}" --processes 8 --require-gpu "${xfail[@]}" \
                    --out "$out/reports/side-$i" >"$out/logs/side-$i.log" 2>&1 &
                pids+=($!)
            done
            for i in "${!pids[@]}"; do
                wait "${pids[$i]}"
                echo "side-by-side $((i + 1)): exit $?"
                report_complete "$out/reports/side-$((i + 1))" && ok=$((ok + 1))
            done
            echo "side-by-side: $ok of 8 runs finished with a complete report"
            [[ $ok -eq 8 ]] || status=1 ;;
        *) echo "unknown measure $1" >&2; exit 2 ;;
    esac
}

measures=("$@")
[[ ${#measures[@]} -gt 0 ]] || measures=(native vllm-reg triton-ci vllm-ci both-ci same-verdicts side-by-side)
for m in "${measures[@]}"; do
    case $m in
        vllm-reg-one:* | same-verdicts:* | side-by-side:*)
            echo "$m: ${m%%:*} has no cold and warm halves" >&2
            exit 2 ;;
    esac
    if [[ $m == *:warm ]]; then
        WARM_ONLY=1 run_measure "${m%:warm}"
    elif [[ $m == *:cold ]]; then
        COLD_ONLY=1 run_measure "${m%:cold}"
    else
        run_measure "$m"
    fi
done
python3 - "$tsv" >"$out/speed.md" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
print("| run | cache | trials | wall s | trials/s | kernels compiled | compile s |")
print("|---|---|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r['measure']} | {r['cache']} | {r['trials']} | {r['wall_s']} | {r['trials_per_s']} | {r['kernels']} | {r['compile_s']} |")
PY
cat "$out/speed.md"
exit $status
