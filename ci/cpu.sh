#!/usr/bin/env bash
# CPU job (any machine, no GPU needed): the workspace's tests, then the smoke tier through
# `relattn run`, which on a machine without a GPU runs the routing checks for every architecture
# and the reference self-checks and writes a report under $RELATTN_OUT/cpu, then the self-checks
# of the ci tier (report under $RELATTN_OUT/self-checks-ci).
# The tests run under cargo-nextest when it is installed (profile `ci` of .config/nextest.toml:
# every failure, skipped trials listed, JUnit copied to $RELATTN_OUT/junit/cargo-test.xml), else
# under `cargo test --release --workspace`, the README's test command.
# Exit code: the first failing command's (1 = a trial failed, 2 = bad input).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

cd "$repo_root"
out="${RELATTN_OUT:-reports-out}"

if cargo nextest --version >/dev/null 2>&1; then
    status=0
    cargo nextest run --release --workspace --profile ci || status=$?
    # nextest writes its store under the workspace's target/, whatever CARGO_TARGET_DIR says.
    junit="$repo_root/target/nextest/ci/junit.xml"
    if [[ -f "$junit" ]]; then
        mkdir -p "$out/junit"
        cp "$junit" "$out/junit/cargo-test.xml"
    fi
    [[ $status -eq 0 ]] || exit "$status"
else
    cargo test --release --workspace
fi
cargo run --release --bin relattn -- run --matrix smoke --out "$out"
# The reference self-checks of the ci tier (about 40 s on 2 cores): runs on a GPU leave them to
# this job. --paths none and --self-checks keep them CPU work on a machine with a GPU too.
# (regressions does not fit a CPU runner: its offset case takes 12 GiB.)
cargo run --release --bin relattn -- run --matrix ci --paths none --self-checks \
    --out "$out/self-checks-ci"
