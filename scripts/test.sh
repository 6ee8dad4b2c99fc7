#!/usr/bin/env bash
# The whole test suite: installs what it needs, then runs every test of the
# workspace (unit, property, end to end through the binary, and the benches
# once each in test mode so they cannot rot).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cargo test --workspace --all-targets "$@"
