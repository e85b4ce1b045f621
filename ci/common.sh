# Helpers sourced by the ci/ scripts; not a job of its own.

# The repository root. Scripts stay in the caller's directory, so relative report paths given
# to them mean what the caller meant; only cargo is pointed at the workspace.
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Path of the relattn binary: $RELATTN_BIN when the pipeline provides one, else a release build
# made here (build output goes to stderr so callers can capture the path).
relattn_bin() {
    if [[ -n "${RELATTN_BIN:-}" ]]; then
        echo "$RELATTN_BIN"
        return
    fi
    cargo build --release --locked --bin relattn --manifest-path "$repo_root/Cargo.toml" >&2
    echo "${CARGO_TARGET_DIR:-$repo_root/target}/release/relattn"
}

# Copies every junit.xml under DIR to DIR/junit/<tier>-<arch>.xml: one flat folder for the CI's
# test-result collectors (Buildkite test analytics, GitHub test reporters).
collect_junit() {
    local out=$1 f rel name
    mkdir -p "$out/junit"
    while IFS= read -r f; do
        rel=${f#"$out"/}
        name=${rel%/junit.xml}
        cp "$f" "$out/junit/${name//\//-}.xml"
    done < <(find "$out" -path "$out/junit" -prune -o -name junit.xml -print)
}

# Succeeds when DIR holds at least one architecture report and every summary.json under it
# says "complete": true (a finished run, or a merge of shards covering the whole shard set).
report_complete() {
    local dir=$1 f found=0
    while IFS= read -r f; do
        found=1
        grep -Eq '"complete": *true' "$f" || return 1
    done < <(find "$dir" -mindepth 1 -maxdepth 2 -name summary.json)
    [[ $found -eq 1 ]]
}

# Succeeds when the diff options in $1 make a strict diff: --strict-coverage given and
# --allow-missing not.
strict_diff_args() {
    [[ " $1 " == *" --strict-coverage "* && " $1 " != *" --allow-missing "* ]]
}

# The regression cases a sanitized run leaves out, as a --filter: the long and large ones run for
# minutes under a sanitizer (and their unsanitized comparison leaves them out too).
SANITIZED_FILTER="regression!=offset_over_2_31,paged_cache_past_2_31,bf16_accumulation,late_unsupported_arch,large_launch_unwritten_rows"

# start_logged DEFAULT_OUT: what logged_step needs: out (${OUT:-DEFAULT_OUT}) with its logs/
# and reports/ folders, bin (exit 2 when there is none), timings (timings.tsv, its header
# written once) and status 0.
start_logged() {
    out="${OUT:-$1}"
    bin=$(relattn_bin) || exit 2
    mkdir -p "$out/logs" "$out/reports"
    timings="$out/timings.tsv"
    [[ -f $timings ]] || printf 'step\tcommand\texit\twall_s\n' >"$timings"
    status=0
}

# logged_step TAIL NAME ARGS...: "$bin" ARGS with its output in $out/logs/NAME.log and a line
# (name, command, exit code, wall seconds) appended to $timings; prints the exit code, the time
# and the log's last TAIL lines; keeps the first exit code above 1 in $status (0 and 1 are a
# run's verdicts: a failing trial is a finding, not a broken check). The caller sets bin, out,
# timings and status.
logged_step() {
    local tail_lines=$1 name=$2 rc=0 start end wall
    shift 2
    start=$(date +%s.%N)
    echo "== $name: relattn $*" | tee "$out/logs/$name.log"
    "$bin" "$@" >>"$out/logs/$name.log" 2>&1 || rc=$?
    end=$(date +%s.%N)
    wall=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
    printf '%s\t%s\t%s\t%s\n' "$name" "relattn $*" "$rc" "$wall" >>"$timings"
    echo "== $name: exit $rc in ${wall}s (log: $out/logs/$name.log)"
    tail -n "$tail_lines" "$out/logs/$name.log"
    if [[ $rc -gt 1 && $status -eq 0 ]]; then
        status=$rc
    fi
}
