#!/usr/bin/env bash
# Make sure Debian's chromium and chromedriver are installed, so the
# dashboard's browser tests can drive a real headless Chromium. Browser
# downloads by test tools do not work on every machine; apt does.
set -euo pipefail

as_root() {
    if [[ "$(id -u)" -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        echo "ensure-chromium: need root (or sudo) to run: $*" >&2
        exit 1
    fi
}

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    echo "ensure-chromium: found $(command -v chromium) and $(command -v chromedriver)"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-chromium: chromium or chromedriver not found and apt-get is unavailable;" \
        "install Chromium and the chromedriver of the same version by hand" >&2
    exit 1
fi
echo "ensure-chromium: chromium or chromedriver not found; installing with apt-get"
as_root env DEBIAN_FRONTEND=noninteractive apt-get update
as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends chromium chromium-driver
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    echo "ensure-chromium: installed the packages, but chromium or chromedriver is still missing" >&2
    exit 1
fi
echo "ensure-chromium: installed $(command -v chromium) and $(command -v chromedriver)"
