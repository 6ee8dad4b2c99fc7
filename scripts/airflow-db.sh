#!/usr/bin/env bash
# Builds Airflow metadata databases with Airflow's own migrations, once, and caches them
# under target/airflow-db/ (the tests copy or restore them):
#   airflow-<v>.sqlite     `airflow db migrate` on a SQLite file
#   airflow-<v>.pg.sql     `airflow db migrate` on PostgreSQL, then pg_dump
# for each release line <v> of sink/airflow-versions.tsv (the one list of supported releases),
# each in its own venv under target/tools/airflow-<v> with the cncf.kubernetes provider the
# list pins, so the executor and its Python Kubernetes client are there for the tests.
# Called by scripts/setup.sh, which provides uv ($UV, with its cache in $UV_CACHE_DIR).
# PODSTREAM_AIRFLOW_LINES (space-separated lines) and PODSTREAM_AIRFLOW_DBS (`sqlite`, `pg` or
# both) narrow it, as `setup.sh --demo` does; by default every line and both databases.
set -euo pipefail
: "${UV:?run scripts/setup.sh, which installs uv}"
root="$(cd "$(dirname "$0")/.." && pwd)"
tools="$root/target/tools"
out="$root/target/airflow-db"
mkdir -p "$out"

declare -A airflow_release=()
declare -A kubernetes_provider=()
lines=()
while IFS=$'\t' read -r line release provider _head; do
    case "$line" in ''|'#'*) continue ;; esac
    case " ${PODSTREAM_AIRFLOW_LINES:-$line} " in *" $line "*) ;; *) continue ;; esac
    lines+=("$line")
    airflow_release[$line]="$release"
    kubernetes_provider[$line]="$provider"
done <"$root/sink/airflow-versions.tsv"

pg_bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
as_postgres() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

installed() { "$1/bin/python" -c "from importlib.metadata import version; print(version('$2'))" 2>/dev/null || true; }

# The venvs first: uv makes them in seconds from its cache.
for v in "${lines[@]}"; do
    venv="$tools/airflow-$v"
    provider="apache-airflow-providers-cncf-kubernetes==${kubernetes_provider[$v]}"
    # psycopg2 for Airflow's PostgreSQL engine; asyncpg for Airflow 3's async one.
    if [ ! -x "$venv/bin/airflow" ] || ! "$venv/bin/python" -c "import psycopg2, asyncpg" 2>/dev/null \
        || [ "$(installed "$venv" apache-airflow)" != "${airflow_release[$v]}" ]; then
        echo "setup: installing apache-airflow==${airflow_release[$v]} into $venv"
        "$UV" venv -q --clear --python python3 "$venv"
        "$UV" pip install -q --python "$venv/bin/python" "apache-airflow==${airflow_release[$v]}" "$provider" psycopg2-binary asyncpg
    fi
    if [ "$(installed "$venv" apache-airflow-providers-cncf-kubernetes)" != "${kubernetes_provider[$v]}" ]; then
        echo "setup: installing $provider into $venv"
        "$UV" pip install -q --python "$venv/bin/python" "apache-airflow==${airflow_release[$v]}" "$provider"
    fi
    # statsd (Airflow's `statsd` extra): tests/benches/scheduler_load.rs reads the scheduler's
    # own loop and executor-heartbeat timings from the metrics it sends.
    if [ -z "$(installed "$venv" statsd)" ]; then
        "$UV" pip install -q --python "$venv/bin/python" "statsd==4.0.1"
    fi
done

# `airflow db migrate` on a SQLite file.
migrate_sqlite() {
    local v="$1" home
    home="$(mktemp -d)"
    echo "setup: airflow $v db migrate (SQLite)"
    rm -f "$out/airflow-$v.sqlite.tmp"
    AIRFLOW_HOME="$home" AIRFLOW__CORE__LOAD_EXAMPLES=False \
    AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="sqlite:///$out/airflow-$v.sqlite.tmp" \
        "$tools/airflow-$v/bin/airflow" db migrate >"$out/airflow-$v.sqlite.log" 2>&1
    mv "$out/airflow-$v.sqlite.tmp" "$out/airflow-$v.sqlite"
    rm -rf "$home"
}

# `airflow db migrate` on a throwaway PostgreSQL cluster, then pg_dump. Runs in a subshell
# of its own, so its trap stops the cluster however it ends.
migrate_pg() {
    local v="$1" home pgdir port
    home="$(mktemp -d)"
    echo "setup: airflow $v db migrate (PostgreSQL)"
    pgdir="$(mktemp -d)"
    chmod 777 "$pgdir"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    as_postgres "$pg_bin/initdb" -D "$pgdir/data" -U postgres --auth=trust >/dev/null
    trap 'as_postgres "$pg_bin/pg_ctl" -D "$pgdir/data" -m immediate -w stop >/dev/null 2>&1 || true' EXIT
    as_postgres "$pg_bin/pg_ctl" -D "$pgdir/data" -l "$pgdir/log" -w \
        -o "-p $port -k $pgdir -c listen_addresses=127.0.0.1" start >/dev/null
    "$pg_bin/psql" -q -h 127.0.0.1 -p "$port" -U postgres -c "CREATE DATABASE airflow" >/dev/null
    AIRFLOW_HOME="$home" AIRFLOW__CORE__LOAD_EXAMPLES=False \
    AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="postgresql+psycopg2://postgres@127.0.0.1:$port/airflow" \
        "$tools/airflow-$v/bin/airflow" db migrate >"$out/airflow-$v.pg.log" 2>&1
    "$pg_bin/pg_dump" -h 127.0.0.1 -p "$port" -U postgres --no-owner --no-privileges airflow >"$out/airflow-$v.pg.sql.tmp"
    as_postgres "$pg_bin/pg_ctl" -D "$pgdir/data" -m fast -w stop >/dev/null
    trap - EXIT
    rm -rf "$pgdir" "$home"
    mv "$out/airflow-$v.pg.sql.tmp" "$out/airflow-$v.pg.sql"
}

# The migrations, two at a time (each is one busy Python process); any failing fails setup.
jobs_failed=0
running=0
for v in "${lines[@]}"; do
    for db in ${PODSTREAM_AIRFLOW_DBS:-sqlite pg}; do
        case "$db" in
            sqlite) [ -f "$out/airflow-$v.sqlite" ] && continue ;;
            pg) [ -f "$out/airflow-$v.pg.sql" ] && continue ;;
        esac
        if ((running == 2)); then
            wait -n || jobs_failed=1
            running=$((running - 1))
        fi
        ( "migrate_$db" "$v" ) &
        running=$((running + 1))
    done
done
while ((running > 0)); do
    wait -n || jobs_failed=1
    running=$((running - 1))
done
if ((jobs_failed)); then
    echo "setup: an Airflow migration failed; see the logs in $out" >&2
    exit 1
fi
echo "setup: Airflow databases cached in $out"
