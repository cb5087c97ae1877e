"""Workflows with exactly-once effects: a parent completed in the caller's transaction
(ctx.complete) lets the jobs waiting for it go on in that same transaction."""

from __future__ import annotations

import sqlite3
from datetime import timedelta

import psycopg

from conveyor import App, Context, JobState
from conveyor.job import EventKind
from conveyor.store.records import Lease
from conveyor.testing import drain
from store_fixtures import sql_only


def connect(dsn: str) -> sqlite3.Connection | psycopg.Connection[tuple[object, ...]]:
    """The caller's own connection to the queue's database, in a transaction."""
    if dsn.startswith("sqlite"):
        conn = sqlite3.connect(dsn.removeprefix("sqlite:///"), timeout=30)
        conn.execute("BEGIN IMMEDIATE")  # where a handler's own write would begin it
        return conn
    return psycopg.connect(dsn)


@sql_only
def test_a_parent_completed_in_the_callers_transaction_readies_its_child_on_commit(
    app: App, dsn: str
) -> None:
    @app.task()
    def parent() -> int:
        return 1

    @app.task()
    def child(ctx: Context) -> int:
        return sum(ctx.upstream.values()) + 1

    first = parent.enqueue()
    waiting = child.options(after=[first]).enqueue()
    assert app.get(waiting.id).state == JobState.WAITING
    (claimed,) = app.store.job_claim(["default"], 1, "w", timedelta(seconds=60))
    assert claimed.id == first.id and claimed.lease_token is not None

    conn = connect(dsn)
    try:
        assert app.store.job_complete_in(Lease(first.id, claimed.lease_token), "41", conn)
        # Not committed: others still see the parent running and the child waiting.
        assert app.get(waiting.id).state == JobState.WAITING
        conn.commit()
    finally:
        conn.close()

    assert app.get(first.id).state == JobState.SUCCEEDED
    assert app.get(waiting.id).state == JobState.QUEUED
    assert EventKind.READY in [e.kind for e in app.events(waiting.id)]
    assert drain(app) == {"succeeded": 1}
    assert app.get(waiting.id).result == 42


@sql_only
def test_a_rolled_back_complete_leaves_the_child_waiting(app: App, dsn: str) -> None:
    @app.task()
    def parent() -> None:
        return None

    @app.task()
    def child() -> None:
        return None

    first = parent.enqueue()
    waiting = child.options(after=[first]).enqueue()
    (claimed,) = app.store.job_claim(["default"], 1, "w", timedelta(seconds=60))
    assert claimed.lease_token is not None
    conn = connect(dsn)
    try:
        assert app.store.job_complete_in(Lease(first.id, claimed.lease_token), "null", conn)
        conn.rollback()
    finally:
        conn.close()
    assert app.get(first.id).state == JobState.RUNNING
    assert app.get(waiting.id).state == JobState.WAITING
