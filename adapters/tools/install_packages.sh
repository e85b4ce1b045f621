#!/usr/bin/env bash
# Install the Python packages of the fa4 and flex workers (and of vLLM's Inkling op) into a
# folder, without touching the system's site-packages.
#
#   adapters/tools/install_packages.sh [--wheels WHEELDIR]... DIR
#
# The packages (issue 21; vLLM 0.33.0 pins the cutlass, quack and tvm-ffi versions):
#   flash-attn-4 4.0.0b36, nvidia-cutlass-dsl 4.8.0, nvidia-cutlass-dsl-libs-base 4.8.0,
#   nvidia-cutlass-dsl-libs-core 4.8.0, nvidia-cutlass-dsl-libs-cu13 4.8.0, quack-kernels 0.6.5,
#   apache-tvm-ffi 0.1.11, torch-c-dlpack-ext 0.1.5.
# They are installed with --no-deps: torch 2.11 (cu130), numpy, safetensors, cuda-bindings,
# einops, protobuf and typing-extensions must already be there (they are on the H200 machine).
#
# Without --wheels the packages come from PyPI. With --wheels, from the folder instead (no
# network): every *.whl in it, plus every *.tar.xz in it, which is taken to be a wheel's files
# recompressed (adapters/tools/pack_wheels.sh makes one of nvidia-cutlass-dsl-libs-cu13, the wheel
# too large for one 64 MiB call) and is extracted into DIR. --wheels may be given more than once.
#
# pip's --target refuses to merge into a folder that a previous --target install filled
# ("... already exists"), and the cutlass wheels all fill nvidia_cutlass_dsl/. So pip runs only
# when DIR holds no package yet, and once, for every wheel at hand; wheels installed into a DIR
# that already holds packages are unzipped into it instead (a wheel is a zip of the files that
# belong in site-packages).
#
# pip --target also skips nvidia-cutlass-dsl's .pth file, which adds
# DIR/nvidia_cutlass_dsl/dsl_packages (where the `cutlass` package lives) to sys.path: that
# folder goes on PYTHONPATH instead. The script ends by printing the two lines to use:
#
#   export PYTHONPATH=DIR:DIR/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
#   export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
#
# The second keeps compiled CuTe DSL kernels on disk: each new kernel variant compiles for 5 to
# 30 s on first use (the workers set it themselves if it is unset).
#
# PYTHON=/path/to/python3.12 picks another interpreter than python3 (the wheels that
# fetch_wheels.sh downloads are for CPython 3.12).
#
# Examples:
#   adapters/tools/install_packages.sh /tmp/relattn-site                    # from PyPI
#   adapters/tools/fetch_wheels.sh .whl &&
#       adapters/tools/install_packages.sh --wheels .whl /tmp/relattn-site  # from wheels
#   adapters/tools/unpack_wheels.sh .whl-a .whl-b                           # the split bundles
set -euo pipefail

# The Python that will import the packages (its version picks the wheels).
python=${PYTHON:-python3}

PACKAGES="flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.0 nvidia-cutlass-dsl-libs-base==4.8.0
nvidia-cutlass-dsl-libs-core==4.8.0 nvidia-cutlass-dsl-libs-cu13==4.8.0 quack-kernels==0.6.5
apache-tvm-ffi==0.1.11 torch-c-dlpack-ext==0.1.5"

usage() {
    echo "usage: $0 [--wheels WHEELDIR]... DIR" >&2
    exit 2
}

wheel_dirs=()
dir=""
while [ $# -gt 0 ]; do
    case $1 in
        --wheels)
            [ $# -ge 2 ] || usage
            [ -d "$2" ] || { echo "$0: --wheels $2: no such folder" >&2; exit 2; }
            wheel_dirs+=("$2")
            shift 2
            ;;
        -h|--help) usage ;;
        -*) echo "$0: unknown option $1" >&2; usage ;;
        *)
            [ -z "$dir" ] || usage
            dir=$1
            shift
            ;;
    esac
done
[ -n "$dir" ] || usage
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

pip_target() {
    # One pip call for everything: a second one into the same DIR would not merge.
    "$python" -m pip install -q --no-deps --no-compile --no-cache-dir --target "$dir" "$@"
}

dir_is_empty() {
    [ -z "$(ls -A "$dir")" ]
}

if [ ${#wheel_dirs[@]} -eq 0 ]; then
    if dir_is_empty; then
        # shellcheck disable=SC2086  # PACKAGES is a list of words
        pip_target $PACKAGES
    else
        # Download, then unzip into the filled DIR.
        tmp=$(mktemp -d)
        trap 'rm -rf "$tmp"' EXIT
        # shellcheck disable=SC2086
        "$python" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" $PACKAGES
        for w in "$tmp"/*.whl; do "$python" -m zipfile -e "$w" "$dir"; done
    fi
else
    shopt -s nullglob
    wheels=() trees=()
    for wd in "${wheel_dirs[@]}"; do
        wheels+=("$wd"/*.whl)
        trees+=("$wd"/*.tar.xz)
    done
    if [ ${#wheels[@]} -eq 0 ] && [ ${#trees[@]} -eq 0 ]; then
        echo "$0: no *.whl or *.tar.xz in ${wheel_dirs[*]}" >&2
        exit 2
    fi
    if [ ${#wheels[@]} -gt 0 ]; then
        if dir_is_empty; then
            pip_target --no-index "${wheels[@]}"
        else
            for w in "${wheels[@]}"; do "$python" -m zipfile -e "$w" "$dir"; done
        fi
    fi
    for t in "${trees[@]}"; do
        # The tar holds a wheel's files at its top level, as unzipping the wheel would give.
        "$python" - "$t" "$dir" <<'EOF'
import sys, tarfile
with tarfile.open(sys.argv[1]) as tar:
    if hasattr(tarfile, "data_filter"):
        tar.extractall(sys.argv[2], filter="data")
    else:
        tar.extractall(sys.argv[2])
EOF
    done
fi

# Say what is still missing (after one bundle of two, say): each package's distribution info.
missing=""
for dist in flash_attn_4-4.0.0b36 nvidia_cutlass_dsl-4.8.0 nvidia_cutlass_dsl_libs_base-4.8.0 \
        nvidia_cutlass_dsl_libs_core-4.8.0 nvidia_cutlass_dsl_libs_cu13-4.8.0 \
        quack_kernels-0.6.5 apache_tvm_ffi-0.1.11 torch_c_dlpack_ext-0.1.5; do
    [ -d "$dir/$dist.dist-info" ] || missing="$missing $dist"
done
if [ -n "$missing" ]; then
    echo "note: $dir does not hold yet:$missing (install the other bundle too)" >&2
fi

echo "installed into $dir; to use it:"
echo "export PYTHONPATH=$dir:$dir/nvidia_cutlass_dsl/dsl_packages\${PYTHONPATH:+:\$PYTHONPATH}"
echo "export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1"
