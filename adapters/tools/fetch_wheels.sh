#!/usr/bin/env bash
# Download the wheels the fa4 and flex workers need on the GPU machine (CPython 3.12,
# manylinux x86_64) into WHEELDIR, for carrying to a machine without network access.
#
#   adapters/tools/fetch_wheels.sh WHEELDIR
#
# These are the packages of issue 21 that the GPU machine lacks (torch 2.11, numpy, safetensors,
# cuda-bindings and einops are installed there). vLLM 0.33.0 pins these cutlass, quack and
# tvm-ffi versions. Each is fetched with --no-deps: the set below is complete.
# Then install them with `adapters/tools/install_packages.sh --wheels WHEELDIR DIR`, or, when a
# call to the GPU machine carries at most 64 MiB, split them with adapters/tools/pack_wheels.sh.
set -euo pipefail

if [ $# -ne 1 ] || [ "${1#-}" != "$1" ]; then
    echo "usage: $0 WHEELDIR" >&2
    exit 2
fi
dest=$1
mkdir -p "$dest"

# name==version, one per line (the order is the install order of install_packages.sh).
PACKAGES="
flash-attn-4==4.0.0b36
nvidia-cutlass-dsl==4.8.0
nvidia-cutlass-dsl-libs-base==4.8.0
nvidia-cutlass-dsl-libs-core==4.8.0
nvidia-cutlass-dsl-libs-cu13==4.8.0
quack-kernels==0.6.5
apache-tvm-ffi==0.1.11
torch-c-dlpack-ext==0.1.5
"

# pip matches manylinux_2_N tags exactly: the usual ones first, then the other N if a
# package has none of them.
common_platforms="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
extra_platforms=""
for n in 24 31 34 35 36 37 38 39; do
    extra_platforms="$extra_platforms --platform manylinux_2_${n}_x86_64"
done

for spec in $PACKAGES; do
    # shellcheck disable=SC2086  # the platform lists are meant to split into words
    if ! python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp $common_platforms -d "$dest" "$spec"; then
        echo "retrying $spec with manylinux_2_24..2_39 tags" >&2
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp $common_platforms $extra_platforms -d "$dest" "$spec"
    fi
done

echo "wheels in $dest:"
ls -l "$dest"/*.whl
