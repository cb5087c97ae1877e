"""A parent's finish racing the enqueue of its child, on PostgreSQL.

A job nothing waits for is finished by one statement that does not look for
edges (docs/architecture.md, "The path of one job", step 6). An enqueue that
names a running job as its parent marks that job's row (waited_on); a finish
that reads the row after that enqueue committed goes the way of a job with
children. These tests hold the
enqueue's transaction open, so that a finish runs before and after the edge is
committed.
"""

from __future__ import annotations

from datetime import timedelta

import psycopg

from conveyor import App, JobState
from conveyor.store.records import Finish


def test_a_finish_after_the_childs_enqueue_readies_the_child(pg_clean_dsn: str) -> None:
    with App(pg_clean_dsn) as app:
        app.migrate()

        @app.task(queue="q")
        def step(n: int) -> int:
            return n

        parent = step.enqueue(1)
        (claimed,) = app.store.job_claim(["q"], 1, "w", timedelta(seconds=60))
        assert claimed.id == parent.id and claimed.lease_token is not None
        success = Finish.complete(parent.id, claimed.lease_token, "1")

        with psycopg.connect(pg_clean_dsn) as caller:
            # The child's enqueue, in the caller's transaction: the parent's row is
            # locked until it commits. A finish meanwhile passes the row over (it
            # waits for no other transaction) and ends nothing.
            child = step.options(after=[parent.id], connection=caller).enqueue(2)
            assert child.state is JobState.WAITING
            assert app.store.job_finish([success]) == []
            assert app.get(parent.id).state is JobState.RUNNING
            caller.commit()

        # Once the edge is committed, the finish is the parent's with children.
        assert app.store.job_finish([success]) == [parent.id]
        assert app.get(parent.id).state is JobState.SUCCEEDED
        assert app.get(child.id).state is JobState.QUEUED


def test_a_job_nothing_waits_for_is_not_marked(pg_clean_dsn: str) -> None:
    with App(pg_clean_dsn) as app:
        app.migrate()

        @app.task(queue="q")
        def step(n: int) -> int:
            return n

        lone = step.enqueue(1)
        parent = step.enqueue(2)
        step.options(after=[parent.id]).enqueue(3)
        with psycopg.connect(pg_clean_dsn) as conn:
            rows = dict(conn.execute("SELECT id, waited_on FROM jobs").fetchall())
        assert rows[lone.id] is False
        assert rows[parent.id] is True
