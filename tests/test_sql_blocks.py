"""Named SQL blocks: one block may include another, so a rule is written once."""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

import pytest

from conveyor.store.sql import load_migrations, load_queries, parse_queries

TEXT = """
-- name: rules
new AS (SELECT 1)

-- name: insert
WITH input AS (SELECT 2),
{{rules}}
SELECT * FROM new
"""


def test_a_block_includes_another_by_name() -> None:
    queries = parse_queries(TEXT)
    assert queries["insert"] == "WITH input AS (SELECT 2),\nnew AS (SELECT 1)\nSELECT * FROM new"


def test_an_unknown_or_circular_include_is_refused() -> None:
    with pytest.raises(ValueError, match="includes 'missing', which is not defined"):
        parse_queries("-- name: a\nSELECT {{missing}}")
    with pytest.raises(ValueError, match="a -> b -> a includes itself"):
        parse_queries("-- name: a\n{{b}}\n-- name: b\n{{a}}")


def test_a_block_includes_a_block_of_another_file(tmp_path: Path) -> None:
    """``{{package/file.sql:name}}``: the other file's block, with its own includes expanded."""
    package = tmp_path / "sqlblocks_demo"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "rules.sql").write_text(
        "-- name: rules\nnew AS ({{inner}})\n-- name: inner\nSELECT 1"
    )
    (package / "move.sql").write_text(
        "-- name: move\nWITH input AS (SELECT 2),\n{{sqlblocks_demo/rules.sql:rules}}\nSELECT 3"
    )
    (package / "loop.sql").write_text("-- name: a\n{{sqlblocks_demo/loop.sql:a}}")
    sys.path.insert(0, str(tmp_path))
    try:
        move = load_queries("sqlblocks_demo", "move.sql")["move"]
        assert move == "WITH input AS (SELECT 2),\nnew AS (SELECT 1)\nSELECT 3"
        with pytest.raises(ValueError, match=r"includes 'nope' of sqlblocks_demo/rules\.sql"):
            parse_queries("-- name: x\n{{sqlblocks_demo/rules.sql:nope}}")
        with pytest.raises(ValueError, match="includes blocks of itself"):
            load_queries("sqlblocks_demo", "loop.sql")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("sqlblocks_demo", None)


def test_job_insert_and_the_staged_move_share_the_rules_of_an_enqueue() -> None:
    """The Spark layer's move of staged rows includes the store's rules, not a copy."""
    queries = load_queries("conveyor.store.postgres")
    rules = uncommented(queries["job_insert_rules"])
    assert "ON CONFLICT (queue, key)" in rules and "pg_notify('conveyor_jobs'" in rules
    assert rules in queries["job_insert"]
    assert "{{" not in queries["job_insert"]
    spark = load_queries("conveyor.spark.storage", "postgres.sql")
    assert rules in spark["spark_stage_move"]
    assert "{{" not in spark["spark_stage_move"]
    text = resources.files("conveyor.spark.storage").joinpath("postgres.sql").read_text()
    assert "ON CONFLICT (queue, key)" not in text  # included, never written out again
    # On SQLite the move takes ids and writes events with the store's own statements.
    lite, lite_spark = (
        load_queries("conveyor.store.sqlite"),
        load_queries("conveyor.spark.storage", "sqlite.sql"),
    )
    for store_block, spark_block in [
        ("job_take_ids", "spark_take_ids"),
        ("event_insert_enqueued", "spark_insert_enqueued_events"),
    ]:
        assert uncommented(lite[store_block]) in lite_spark[spark_block]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_store_holds_nothing_of_spark(backend: str) -> None:
    """Spark's statements, tables and code live in conveyor.spark.storage, not in the store."""
    queries = load_queries(f"conveyor.store.{backend}")
    assert [name for name in queries if name.startswith(("spark_", "scan_", "event_stream"))] == []
    assert not any("spark_" in sql for sql in queries.values())
    for migration in load_migrations(f"conveyor.store.{backend}"):
        statements = [ln for ln in migration.sql.splitlines() if not ln.startswith("--")]
        assert "spark" not in "\n".join(statements).lower(), migration.name
    package = resources.files(f"conveyor.store.{backend}")
    assert not package.joinpath("bulk.py").is_file()
    assert not resources.files("conveyor.store").joinpath("bulk.py").is_file()


def test_an_included_block_comes_without_its_leading_comment() -> None:
    """The comment explains a block where it is written; in place, only its SQL."""
    queries = parse_queries(
        "-- name: now\n-- The clock.\ncoalesce(:now, 0)\n"
        "-- name: due\nSELECT 1 WHERE run_at <= {{now}} -- kept\n"
    )
    assert queries["due"] == "SELECT 1 WHERE run_at <= coalesce(:now, 0) -- kept"
    assert queries["now"] == "-- The clock.\ncoalesce(:now, 0)"


def uncommented(block: str) -> str:
    """A block as an include puts it in place: without its leading comment lines."""
    return "\n".join(line for line in block.split("\n") if not line.startswith("--")).strip()


def test_a_file_starts_from_another_files_blocks(tmp_path: Path) -> None:
    """``-- with:`` reads a shared file's blocks as this file's; pyformat turns :name."""
    package = tmp_path / "sqlwith_demo"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "shared.sql").write_text(
        "-- name: due\n-- Comments keep :words.\nrun_at <= {{now}} AND id = :id AND x::text = 'a'\n"
    )
    (package / "pg.sql").write_text(
        "-- The dialect.\n-- with: sqlwith_demo/shared.sql as pyformat\n\n"
        "-- name: now\ncoalesce(%(now)s, now())\n-- name: pick\nSELECT 1 WHERE {{due}}\n"
    )
    (package / "twice.sql").write_text("-- with: sqlwith_demo/shared.sql\n-- name: due\nSELECT 2\n")
    sys.path.insert(0, str(tmp_path))
    try:
        queries = load_queries("sqlwith_demo", "pg.sql")
        assert queries["pick"] == (
            "SELECT 1 WHERE run_at <= coalesce(%(now)s, now()) AND id = %(id)s AND x::text = 'a'"
        )
        assert "-- Comments keep :words." in queries["due"]
        with pytest.raises(ValueError, match="defines 'due' twice"):
            load_queries("sqlwith_demo", "twice.sql")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("sqlwith_demo", None)
