"""An atomic Spark write committed in parallel pieces on PostgreSQL (docs/pipelines.md).

No Spark session: the write's tasks and driver run in this process (as in
test_spark_storage.py), each task's partition set by hand. The test server
allows prepared transactions (tests/pg_server.py); crashes are real: a child
process that exits at the worst moment, its connections dropped by the server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from conveyor.spark import storage as spark_storage
from conveyor.spark import writer as spark_writer
from conveyor.spark.options import Options
from conveyor.spark.rows import WritePlan
from conveyor.spark.storage import open_storage, pieces
from conveyor.spark.writer import ConveyorWriter
from conveyor.store import open_store
from pg_server import PgServer
from spark_helpers import leftovers

PARTS = 4
ROWS = 50  # per partition
#: Rows 0..ROWS-1 of every partition; keys repeat across partitions (key = row % 60).
KEY_SPAN = 60


@pytest.fixture
def db(pg_clean_dsn: str) -> Iterator[str]:
    store = open_store(pg_clean_dsn)
    store.migrate()
    store.close()
    yield pg_clean_dsn
    _forget_prepared(pg_clean_dsn)  # the database cannot be dropped while any is left


def _forget_prepared(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as pg:
        for (gid,) in pg.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
        ).fetchall():
            pg.tpc_rollback(gid)


def _writer(db: str, **extra: str) -> ConveyorWriter:
    fields = [StructField("id", LongType()), StructField("part", LongType()),
              StructField("path", StringType())]  # fmt: skip
    options = {"task": "resize", "keycolumn": "id", "excludecolumns": "id", **extra}
    plan = WritePlan.from_options(StructType(fields), Options(options, "write"))
    return ConveyorWriter(db, plan)


def _batch(part: int) -> pa.RecordBatch:
    rows = range(ROWS)
    return pa.RecordBatch.from_pydict(
        {
            "id": [(part * ROWS + i) % KEY_SPAN for i in rows],
            "part": [part] * ROWS,
            "path": [f"p{part}-r{i}" for i in rows],
        }
    )


def _stage_all(write: ConveyorWriter, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Each partition's task, run here with its partition number."""
    messages = []
    for part in range(PARTS):
        monkeypatch.setattr(spark_writer, "_task_context", lambda p=part: (p, 0, None))
        messages.append(write.write(iter([_batch(part)])))
    return messages


def _expected() -> dict[str, str]:
    """Key -> path of the row that wins it: the first in partition, then row, order."""
    winners: dict[str, str] = {}
    for part in range(PARTS):
        for i in range(ROWS):
            winners.setdefault(str((part * ROWS + i) % KEY_SPAN), f"p{part}-r{i}")
    return winners


def _jobs(db: str) -> dict[str, str]:
    with psycopg.connect(db) as pg:
        rows = pg.execute("SELECT key, kwargs ->> 'path' FROM jobs").fetchall()
    return {key: path for key, path in rows}


def _facts(db: str) -> dict[str, Any]:
    with psycopg.connect(db) as pg:

        def one(sql: str) -> Any:
            row = pg.execute(sql).fetchone()
            assert row is not None
            return row[0]

        return {
            "jobs": one("SELECT count(*) FROM jobs"),
            # An enqueued event counts its jobs (one per statement on PostgreSQL).
            "enqueued": one(
                "SELECT coalesce(sum(coalesce(jobs, 1)), 0) FROM events WHERE kind = 'enqueued'"
            ),
            "transactions": one("SELECT count(DISTINCT xid) FROM events"),
            "prepared": one(
                "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()"
            ),
            "decisions": one("SELECT count(*) FROM spark_commits"),
            "results": one("SELECT count(*) FROM spark_write_results"),
        }


def test_a_write_commits_in_pieces_all_its_rows_by_the_rules_of_an_enqueue(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    write = _writer(db)
    write.commit(_stage_all(write, monkeypatch))
    facts = _facts(db)
    # Each piece was its own transaction: four sets of jobs, each with its events.
    assert facts["transactions"] == PARTS
    assert facts["jobs"] == facts["enqueued"] == KEY_SPAN
    # The first row of each key in the write won it, though keys crossed partitions.
    assert _jobs(db) == _expected()
    assert (facts["prepared"], facts["decisions"], facts["results"]) == (0, 0, 1)
    assert leftovers(db) == ([], 0)
    result = spark_storage.open_storage(db)
    try:
        done = result.bulk_write_result(write.result_id)
    finally:
        result.close()
    assert done is not None
    assert (done.rows, done.enqueued, done.skipped) == (PARTS * ROWS, KEY_SPAN,
                                                        PARTS * ROWS - KEY_SPAN)  # fmt: skip
    assert done.path == "pieces"


def test_one_piece_is_one_transaction(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    write = _writer(db, commitpieces="1")
    write.commit(_stage_all(write, monkeypatch))
    assert _facts(db)["transactions"] == 1
    assert _jobs(db) == _expected()
    # In one transaction, ids follow the DataFrame's order, partition by partition.
    with psycopg.connect(db) as conn:
        paths = [r[0] for r in conn.execute("SELECT kwargs ->> 'path' FROM jobs ORDER BY id")]
    assert paths == list(_expected().values())


def test_without_room_for_prepared_transactions_a_write_takes_the_room_there_is(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """max_prepared_transactions is 0 by default: a write then commits in one transaction."""
    with psycopg.connect(db) as pg:
        room = int(pg.execute("SHOW max_prepared_transactions").fetchone()[0])  # type: ignore[index]
    held = []
    try:
        for n in range(room - 2):  # leave room for two pieces
            other = psycopg.connect(db)
            other.tpc_begin(f"someone_else_{n}")
            other.execute("SELECT 1")
            other.tpc_prepare()
            other.close()
            held.append(f"someone_else_{n}")
        write = _writer(db)
        write.commit(_stage_all(write, monkeypatch))
        assert _facts(db)["transactions"] == 2
        assert _jobs(db) == _expected()
    finally:
        _forget_prepared(db)


def test_a_piece_that_cannot_finish_rolls_the_whole_write_back(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key held by another transaction past the timeout: nothing of the write is kept."""
    monkeypatch.setattr(pieces, "PIECE_LOCK_TIMEOUT", "300ms")
    write = _writer(db)
    messages = _stage_all(write, monkeypatch)
    holder = psycopg.connect(db)
    try:
        holder.execute(
            "INSERT INTO jobs (queue, task, args, kwargs, key, run_at, created_at) "
            "VALUES ('default', 'other', '[]', '{}', '7', now(), now())"
        )  # uncommitted: key 7 is locked
        with pytest.raises(pieces.PieceFailedError, match="waited over 300ms for a key"):
            write.commit(messages)
    finally:
        holder.rollback()
        holder.close()
    facts = _facts(db)
    assert (facts["jobs"], facts["prepared"], facts["decisions"], facts["results"]) == (0, 0, 0, 0)
    # The write is still open, as after any failed commit: Spark's abort ends it.
    write.abort(messages)
    assert leftovers(db) == ([], 0)


def _cleanup(db: str) -> None:
    """What `conveyor spark cleanup` does (the settle first)."""
    storage = open_storage(db)
    try:
        storage.bulk_write_cleanup(datetime.now(UTC) - timedelta(hours=1), None)
    finally:
        storage.close()


_CRASH = """
import os, sys
from datetime import UTC, datetime
from conveyor.spark.storage import WriteCommit, open_storage, pieces

db, write_id, result_id, moment, *stages = sys.argv[1:]
original = getattr(pieces.ParallelMove, moment)

def crash(self, *args):
    if moment == "prepare":
        original(self, *args)  # every piece prepared, the decision not made
    os._exit(9)  # commit: the decision is made, no piece committed

setattr(pieces.ParallelMove, moment, crash)
storage = open_storage(db)
storage.bulk_write_commit(
    WriteCommit(write_id, stages, "live", datetime.now(UTC), result_id, pieces=4)
)
"""


def _crash_while_committing(
    db: str, monkeypatch: pytest.MonkeyPatch, moment: str
) -> tuple[ConveyorWriter, list[Any]]:
    write = _writer(db)
    messages = _stage_all(write, monkeypatch)
    stages = [m.stage for m in messages]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", _CRASH, db, write.write_id, write.result_id, moment, *stages],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 9, done.stderr
    return write, messages


def test_a_committer_that_dies_after_its_decision_leaves_pieces_the_next_settle_commits(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _crash_while_committing(db, monkeypatch, "commit")
    facts = _facts(db)
    # Decided, recorded, and yet invisible: every row is in a prepared piece.
    assert (facts["prepared"], facts["decisions"], facts["results"]) == (PARTS, 1, 1)
    assert facts["jobs"] == 0
    _cleanup(db)
    facts = _facts(db)
    assert (facts["prepared"], facts["decisions"], facts["results"]) == (0, 0, 1)
    assert _jobs(db) == _expected()
    assert facts["transactions"] == PARTS
    assert leftovers(db) == ([], 0)


def test_a_committer_that_dies_before_its_decision_leaves_pieces_the_next_settle_rolls_back(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    write, messages = _crash_while_committing(db, monkeypatch, "prepare")
    facts = _facts(db)
    assert (facts["prepared"], facts["decisions"], facts["results"]) == (PARTS, 0, 0)
    # Spark aborts a write whose commit failed: the pieces go, and so does the write.
    write.abort(messages)
    facts = _facts(db)
    assert (facts["jobs"], facts["prepared"], facts["results"]) == (0, 0, 0)
    assert leftovers(db) == ([], 0)


def test_a_write_whose_committer_died_before_deciding_is_shown_stalled_and_settled_by_cleanup(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Spark abort: the driver died too. Its pieces hold keys, events and VACUUM back."""
    from click.testing import CliRunner

    from conveyor.cli import cli
    from conveyor.spark import writes

    write, _ = _crash_while_committing(db, monkeypatch, "prepare")
    assert _facts(db)["prepared"] == PARTS
    assert [(w.id, w.state) for w in writes(db)] == [(write.result_id, "stalled")]
    out = CliRunner().invoke(cli, ["spark", "cleanup", "--dsn", db])
    assert out.exit_code == 0, out.output
    assert f"settled 1 writes left prepared by a committer that died ({write.result_id})" in (
        out.output
    )
    facts = _facts(db)
    assert (facts["jobs"], facts["prepared"], facts["results"]) == (0, 0, 0)
    assert leftovers(db) == ([], 0)
    assert writes(db) == []


def test_the_next_write_settles_a_write_whose_committer_died_before_deciding(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _crash_while_committing(db, monkeypatch, "prepare")
    write = _writer(db)  # opening a write settles what a dead committer left
    assert _facts(db)["prepared"] == 0
    assert leftovers(db)[1] == 1  # the new write's row only
    write.commit(_stage_all(write, monkeypatch))
    assert _jobs(db) == _expected()
    assert leftovers(db) == ([], 0)


def test_a_settle_leaves_alone_the_pieces_of_a_committer_at_work(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    decided, resume = threading.Event(), threading.Event()
    original = pieces.ParallelMove.commit

    def slow_commit(self: pieces.ParallelMove, conn: Any) -> None:
        decided.set()
        assert resume.wait(30)
        original(self, conn)

    monkeypatch.setattr(pieces.ParallelMove, "commit", slow_commit)
    write = _writer(db)
    messages = _stage_all(write, monkeypatch)
    committer = threading.Thread(target=write.commit, args=(messages,))
    committer.start()
    try:
        assert decided.wait(30)
        _cleanup(db)
        facts = _facts(db)
        assert (facts["prepared"], facts["decisions"], facts["jobs"]) == (PARTS, 1, 0)
    finally:
        resume.set()
        committer.join(60)
    facts = _facts(db)
    assert (facts["prepared"], facts["decisions"]) == (0, 0)
    assert _jobs(db) == _expected()


def test_claims_never_see_a_prepared_piece(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _crash_while_committing(db, monkeypatch, "commit")
    store = open_store(db)
    try:
        assert store.job_claim(["default"], 10, "w1", timedelta(seconds=30)) == []
    finally:
        store.close()
        _forget_prepared(db)


def test_two_writes_of_the_same_keys_at_once_enqueue_each_key_once(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parallel commits take turns: else each write's pieces could wait for the other's keys.

    That wait is unseen by the deadlock detector, and both writes would time
    out and fail. Taking turns, both commit, each key has one job, and no
    piece is left prepared.
    """
    monkeypatch.setattr(pieces, "PIECE_LOCK_TIMEOUT", "2s")
    writes = [_writer(db) for _ in range(2)]
    staged = [_stage_all(write, monkeypatch) for write in writes]
    start = threading.Barrier(2)
    failed: list[int] = []

    def commit(index: int) -> None:
        start.wait()
        try:
            writes[index].commit(staged[index])
        except pieces.PieceFailedError:
            failed.append(index)
            writes[index].abort(staged[index])

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failed == []
    facts = _facts(db)
    assert _jobs(db) == _expected()
    assert (facts["jobs"], facts["prepared"], facts["decisions"], facts["results"]) == (
        KEY_SPAN, 0, 0, 2,
    )  # fmt: skip
    assert leftovers(db) == ([], 0)


def test_a_committer_that_loses_its_connection_after_its_decision_still_commits(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decision is committed, so is the write: a settle on a new connection finishes it."""
    original = pieces.ParallelMove.commit

    def cut_then_commit(self: pieces.ParallelMove, conn: Any) -> None:
        with psycopg.connect(db, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])
        original(self, conn)

    monkeypatch.setattr(pieces.ParallelMove, "commit", cut_then_commit)
    write = _writer(db)
    write.commit(_stage_all(write, monkeypatch))  # no error: the write is committed
    facts = _facts(db)
    assert (facts["prepared"], facts["decisions"], facts["results"]) == (0, 0, 1)
    assert _jobs(db) == _expected()
    assert leftovers(db) == ([], 0)


@pytest.mark.slow  # a server of its own
def test_prepared_pieces_outlive_a_restart_of_the_database(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A decided write whose driver died, then the server restarted: the settle still commits it."""
    server = PgServer()
    server.start()
    try:
        db = server.dsn
        store = open_store(db)
        store.migrate()
        store.close()
        _crash_while_committing(db, monkeypatch, "commit")
        server.restart()
        facts = _facts(db)
        assert (facts["prepared"], facts["decisions"], facts["jobs"]) == (PARTS, 1, 0)
        _cleanup(db)
        facts = _facts(db)
        assert (facts["prepared"], facts["decisions"]) == (0, 0)
        assert _jobs(db) == _expected()
    finally:
        server.stop()
