#!/usr/bin/env bash
# CPU job (any machine, no GPU needed): the README's test command, then the smoke tier through
# `relattn run`, which on a machine without a GPU runs the routing checks for every architecture
# and the reference self-checks and writes a report under $RELATTN_OUT/cpu.
# Exit code: the first failing command's (1 = a trial failed, 2 = bad input).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

cd "$repo_root"
out="${RELATTN_OUT:-reports-out}"

cargo test --workspace
cargo run --release --bin relattn -- run --matrix smoke --out "$out"
