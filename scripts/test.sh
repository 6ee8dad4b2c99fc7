#!/usr/bin/env bash
# The whole test suite: installs what it needs, then runs every test of the
# workspace (unit, property, end to end through the binary, and the benches
# once each in test mode so they cannot rot). Every test binary runs even when
# one fails (--no-fail-fast), so one report shows everything; the exit code is
# still non-zero then. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
# Build every target first, the `podstream` binary among them, in one
# invocation: the binary then shares the test build's dependencies (same
# feature set) and the end-to-end tests run it instead of building a second
# copy of the dependency graph for it.
cargo build --workspace --all-targets
target="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)"

# The servers a test may start: whatever of these outlives the run was left behind.
servers='postgres|nats-server|podstream|airflow|gunicorn|uvicorn'
before="$(pgrep -d ' ' -f "$servers" || true)"
status=0
PODSTREAM_BIN="$target/debug/podstream" \
    cargo test --workspace --all-targets --no-fail-fast "$@" || status=$?

# A test's PostgreSQL is stopped by a watcher within a second of its process ending.
sleep 2
survivors=""
for pid in $(pgrep -f "$servers" || true); do
    case " $before " in *" $pid "*) continue ;; esac
    [ "$pid" = "$$" ] && continue
    survivors="$survivors$(ps -o pid=,args= -p "$pid" 2>/dev/null | cut -c1-160)"$'\n'
done
if [ -n "$survivors" ]; then
    echo "test.sh: servers started by the tests are still running:" >&2
    printf '%s' "$survivors" >&2
fi
exit "$status"
