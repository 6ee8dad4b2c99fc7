#!/usr/bin/env bash
# The whole test suite: installs what it needs, then runs every test of the
# workspace (unit, property, end to end through the binary, and the benches
# once each in test mode so they cannot rot). Every test binary runs even when
# one fails (--no-fail-fast), so one report shows everything; the exit code is
# still non-zero then. Extra arguments go to `cargo test`.
#
# The end-to-end suites are one binary per tier, by what they need (docs/testing.md):
# `offline`, `simulated` (the simulator, nats-server, PostgreSQL), `sink`, `apiserver`
# (kube-apiserver), `airflow` (Airflow's own code, its schedulers among it) and `release`
# (deploy/, the install page, the production build). At the end the script prints how long
# each test binary ran, and each tier.
#
# --fast (first argument) runs the quick tier instead: every crate's own tests, the harness's,
# the `offline` and `simulated` tiers, and the doctests. The whole suite stays what CI runs.
#
# PODSTREAM_TEST_BUSY_CORES=N keeps N cores busy with a spinning shell for the whole run: the
# real-Airflow stories must pass on a loaded machine too, not by timing (their waits are sized
# for a loaded 2-core machine; CI runs without it).
set -euo pipefail
cd "$(dirname "$0")/.."

# The tiers `--fast` runs beside every crate's own tests.
FAST_TIERS=(offline simulated)
fast=0
if [ "${1:-}" = "--fast" ]; then
    fast=1
    shift
fi

busy_cores="${PODSTREAM_TEST_BUSY_CORES:-0}"
case "$busy_cores" in
    '' | *[!0-9]*) echo "test.sh: PODSTREAM_TEST_BUSY_CORES must be a number, not '$busy_cores'" >&2; exit 2 ;;
esac
hogs=()
stop_hogs() { ((${#hogs[@]})) && kill "${hogs[@]}" 2>/dev/null; true; }
trap stop_hogs EXIT
for _ in $(seq 1 "$busy_cores"); do
    sh -c 'while :; do :; done' &
    hogs+=("$!")
done
((busy_cores)) && echo "test.sh: $busy_cores core(s) kept busy for the run"

scripts/setup.sh
target_dir="${CARGO_TARGET_DIR:-target}"
# The production binary first (deploy/Dockerfile's features: no demo, no simulator, no stage),
# kept beside the other; the full build below then puts the workspace's own binary back. The
# quick tier leaves it out: building it recompiles the shared dependencies twice.
if ! ((fast)); then
    cargo build -p podstream-cli --no-default-features
    cp "$target_dir/debug/podstream" "$target_dir/debug/podstream-production"
fi
# Build every target first, the `podstream` binary among them, in one
# invocation: the binary then shares the test build's dependencies (same
# feature set) and the end-to-end tests run it instead of building a second
# copy of the dependency graph for it.
cargo build --workspace --all-targets
target="$(cd "$target_dir" && pwd)"

# The servers a test may start: whatever of these outlives the run was left behind.
servers='postgres|nats-server|podstream|airflow|gunicorn|uvicorn|etcd|kube-apiserver'
before="$(pgrep -d ' ' -f "$servers" || true)"
status=0
export PODSTREAM_BIN="$target/debug/podstream" PODSTREAM_PRODUCTION_BIN="$target/debug/podstream-production"
# Each line of cargo's output passes through; each test binary's wall time is noted from its
# `Running` line to the next one's (or the end).
timings="$(mktemp)"
now_ms() { echo $(( ${EPOCHREALTIME/./} / 1000 )); }
timed() {
    local line name="" start
    while IFS= read -r line; do
        printf '%s\n' "$line"
        if [[ "$line" =~ ^[[:space:]]+(Running|Doc-tests)[[:space:]](.*)$ ]]; then
            [ -n "$name" ] && echo "$name $(( $(now_ms) - start ))" >>"$timings"
            name="${BASH_REMATCH[2]}"
            [ "${BASH_REMATCH[1]}" = Doc-tests ] && name="doctests_$name"
            # `tests/simulated/main.rs (target/debug/deps/simulated-0a1b)` → `simulated`
            [[ "$name" =~ \(.*/deps/([A-Za-z0-9_]+)-[0-9a-f]+\)$ ]] && name="${BASH_REMATCH[1]}"
            name="${name// /_}"
            start=$(now_ms)
        fi
    done
    [ -n "$name" ] && echo "$name $(( $(now_ms) - start ))" >>"$timings"
    true
}
run_timed() { "$@" 2>&1 | timed; return "${PIPESTATUS[0]}"; }
started=$SECONDS
if ((fast)); then
    tiers=()
    for tier in "${FAST_TIERS[@]}"; do tiers+=(--test "$tier"); done
    run_timed cargo test --workspace --exclude podstream-tests --all-targets --no-fail-fast "$@" || status=$?
    run_timed cargo test -p podstream-tests --lib "${tiers[@]}" --no-fail-fast "$@" || status=$?
else
    run_timed cargo test --workspace --all-targets --no-fail-fast "$@" || status=$?
fi
# The examples in the documentation (--all-targets leaves doctests out); a run narrowed by
# arguments is about its own targets.
if [ "$#" -eq 0 ]; then
    run_timed cargo test --workspace --doc --no-fail-fast || status=$?
fi
echo "test.sh: seconds per test binary (the end-to-end tiers first), $((SECONDS - started)) s in all:"
tier_names="offline simulated sink apiserver airflow release"
sort -k2,2nr "$timings" | while read -r name ms; do
    case " $tier_names " in *" $name "*) printf '  %-40s %5d.%d s  (tier)\n' "$name" $((ms / 1000)) $((ms % 1000 / 100)) ;; esac
done
sort -k2,2nr "$timings" | while read -r name ms; do
    case " $tier_names " in *" $name "*) continue ;; esac
    printf '  %-40s %5d.%d s\n' "$name" $((ms / 1000)) $((ms % 1000 / 100))
done
rm -f "$timings"

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
