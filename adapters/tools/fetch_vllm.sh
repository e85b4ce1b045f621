#!/usr/bin/env bash
# fetch_vllm.sh [DEST] [--kernels] [--version X [--sha256 H]]
#
# Puts the files of a vLLM release wheel that adapters/vllm_worker.py loads into DEST, so that
# DEST/vllm/models/inkling/nvidia/ops/fa4_rel_attention.py exists, and prints DEST on stdout;
# then
#   RELATTN_VLLM_ROOT=DEST python3 adapters/vllm_worker.py
# answers vLLM's own routing (no GPU, no torch needed).
#
#   DEST           default: relattn's cache folder ($RELATTN_CACHE_DIR, else
#                  $XDG_CACHE_HOME/relattn, else ~/.cache/relattn), then vllm-X
#                  (one folder per version, as the tests keep the pinned release)
#   default        vllm/models/inkling/ (the op and the attention layer that calls it) and
#                  vllm/_version.py: what routing needs, under 1 MB
#   --kernels      also vllm/vllm_flash_attn/cute/ and vllm/third_party/tml_fa4/ (pure CuTe DSL
#                  Python, about 4 MB): what a GPU run of the op imports
#   --version X    the release X (e.g. 0.34.0), or `latest` (the newest release on PyPI);
#                  default the pinned 0.33.0
#   --sha256 H     the wheel's expected SHA-256 (64 hex digits), with --version; without it, the
#                  pinned release's hash for 0.33.0, else the hash PyPI publishes for the wheel
#                  (`digests.sha256` of its file in https://pypi.org/pypi/vllm/json's `releases`,
#                  or in https://pypi.org/pypi/vllm/X/json)
#
# The wheel (cp38-abi3, manylinux_2_28 x86_64) is downloaded with pip (`pip download vllm==X
# --no-deps`, a few hundred MB, into a temporary folder removed afterwards) and its sha256
# checked. RELATTN_VLLM_WHEEL=<path of that wheel> uses a copy already downloaded instead (its
# sha256 is checked the same way). Idempotent: with DEST already complete for the files asked,
# it does nothing but print DEST.
# Exit 0 on success; 2 with one line on stderr for a usage error (nothing is downloaded); 1 with
# one line on stderr saying why otherwise (a failed download says "cannot download").
set -euo pipefail

PINNED_VERSION=0.33.0
PINNED_SHA256=4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa
PYTHON=${PYTHON:-python3}

die() { echo "fetch_vllm.sh: $*" >&2; exit 1; }
usage() { echo "fetch_vllm.sh: $*; usage: fetch_vllm.sh [DEST] [--kernels] [--version X [--sha256 H]]" >&2; exit 2; }

DEST=
KERNELS=0
VERSION=
SHA256=
while [ $# -gt 0 ]; do
    case $1 in
        --kernels) KERNELS=1 ;;
        --version|--sha256)
            [ $# -ge 2 ] && [ -n "$2" ] && [ "${2#--}" = "$2" ] || usage "$1 needs a value"
            if [ "$1" = --version ]; then VERSION=$2; else SHA256=$2; fi
            shift ;;
        --version=*|--sha256=*) usage "write ${1%%=*} VALUE, not ${1%%=*}=VALUE" ;;
        -*) usage "unknown option $1" ;;
        *)
            [ -z "$DEST" ] || usage "one DEST only (got $DEST and $1)"
            DEST=$1 ;;
    esac
    shift
done

# A release as PyPI names them (PEP 440 public versions: 0.34.0, 0.35.0rc1, 0.34.1.post1), or
# `latest`: nothing that could be read as a pip requirement, path or shell word.
if [ -n "$VERSION" ] && [ "$VERSION" != latest ] &&
    ! [[ $VERSION =~ ^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?$ ]]; then
    usage "--version $VERSION is not a release number such as 0.34.0 (or latest)"
fi
if [ -n "$SHA256" ]; then
    [[ $SHA256 =~ ^[0-9a-fA-F]{64}$ ]] || usage "--sha256 $SHA256 is not 64 hex digits"
    [ -n "$VERSION" ] || usage "--sha256 goes with --version (the pinned $PINNED_VERSION has its own)"
    SHA256=$(echo "$SHA256" | tr 'A-F' 'a-f')
fi

command -v "$PYTHON" >/dev/null || die "$PYTHON not found: it is needed to download and unpack the wheel"

# The JSON PyPI publishes about vllm at URL $1, given to the Python program $2 as `data`, with
# the further arguments as `args`.
pypi_json() {
    "$PYTHON" - "$@" <<'EOF'
import json, sys, urllib.request
url, program, args = sys.argv[1], sys.argv[2], sys.argv[3:]
try:
    with urllib.request.urlopen(url, timeout=60) as r:
        data = json.load(r)
except Exception as e:
    sys.exit(f"fetch_vllm.sh: cannot download {url}: {e}")
exec(program, {"data": data, "args": args})
EOF
}

if [ "$VERSION" = latest ]; then
    VERSION=$(pypi_json https://pypi.org/pypi/vllm/json 'print(data["info"]["version"])') || exit 1
    [[ $VERSION =~ ^[0-9][0-9a-z.]*$ ]] || die "PyPI names the newest vllm ${VERSION@Q}: not a version"
fi
VERSION=${VERSION:-$PINNED_VERSION}
if [ -z "$SHA256" ] && [ "$VERSION" = "$PINNED_VERSION" ]; then
    SHA256=$PINNED_SHA256
fi
# relattn's cache folder, as relattn finds it (kernels/src/gpu/compile.rs, cache_dir).
CACHE=${RELATTN_CACHE_DIR:-${XDG_CACHE_HOME:+$XDG_CACHE_HOME/relattn}}
DEST=${DEST:-${CACHE:-$HOME/.cache/relattn}/vllm-$VERSION}

MEMBERS="vllm/models/inkling/ vllm/_version.py"
MARK="$DEST/.relattn-vllm-$VERSION"
if [ "$KERNELS" = 1 ]; then
    MEMBERS="$MEMBERS vllm/vllm_flash_attn/cute/ vllm/third_party/tml_fa4/ vllm/third_party/__init__.py"
    MARK="$DEST/.relattn-vllm-$VERSION-kernels"
fi

# Complete already: the marker is written last, after every member was extracted.
if [ -f "$MARK" ] && [ -f "$DEST/vllm/models/inkling/nvidia/ops/fa4_rel_attention.py" ]; then
    echo "$DEST"
    exit 0
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

if [ -n "${RELATTN_VLLM_WHEEL:-}" ]; then
    [ -f "$RELATTN_VLLM_WHEEL" ] || die "RELATTN_VLLM_WHEEL=$RELATTN_VLLM_WHEEL does not exist"
    WHEEL_PATH=$RELATTN_VLLM_WHEEL
else
    echo "fetch_vllm.sh: downloading vllm==$VERSION (a few hundred MB) with pip" >&2
    if ! "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
            --python-version 3.12 --implementation cp -d "$TMP" "vllm==$VERSION" >"$TMP/pip.log" 2>&1; then
        die "cannot download vllm==$VERSION with pip: $(grep -m1 -i 'error' "$TMP/pip.log" || tail -n1 "$TMP/pip.log")"
    fi
    WHEELS=("$TMP"/vllm-*.whl)
    [ -f "${WHEELS[0]}" ] || die "pip downloaded no vllm wheel (found: $(ls "$TMP" | tr '\n' ' '))"
    WHEEL_PATH=${WHEELS[0]}
fi
WHEEL=$(basename "$WHEEL_PATH")

if [ -z "$SHA256" ]; then
    # The hash the index publishes for this very file.
    # The release's JSON (https://pypi.org/pypi/vllm/X/json, `urls`), or where an index serves
    # only the project's JSON, its `releases[X]`.
    SHA256=$(pypi_json https://pypi.org/pypi/vllm/json '
name, version = args
files = data.get("releases", {}).get(version) or []
if version == data["info"]["version"]:
    files = files or data.get("urls", [])
found = [f["digests"]["sha256"] for f in files if f["filename"] == name]
if not found:
    import json, urllib.request
    try:
        with urllib.request.urlopen(f"https://pypi.org/pypi/vllm/{version}/json", timeout=60) as r:
            found = [f["digests"]["sha256"] for f in json.load(r)["urls"] if f["filename"] == name]
    except Exception:
        pass
if not found:
    raise SystemExit(f"fetch_vllm.sh: PyPI publishes no sha256 for {name} (vllm {version}): give --sha256")
print(found[0])' "$WHEEL" "$VERSION") || exit 1
fi

GOT=$("$PYTHON" -c 'import hashlib,sys
h=hashlib.sha256()
with open(sys.argv[1],"rb") as f:
    for b in iter(lambda: f.read(1<<20), b""): h.update(b)
print(h.hexdigest())' "$WHEEL_PATH")
[ "$GOT" = "$SHA256" ] || die "$WHEEL_PATH has sha256 $GOT, expected $SHA256 (the vllm $VERSION wheel)"

mkdir -p "$DEST"
# Extract only the members asked for (zipfile: no unzip needed), then write the marker.
"$PYTHON" - "$WHEEL_PATH" "$DEST" $MEMBERS <<'EOF'
import os, sys, zipfile
wheel, dest, prefixes = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if any(n == p or (p.endswith("/") and n.startswith(p)) for p in prefixes)]
    for p in prefixes:
        if not any(n == p or n.startswith(p) for n in names):
            sys.exit(f"fetch_vllm.sh: the wheel has no {p}")
    for n in names:
        z.extract(n, dest)
EOF
touch "$MARK"
echo "fetch_vllm.sh: vllm $VERSION files in $DEST" >&2
echo "$DEST"
