#!/usr/bin/env bash
# The whole test suite: installs what it needs, then runs every test of the
# workspace (unit, property, end to end through the binary, and the benches
# once each in test mode so they cannot rot).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
# Build every target first, the `podstream` binary among them, in one
# invocation: the binary then shares the test build's dependencies (same
# feature set) and the end-to-end tests run it instead of building a second
# copy of the dependency graph for it.
cargo build --workspace --all-targets
target="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)"
PODSTREAM_BIN="$target/debug/podstream" \
    cargo test --workspace --all-targets "$@"
