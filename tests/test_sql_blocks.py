"""Named SQL blocks: one block may include another, so a rule is written once."""

from __future__ import annotations

import pytest

from conveyor.store.sql import load_queries, parse_queries

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


def test_job_insert_and_the_staged_move_share_the_rules_of_an_enqueue() -> None:
    queries = load_queries("conveyor.store.postgres")
    rules = queries["job_insert_rules"]
    assert "ON CONFLICT (queue, key)" in rules and "pg_notify('conveyor_jobs'" in rules
    assert rules in queries["job_insert"]
    assert rules in queries["spark_stage_move"]
    assert "{{" not in queries["job_insert"]
