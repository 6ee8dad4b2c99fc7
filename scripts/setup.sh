#!/usr/bin/env bash
# Installs what podstream's build and tests need on a fresh machine.
# Idempotent: safe to run before every test run. Used by scripts/test.sh,
# .ci/run and the README.
#
#   Rust toolchain   must already be there (rustup)
#   kubectl          Debian `kubernetes-client` when no kubectl is on PATH
#                    (the simulator's kubectl suite drives it)
set -euo pipefail

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo is not on PATH; install Rust (rustup) first" >&2
    exit 1
fi
echo "setup: $(cargo --version)"

# Debian packages, installed only when their command is missing.
apt_packages=()
command -v kubectl >/dev/null 2>&1 || apt_packages+=(kubernetes-client)

if ((${#apt_packages[@]})); then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
    fi
    echo "setup: installing Debian packages: ${apt_packages[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${apt_packages[@]}" >/dev/null
fi
echo "setup: kubectl $(kubectl version --client 2>/dev/null | head -1)"
