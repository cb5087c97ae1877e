#!/usr/bin/env bash
# Make sure the PostgreSQL server binaries (initdb, pg_ctl, postgres) are
# installed, so the test suite can start its own throwaway server.
# Installs Debian's `postgresql` package with apt-get when they are missing.
set -euo pipefail

find_initdb() {
    local dir
    if [[ -n "${CONVEYOR_PG_BINDIR:-}" && -x "${CONVEYOR_PG_BINDIR}/initdb" ]]; then
        echo "${CONVEYOR_PG_BINDIR}/initdb"
        return 0
    fi
    if command -v initdb >/dev/null 2>&1; then
        command -v initdb
        return 0
    fi
    for dir in /usr/lib/postgresql/*/bin; do
        if [[ -x "$dir/initdb" ]]; then
            echo "$dir/initdb"
            return 0
        fi
    done
    return 1
}

# PgBouncer, which the poll-only test puts in front of the server in transaction
# mode (tests/pgbouncer.py starts its own; the package's system service is not needed).
if command -v pgbouncer >/dev/null 2>&1 || [[ -x /usr/sbin/pgbouncer ]]; then
    echo "ensure-postgres: found pgbouncer"
else
    echo "ensure-postgres: pgbouncer not found"
    "$(dirname "$0")/apt-install.sh" ensure-postgres "PgBouncer (pgbouncer)" pgbouncer
    if command -v systemctl >/dev/null 2>&1; then
        systemctl disable --now pgbouncer >/dev/null 2>&1 || true
    fi
fi

if [[ -n "${CONVEYOR_TEST_PG_DSN:-}" ]]; then
    echo "ensure-postgres: CONVEYOR_TEST_PG_DSN is set; using that server"
    exit 0
fi

if initdb_path="$(find_initdb)"; then
    echo "ensure-postgres: found $initdb_path"
else
    echo "ensure-postgres: PostgreSQL server binaries not found"
    "$(dirname "$0")/apt-install.sh" ensure-postgres \
        "PostgreSQL 15 (initdb, pg_ctl, postgres)" postgresql
    if ! initdb_path="$(find_initdb)"; then
        echo "ensure-postgres: installed postgresql, but initdb is still not found" >&2
        exit 1
    fi
    echo "ensure-postgres: installed $initdb_path"
fi

# As root, the test server runs as the `postgres` system user (initdb refuses
# to run as root). The Debian package creates it; make sure it exists anyway.
if [[ "$(id -u)" -eq 0 ]] && ! id -u postgres >/dev/null 2>&1; then
    echo "ensure-postgres: creating the postgres system user"
    useradd --system --user-group --no-create-home --shell /usr/sbin/nologin postgres
fi
