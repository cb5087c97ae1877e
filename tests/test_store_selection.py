"""Selecting jobs by key, limit key and text in their arguments, on every store.

The same selection lists, counts and acts on the same jobs everywhere; the
search of arguments reads only the newest jobs (ARGS_SEARCH_SPAN, small here).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import conveyor.store.selection
from conveyor import App
from conveyor.job import JobState


@pytest.fixture
def filled(app: App) -> App:
    app.enqueue("mail.send", ["ada@example.com"], {"lang": "EN"}, queue="mail", key="welcome-ada")
    app.enqueue("mail.send", ["bob@example.com"], {"lang": "fr"}, queue="mail", key="welcome-bob")
    app.enqueue("api.call", [1], {"customer": "c-42"}, queue="api", limit_key="c-42")
    app.enqueue("api.call", [2], {"customer": "c-42"}, queue="api", limit_key="c-42")
    app.enqueue("api.call", [3], {"customer": "c-7"}, queue="api", limit_key="c-7")
    return app


def test_by_key_and_by_limit_key(filled: App) -> None:
    (ada,) = filled.jobs(key="welcome-ada")
    assert ada.args == ["ada@example.com"]
    assert filled.jobs(key="welcome-ada", queue="api") == []
    assert [j.args for j in filled.jobs(limit_key="c-42")] == [[2], [1]]
    assert [j.args for j in filled.jobs(limit_key="c-42", state="ready", queue="api")] == [
        [2],
        [1],
    ]
    assert filled.count_jobs(limit_key="c-42") == {"ready": 2}
    assert filled.count_jobs(key="welcome-bob", queue="mail") == {"ready": 1}
    assert filled.cancel_jobs(limit_key="c-7") == 1
    assert filled.count_jobs(limit_key="c-7") == {"cancelled": 1}


def test_text_in_the_arguments_case_insensitive(filled: App) -> None:
    assert [j.args for j in filled.jobs(args="ADA@example")] == [["ada@example.com"]]
    # Keyword arguments too (their values: spacing in the JSON differs between stores).
    assert [j.args for j in filled.jobs(args="FR")] == [["bob@example.com"]]
    assert [j.args for j in filled.jobs(args="c-42", queue="api")] == [[2], [1]]
    assert filled.count_jobs(args="c-42") == {"ready": 2}
    assert filled.jobs(args="nobody@") == []
    assert filled.count_jobs(args="example.com", state="ready") == {"ready": 2}


def test_the_search_of_arguments_reads_the_newest_jobs_only(
    filled: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(conveyor.store.selection, "ARGS_SEARCH_SPAN", 3)
    # Five jobs: the span covers the three newest (the api calls), not the mails.
    assert filled.jobs(args="example.com") == []
    assert filled.count_jobs(args="example.com") == {}
    assert len(filled.jobs(args="customer")) == 3
    newer = filled.enqueue("mail.send", ["cy@example.com"], queue="mail")
    assert [j.id for j in filled.jobs(args="example.com")] == [newer.id]
    # Other filters still apply to every job.
    assert len(filled.jobs(queue="mail", state=JobState.QUEUED)) == 3


def test_the_search_of_arguments_is_a_range_of_the_primary_key(tmp_path: Path) -> None:
    """The floor stands apart from the filters' ORs: SQLite's plan bounds the walk by it.

    (PostgreSQL plans these statements for the values given, the same bound.)
    """
    import sqlite3

    from conveyor.store.dsn import open_store, sqlite_path
    from conveyor.store.selection import driven
    from conveyor.store.sql import load_queries

    dsn = f"sqlite:///{tmp_path / 'plan.db'}"
    open_store(dsn).close()
    queries = load_queries("conveyor.store.sqlite")
    params = {
        "state": None, "queue": None, "task": None, "group": None, "batch": None,
        "worker": None, "key": None, "limit_key": None, "error": None, "args": "ada",
        "args_floor": 900, "ids": None, "before_id": 2**63 - 1, "limit": 50, "now": 0.0,
    }  # fmt: skip
    conn = sqlite3.connect(sqlite_path(dsn))
    try:
        for name in ("job_select", "job_count"):
            plan = " | ".join(
                r[3]
                for r in conn.execute("EXPLAIN QUERY PLAN " + driven(queries, name, "all"), params)
            )
            assert "USING INTEGER PRIMARY KEY (rowid>?" in plan, (name, plan)
    finally:
        conn.close()
