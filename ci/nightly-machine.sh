#!/usr/bin/env bash
# The whole nightly tier on this one machine's GPU: N shards (default 40), J of them side by side
# (default: from the cores and the memory, see below), then merged into one report.
#   ci/nightly-machine.sh [N [J]] [extra relattn run arguments]
# Each shard is `ci/nightly.sh K N` with `--processes J` (its share of the cores and of the
# memory for cases prepared ahead) and `--no-compile-checks` (the other architectures' compile
# check is the ci job's, ci/gpu.sh, on every commit: J shards repeating it would compile every
# program J times); their kernel launches take turns on the GPU, so shards side by side do not
# distort each other's times. Shard reports land in
# $RELATTN_OUT/nightly-shard-K-of-N/ (as ci/nightly.sh writes them), their logs in
# $RELATTN_OUT/nightly-logs/, the merge in $RELATTN_OUT/nightly-merged/.
# Exit code: 3 without a usable GPU; else the first non-zero shard exit, else the merge's.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

n=${1:-40}
cores=$(nproc)
mem_gib=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 / 1024 ))
# A shard holds at most two cases and one upload at once; the nightly's largest (1M keys, 8 KV
# heads: an 8 GiB f32 cache, 4 GiB encoded) makes that 20 GiB per shard; 2 cores keep a shard
# busy.
auto=$(( mem_gib / 20 < cores / 2 ? mem_gib / 20 : cores / 2 ))
j=${2:-$(( auto > 0 ? auto : 1 ))}
if ! [[ $n =~ ^[0-9]+$ && $j =~ ^[0-9]+$ ]] || (( n < 1 || j < 1 )); then
    echo "usage: ci/nightly-machine.sh [N [J]] [relattn run arguments]   (N, J >= 1)" >&2
    exit 2
fi
shift $(( $# < 2 ? $# : 2 ))

out="${RELATTN_OUT:-reports-out}"
bin=$(relattn_bin)
export RELATTN_BIN=$bin RELATTN_OUT=$out
logs="$out/nightly-logs"
mkdir -p "$logs"

started=$(date +%s)
# Compile this GPU's programs once into the shared cache before the shards start (exit 3
# without a GPU: nothing else would run).
"$bin" compile-check --arch native > "$logs/compile.log"
echo "ci/nightly-machine.sh: $n shards, $j at a time ($cores cores, $mem_gib GiB)"
rm -f "$logs"/rc-*
seq 1 "$n" | xargs -P "$j" -I{} bash -c '
    rc=0
    "$0"/nightly.sh {} '"$n"' --processes '"$j"' --no-compile-checks "${@}" > "'"$logs"'/shard-{}.log" 2>&1 || rc=$?
    echo "$rc" > "'"$logs"'/rc-{}"
    echo "shard {}/'"$n"': exit $rc ($(tail -n 1 "'"$logs"'/shard-{}.log"))"
' "$(dirname "${BASH_SOURCE[0]}")" "$@"
status=0
for k in $(seq 1 "$n"); do
    rc=$(cat "$logs/rc-$k" 2>/dev/null || echo 2)
    if [[ $status -eq 0 && $rc -ne 0 ]]; then
        status=$rc
    fi
done
# Shards that wrote no report are left out: the merge then says the tier is not covered and
# the merged report is INCOMPLETE.
shards=()
for k in $(seq 1 "$n"); do
    [[ -d "$out/nightly-shard-$k-of-$n" ]] && shards+=("$out/nightly-shard-$k-of-$n")
done
if [[ ${#shards[@]} -eq 0 ]]; then
    echo "ci/nightly-machine.sh: no shard wrote a report (logs in $logs)" >&2
    exit "$(( status != 0 ? status : 1 ))"
fi
rc=0
"$bin" report merge "${shards[@]}" --out "$out/nightly-merged" || rc=$?
collect_junit "$out/nightly-merged"
"$bin" report show "$out/nightly-merged" | head -n 20 || true
echo "ci/nightly-machine.sh: $n shards in $(( $(date +%s) - started )) s; shards exit $status, merge exit $rc"
if [[ $status -eq 0 ]]; then
    status=$rc
fi
exit "$status"
