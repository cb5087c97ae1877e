"""A parent's finish racing the enqueue of its child, on PostgreSQL.

A job nothing waits for is finished by one statement that does not look for
edges (docs/architecture.md, "The finish"). An enqueue that names a running job
as its parent marks that job's row; a finish that waited for that row lock
re-reads it and goes the way of a job with children. These tests hold the
enqueue's transaction open while the finish waits, so that the finish's
statement starts before the edge is committed.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import psycopg
import pytest

from conveyor import App, JobState
from conveyor.store.base import Finish

pytestmark = pytest.mark.sql_only


def _waiting_for_a_lock(admin: psycopg.Connection, dbname: str) -> bool:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
        (dbname,),
    ).fetchone()
    return bool(row and row[0])


def test_a_finish_that_waited_for_the_childs_enqueue_readies_the_child(pg_clean_dsn: str) -> None:
    with App(pg_clean_dsn) as app:
        app.migrate()

        @app.task(queue="q")
        def step(n: int) -> int:
            return n

        parent = step.enqueue(1)
        (claimed,) = app.store.job_claim(["q"], 1, "w", timedelta(seconds=60))
        assert claimed.id == parent.id and claimed.lease_token is not None

        dbname = psycopg.conninfo.conninfo_to_dict(pg_clean_dsn)["dbname"]
        finished: list[int] = []
        with (
            psycopg.connect(pg_clean_dsn) as caller,
            psycopg.connect(pg_clean_dsn, autocommit=True) as admin,
        ):
            # The child's enqueue, in the caller's transaction: the parent's row is
            # locked until it commits.
            child = step.options(after=[parent.id], connection=caller).enqueue(2)
            assert child.state is JobState.WAITING

            finish = threading.Thread(
                target=lambda: finished.extend(
                    app.store.job_finish(
                        [Finish.complete(parent.id, claimed.lease_token, "1")]  # type: ignore[arg-type]
                    )
                )
            )
            finish.start()
            deadline = time.monotonic() + 60
            while not _waiting_for_a_lock(admin, str(dbname)):
                assert time.monotonic() < deadline, "the finish never waited for the enqueue"
                assert finish.is_alive(), "the finish did not wait for the enqueue's lock"
                time.sleep(0.01)
            caller.commit()
            finish.join(timeout=60)
            assert not finish.is_alive()

        assert finished == [parent.id]
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
