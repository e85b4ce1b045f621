#!/usr/bin/env bash
# Split the workers' wheels (from adapters/tools/fetch_wheels.sh) into bundles that each fit one
# call to a GPU machine that accepts at most 64 MiB per call.
#
#   adapters/tools/pack_wheels.sh WHEELDIR BUNDLE_A BUNDLE_B
#
# BUNDLE_A gets every wheel but nvidia-cutlass-dsl-libs-cu13 (about 9 MB together).
# BUNDLE_B gets that one wheel (about 92 MB, over the limit on its own) unzipped and recompressed
# as nvidia_cutlass_dsl_libs_cu13-<version>.tar.xz: its files are the wheel's files, so extracting
# it into a --target folder is the same as unzipping the wheel. The wheel is almost all x86-64
# shared libraries (237 MB unpacked), so xz runs at -9e with its x86 branch filter and a 256 MiB
# dictionary: about 52 MB (plain `xz -9e` gives about 62 MB). Compressing takes about 6 minutes
# and 3 GB of memory; unpacking (Python's lzma, no xz binary needed) 5 s and 256 MiB.
#
# Both bundles together (about 61.5 MB) fit one 64 MiB call with relattn's working tree (a few
# MB). In relattn's checkout: adapters/tools/pack_wheels.sh .whl .whl-a .whl-b (the three
# folders are ignored through .git/info/exclude), then carry .whl-a and .whl-b and run
# adapters/tools/unpack_wheels.sh .whl-a .whl-b on the GPU machine.
set -euo pipefail

if [ $# -ne 3 ]; then
    echo "usage: $0 WHEELDIR BUNDLE_A BUNDLE_B" >&2
    exit 2
fi
wheels=$1 bundle_a=$2 bundle_b=$3
big_pattern='nvidia_cutlass_dsl_libs_cu13-*.whl'

shopt -s nullglob
big=("$wheels"/$big_pattern)
if [ ${#big[@]} -ne 1 ]; then
    echo "$0: expected one $big_pattern in $wheels, found ${#big[@]}" >&2
    exit 2
fi
mkdir -p "$bundle_a" "$bundle_b"
rm -f "$bundle_a"/*.whl "$bundle_b"/*.tar.xz

# Bundle A: the small wheels as they are.
for w in "$wheels"/*.whl; do
    [ "$w" = "${big[0]}" ] || cp "$w" "$bundle_a"/
done

# Bundle B: the big wheel's files as a tar.xz (zip compresses each file alone and weakly; xz
# over the whole tree, with the x86 filter for machine code, brings it well under the limit).
name=$(basename "${big[0]}")
stem=${name%%-cp*}            # nvidia_cutlass_dsl_libs_cu13-4.8.0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m zipfile -e "${big[0]}" "$tmp/tree"
tar -C "$tmp/tree" -cf - . | xz --x86 --lzma2=preset=9e,dict=256MiB > "$bundle_b/$stem.tar.xz"

limit=$((64 * 1024 * 1024))
echo "bundles:"
for f in "$bundle_a"/* "$bundle_b"/*; do
    size=$(stat -c %s "$f")
    echo "  $size  $f"
done
for dir in "$bundle_a" "$bundle_b"; do
    total=$(cat "$dir"/* | wc -c)
    note=""
    [ "$total" -le "$limit" ] || note="  OVER the 64 MiB of one call"
    echo "total $dir: $total bytes$note"
done
