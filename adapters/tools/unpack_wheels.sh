#!/usr/bin/env bash
# GPU side of adapters/tools/pack_wheels.sh: install both bundles into one folder (default
# /tmp/relattn-site) and print the environment to use.
#
#   adapters/tools/unpack_wheels.sh BUNDLE_A BUNDLE_B [DIR]
#
# BUNDLE_A holds wheels (installed with one pip --target call), BUNDLE_B the tar.xz of
# nvidia-cutlass-dsl-libs-cu13's files (extracted into the same folder). In a call to the GPU
# machine that carries .whl-a and .whl-b:
#
#   eval "$(adapters/tools/unpack_wheels.sh .whl-a .whl-b | grep ^export)" || exit
#
# A folder holding a previous install is emptied first (pip --target does not merge).
set -euo pipefail

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
    echo "usage: $0 BUNDLE_A BUNDLE_B [DIR]" >&2
    exit 2
fi
a=$1 b=$2 dir=${3:-/tmp/relattn-site}
here=$(cd "$(dirname "$0")" && pwd)

# Start clean, but only over a folder that is empty or holds a previous install.
if [ -d "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
    if [ -d "$dir/nvidia_cutlass_dsl" ] || [ -d "$dir/flash_attn" ]; then
        rm -rf "${dir:?}"/*
    else
        echo "$0: $dir is not empty and holds no previous install: give an empty folder" >&2
        exit 2
    fi
fi
mkdir -p "$dir"
"$here/install_packages.sh" --wheels "$a" --wheels "$b" "$dir"
