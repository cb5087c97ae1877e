#!/usr/bin/env bash
# Make sure redis-server is installed, so the test suite can start its own
# throwaway Redis. Installs Debian's `redis-server` package with apt-get when
# it is missing.
set -euo pipefail

if [[ -n "${CONVEYOR_TEST_REDIS_DSN:-}" ]]; then
    echo "ensure-redis: CONVEYOR_TEST_REDIS_DSN is set; using that server"
    exit 0
fi

if command -v redis-server >/dev/null 2>&1; then
    echo "ensure-redis: found $(command -v redis-server)"
    exit 0
fi

echo "ensure-redis: redis-server not found"
"$(dirname "$0")/apt-install.sh" ensure-redis "Redis 7 (redis-server)" redis-server
if ! command -v redis-server >/dev/null 2>&1; then
    echo "ensure-redis: installed redis-server, but it is still not on PATH" >&2
    exit 1
fi
# The package starts a system-wide server; the tests start their own and do not need it.
if command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now redis-server >/dev/null 2>&1 || true
fi
echo "ensure-redis: installed $(command -v redis-server)"
