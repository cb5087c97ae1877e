#!/usr/bin/env bash
# Make sure PostgreSQL's JDBC driver is installed (Debian's libpostgresql-jdbc-java,
# /usr/share/java/postgresql.jar): benchmarks/spark.py measures Spark's own JDBC
# writer and reader beside the conveyor data source on the same server.
set -euo pipefail

jar=/usr/share/java/postgresql.jar
if [[ -f "$jar" ]]; then
    echo "ensure-pg-jdbc: found $jar"
    exit 0
fi
"$(dirname "$0")/apt-install.sh" ensure-pg-jdbc "PostgreSQL's JDBC driver" libpostgresql-jdbc-java
