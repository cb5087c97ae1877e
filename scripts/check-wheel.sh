#!/usr/bin/env bash
# Install the built wheel into a fresh virtual environment, with each extra,
# and check that every part imports and that the versions agree: the README's
# install commands, tried as a user would.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
wheel=$(ls dist/conveyor-*.whl | tail -n 1)
env_dir=$(mktemp -d)
trap 'rm -rf "$env_dir"' EXIT

"$PYTHON" -m venv "$env_dir"
pip=("$env_dir/bin/python" -m pip install -q --disable-pip-version-check)

echo "check-wheel: $wheel, the core alone"
"${pip[@]}" "$wheel"
"$env_dir/bin/python" - <<'PY'
import importlib.metadata, sys
import conveyor
from conveyor import App
assert conveyor.__version__ == importlib.metadata.version("conveyor"), conveyor.__version__
for extra in ("psycopg", "redis", "click", "starlette", "pyspark", "opentelemetry"):
    assert extra not in sys.modules, f"the core imported {extra}"
print("  core", conveyor.__version__, "ok")
PY

for extra in postgres redis cli web spark otel; do
    echo "check-wheel: with [$extra]"
    "${pip[@]}" "$wheel[$extra]"
done
"$env_dir/bin/python" - <<'PY'
import conveyor.store.postgres, conveyor.store.redis, conveyor.cli, conveyor.web.server, conveyor.spark
import conveyor.otel
from conveyor.store.redis.base import _SCRIPTS
# The Lua scripts ship in the wheel: every operation, with common.lua prepended.
assert {"job_claim", "job_finish", "job_insert_many", "job_rescue_expired"} <= set(_SCRIPTS), _SCRIPTS
# Spark's storage ships its statements and its own migrations (spark/storage/).
from conveyor.spark.storage import postgres as spark_pg, sqlite as spark_lite
for module in (spark_pg, spark_lite):
    assert "spark_stage_move" in module._Q and module._MIGRATIONS, module.__name__
assert "ON CONFLICT (queue, key)" in spark_pg._Q["spark_stage_move"]  # the store's rules, included
print("  postgres, redis (%d scripts), cli, web, spark (storage: %d statements), otel import ok"
      % (len(_SCRIPTS), len(spark_pg._Q)))
PY
version=$("$env_dir/bin/conveyor" --version)
expected=$("$env_dir/bin/python" -c "import conveyor; print(conveyor.__version__)")
case "$version" in
    *"$expected"*) echo "  conveyor --version: $version" ;;
    *) echo "conveyor --version says '$version', the package $expected" >&2; exit 1 ;;
esac
