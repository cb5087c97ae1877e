#!/usr/bin/env bash
# Make sure a Java runtime that Spark 4 supports (17 or 21) is on PATH, so the
# Spark suite can start its local session. Installs Debian's OpenJDK 17
# headless runtime with apt-get when none is found.
set -euo pipefail

java_major() {
    # `java -version` prints e.g. 'openjdk version "17.0.15" 2025-04-15' on stderr.
    java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1
}

if command -v java >/dev/null 2>&1; then
    major="$(java_major)"
    if [[ "$major" == "17" || "$major" == "21" ]]; then
        echo "ensure-java: found Java $major"
        exit 0
    fi
    echo "ensure-java: Java ${major:-?} on PATH; Spark 4 needs 17 or 21"
fi

"$(dirname "$0")/apt-install.sh" ensure-java "OpenJDK 17" openjdk-17-jre-headless
