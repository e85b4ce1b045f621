#!/usr/bin/env bash
# Nightly job (one GPU runner): what changed in vLLM's Inkling op between the pinned release
# (0.33.0) and the newest one on PyPI. Extra arguments go to both `relattn run`s.
#
# For each of the two releases, fetched with adapters/tools/fetch_vllm.sh --kernels (sha256 checked:
# the pinned hash, or the one PyPI publishes) into relattn's cache folder:
#   1. relattn route --check --impl vllm   -> $OUT/vllm-X/route-check.txt and .json
#   2. relattn run --matrix regressions --impl vllm --paths none -> $OUT/vllm-X/<arch>/
# then relattn report diff $OUT/vllm-PINNED $OUT/vllm-NEWEST -> $OUT/diff.txt and diff.json,
# and the route checks side by side -> $OUT/route-check-diff.txt.
#
# $OUT is ${RELATTN_OUT:-reports-out}/nightly-vllm. RELATTN_VLLM_VERSION names the release to
# compare instead of the newest (e.g. a release candidate); RELATTN_VLLM_SHA256 its wheel's
# sha256 when PyPI publishes none. The GPU packages of the workers (docs/workers.md) must be
# importable (PYTHONPATH). When the newest release is the pinned one, only the pinned one runs.
#
# Exit: the diff's (0: the newest release fails nothing the pinned one passes, and covers as
# much; 1: a regression), or the first failing step's when a step could not run (2: bad input,
# 3: no usable GPU). The route checks' and the runs' own verdicts (vLLM's known failures, exit
# 1) are recorded, not the job's exit code: the diff says what changed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

fetch="$repo_root/adapters/tools/fetch_vllm.sh"
out="${RELATTN_OUT:-reports-out}/nightly-vllm"
python=${PYTHON:-python3}

pinned=0.33.0
newest=${RELATTN_VLLM_VERSION:-}
if [[ -z "$newest" ]]; then
    newest=$("$python" - <<'EOF'
import json, sys, urllib.request
try:
    with urllib.request.urlopen("https://pypi.org/pypi/vllm/json", timeout=60) as r:
        print(json.load(r)["info"]["version"])
except Exception as e:
    sys.exit(f"nightly-vllm.sh: cannot read the newest vllm from https://pypi.org/pypi/vllm/json: {e}")
EOF
    )
fi
if ! [[ $newest =~ ^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?$ ]]; then
    echo "nightly-vllm.sh: RELATTN_VLLM_VERSION=$newest is not a release number such as 0.34.0" >&2
    exit 2
fi
bin=$(relattn_bin)
mkdir -p "$out"
echo "nightly-vllm.sh: pinned vllm $pinned, newest $newest; reports in $out" >&2

# Fetch, check the routing and run the regressions tier for release $1; prints nothing.
check_release() {
    local version=$1 root dir rc extra=()
    shift
    if [[ $version != "$pinned" && -n "${RELATTN_VLLM_SHA256:-}" ]]; then
        extra=(--sha256 "$RELATTN_VLLM_SHA256")
    fi
    root=$(bash "$fetch" --kernels --version "$version" "${extra[@]}") || {
        echo "nightly-vllm.sh: vllm $version could not be fetched (above)" >&2
        return 2
    }
    dir="$out/vllm-$version"
    mkdir -p "$dir"
    rc=0
    RELATTN_VLLM_ROOT=$root "$bin" route --check --impl vllm >"$dir/route-check.txt" || rc=$?
    echo "relattn route --check --impl vllm (vllm $version): exit $rc" >&2
    [[ $rc -le 1 ]] || return "$rc"
    RELATTN_VLLM_ROOT=$root "$bin" route --check --impl vllm --json >"$dir/route-check.json" || true
    rc=0
    # The release's known bugs (adapters/known/): green for them, red for anything new.
    local known="$repo_root/adapters/known/vllm-$version.toml" xfail=()
    [[ -f $known ]] && xfail=(--xfail "$known")
    RELATTN_VLLM_ROOT=$root "$bin" run --matrix regressions --impl vllm --paths none \
        --out "$dir" "${xfail[@]}" "$@" || rc=$?
    echo "relattn run --matrix regressions --impl vllm (vllm $version): exit $rc" >&2
    [[ $rc -le 1 ]] || return "$rc"
}

check_release "$pinned" "$@"
if [[ "$newest" == "$pinned" ]]; then
    echo "nightly-vllm.sh: the newest release is the pinned one ($pinned): nothing to compare" >&2
    exit 0
fi
check_release "$newest" "$@"

# The routing of the two side by side: shapes agreeing per capability, and the classes.
"$python" - "$out/vllm-$pinned/route-check.json" "$out/vllm-$newest/route-check.json" \
    "$pinned" "$newest" >"$out/route-check-diff.txt" <<'EOF'
import json, sys
old, new = (json.load(open(p)) for p in sys.argv[1:3])
names = sys.argv[3:5]
by_cc = lambda v: {c["cc"]: c for c in v["capabilities"]}
a, b = by_cc(old), by_cc(new)
print(f"{'SM':6} {'agree ' + names[0]:>16} {'agree ' + names[1]:>16}  classes that changed")
for cc in sorted(set(a) | set(b), key=lambda s: tuple(int(x) for x in s.split("."))):
    x, y = a.get(cc, {}), b.get(cc, {})
    changed = {k for k in set(x.get("classes", {})) | set(y.get("classes", {}))
               if x.get("classes", {}).get(k) != y.get("classes", {}).get(k)}
    print(f"{cc:6} {x.get('agree', '-'):>16} {y.get('agree', '-'):>16}  {', '.join(sorted(changed)) or '-'}")
EOF
cat "$out/route-check-diff.txt"

rc=0
"$bin" report diff "$out/vllm-$pinned" "$out/vllm-$newest" >"$out/diff.txt" || rc=$?
"$bin" report diff "$out/vllm-$pinned" "$out/vllm-$newest" --json >"$out/diff.json" || true
cat "$out/diff.txt"
echo "relattn report diff (vllm $pinned -> $newest): exit $rc" >&2
exit "$rc"
