#!/usr/bin/env bash
# fetch_vllm.sh DEST [--kernels]
#
# Puts the files of vLLM's pinned release wheel that adapters/vllm_worker.py loads into DEST,
# so that DEST/vllm/models/inkling/nvidia/ops/fa4_rel_attention.py exists; then
#   RELATTN_VLLM_ROOT=DEST python3 adapters/vllm_worker.py
# answers vLLM's own routing (no GPU, no torch needed).
#
#   default    vllm/models/inkling/ (the op and the attention layer that calls it) and
#              vllm/_version.py: what routing needs, under 1 MB
#   --kernels  also vllm/vllm_flash_attn/cute/ and vllm/third_party/tml_fa4/ (pure CuTe DSL
#              Python, about 4 MB): what a GPU run of the op imports
#
# The wheel is downloaded with pip (`pip download vllm==0.33.0 --no-deps`, about 336 MB, into a
# temporary folder removed afterwards) and its sha256 checked. RELATTN_VLLM_WHEEL=<path of that
# wheel> uses a copy already downloaded instead (its sha256 is checked the same way).
# Idempotent: with DEST already complete for the files asked, it does nothing.
# Exit 0 on success; non-zero with one line on stderr saying why otherwise.
set -euo pipefail

VERSION=0.33.0
WHEEL=vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
SHA256=4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa
PYTHON=${PYTHON:-python3}

die() { echo "fetch_vllm.sh: $*" >&2; exit 1; }

USAGE="usage: fetch_vllm.sh DEST [--kernels]"
KERNELS=0
case $# in
    1) ;;
    2) [ "$2" = "--kernels" ] || die "$USAGE"; KERNELS=1 ;;
    *) die "$USAGE" ;;
esac
DEST=$1

MEMBERS="vllm/models/inkling/ vllm/_version.py"
MARK="$DEST/.relattn-vllm-$VERSION"
if [ "$KERNELS" = 1 ]; then
    MEMBERS="$MEMBERS vllm/vllm_flash_attn/cute/ vllm/third_party/tml_fa4/ vllm/third_party/__init__.py"
    MARK="$DEST/.relattn-vllm-$VERSION-kernels"
fi

# Complete already: the marker is written last, after every member was extracted.
if [ -f "$MARK" ] && [ -f "$DEST/vllm/models/inkling/nvidia/ops/fa4_rel_attention.py" ]; then
    exit 0
fi

command -v "$PYTHON" >/dev/null || die "$PYTHON not found: it is needed to download and unpack the wheel"

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

if [ -n "${RELATTN_VLLM_WHEEL:-}" ]; then
    [ -f "$RELATTN_VLLM_WHEEL" ] || die "RELATTN_VLLM_WHEEL=$RELATTN_VLLM_WHEEL does not exist"
    WHEEL_PATH=$RELATTN_VLLM_WHEEL
else
    echo "fetch_vllm.sh: downloading vllm==$VERSION (about 336 MB) with pip" >&2
    if ! "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
            --python-version 3.12 --implementation cp -d "$TMP" "vllm==$VERSION" >"$TMP/pip.log" 2>&1; then
        die "cannot download vllm==$VERSION with pip: $(grep -m1 -i 'error' "$TMP/pip.log" || tail -n1 "$TMP/pip.log")"
    fi
    WHEEL_PATH="$TMP/$WHEEL"
    [ -f "$WHEEL_PATH" ] || die "pip downloaded no $WHEEL (found: $(ls "$TMP" | tr '\n' ' '))"
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
