#!/usr/bin/env bash
# apt-install.sh WHO WHAT PACKAGE...: install Debian packages for the ensure-*
# scripts, as root or through sudo. WHO prefixes the messages; WHAT says what
# to install by hand where apt-get is unavailable.
set -euo pipefail

who="$1"
what="$2"
shift 2

if ! command -v apt-get >/dev/null 2>&1; then
    echo "$who: apt-get is unavailable; install $what by hand" >&2
    exit 1
fi
if [[ "$(id -u)" -eq 0 ]]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
else
    echo "$who: need root (or sudo) to install $*" >&2
    exit 1
fi
echo "$who: installing $* with apt-get"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "$@"
