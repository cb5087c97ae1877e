#!/usr/bin/env bash
# Make sure Debian's chromium and chromedriver are installed, so the
# dashboard's browser tests can drive a real headless Chromium. Browser
# downloads by test tools do not work on every machine; apt does.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    echo "ensure-chromium: found $(command -v chromium) and $(command -v chromedriver)"
    exit 0
fi
echo "ensure-chromium: chromium or chromedriver not found"
"$(dirname "$0")/apt-install.sh" ensure-chromium \
    "Chromium and the chromedriver of the same version" chromium chromium-driver
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    echo "ensure-chromium: installed the packages, but chromium or chromedriver is still missing" >&2
    exit 1
fi
echo "ensure-chromium: installed $(command -v chromium) and $(command -v chromedriver)"
