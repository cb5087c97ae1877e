"""An atomic Spark write committed in parallel pieces on PostgreSQL.

One transaction moving every staged row into ``jobs`` runs on one server
process, at one core's speed, whatever the number of partitions. A parallel
commit splits the move into pieces, each run by a connection of its own at the
same time: a piece's transaction inserts its share of the rows (their jobs,
their events and the key rule, by the store's ``job_insert_rules``) and is then
prepared (``PREPARE TRANSACTION``): durable, holding its locks, and invisible to
every other transaction, claims included.

The committer then closes the write, records its result and its decision (a
row of ``spark_commits``) in one ordinary transaction. That commit is the
write's: before it, any failure rolls every piece back and nothing of the
write was ever seen; after it, every piece is committed (``COMMIT PREPARED``,
one small statement each, whatever the number of rows). A committer that dies
in between leaves pieces prepared; ``settle`` finishes them by the decision:
committed when its row exists, rolled back when it does not. A committer holds
an advisory lock on its session throughout, so a settle never touches the
pieces of a committer still at work, and knows a dead one by the lock it could
take.

The rows of one key (queue and key) always fall in the same piece, so the
pieces of a write never wait for each other's keys, and the parallel commits
of a schema take turns, so no two writes' pieces do. A piece may still wait
for another transaction's key, at most ``PIECE_LOCK_TIMEOUT`` before the write
gives up and rolls back. Pieces need the server's ``max_prepared_transactions``,
which is 0 by default: with no room, a write commits in one transaction as
before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from conveyor.spark.storage import PieceFailedError
from conveyor.store.sql import load_queries

_Q = load_queries("conveyor.spark.storage", "postgres.sql")
Connection = psycopg.Connection[tuple[Any, ...]]
#: How long a piece waits for a key another transaction holds before the write
#: rolls back: long enough for an enqueue to commit, short of hanging a write.
PIECE_LOCK_TIMEOUT = "60s"
_GID_PREFIX = "conveyor_spark"


def _gid(schema: str, token: str, piece: int) -> str:
    """A piece's prepared-transaction name: the write's token, the piece, the schema."""
    return f"{_GID_PREFIX}:{token}:{piece}:{schema}"


def room(conn: Connection) -> int:
    """How many pieces the server lets be prepared now."""
    row = conn.execute(_Q["spark_prepared_room"]).fetchone()
    return int(row[0]) if row else 0


@contextmanager
def committing(conn: Connection, token: str) -> Iterator[None]:
    """The committer's locks on its session, for the whole commit (see the module).

    Its write's, which tells a settle it is at work, and the schema's turn:
    one parallel commit at a time, so that no two writes' pieces wait for each
    other's keys.
    """
    conn.execute(_Q["spark_committer_lock"], {"token": token})
    try:
        conn.execute(_Q["spark_commit_turn"])
        yield
    finally:
        if not conn.closed and not conn.broken:  # else the locks ended with the session
            conn.execute(_Q["spark_commit_turn_end"])
            conn.execute(_Q["spark_committer_unlock"], {"token": token})


class ParallelMove:
    """One write's move in pieces: ``prepare()``, then ``commit()`` or ``roll_back()``."""

    def __init__(
        self,
        connect: Callable[[], Connection],
        schema: str,
        token: str,
        stages: str,
        pieces: int,
        now: datetime,
    ) -> None:
        self._connect = connect
        self._stages = stages
        self._now = now
        self.gids = [_gid(schema, token, piece) for piece in range(pieces)]
        self._prepared: list[str] = []
        self._queues: set[str] = set()

    def prepare(self) -> tuple[int, int]:
        """Run every piece at once; return (jobs inserted, rows given).

        When a piece fails, the pieces already prepared are rolled back and
        PieceFailedError says why.
        """
        with ThreadPoolExecutor(len(self.gids)) as pool:
            futures = [pool.submit(self._piece, index) for index in range(len(self.gids))]
        failure = next((e for f in futures if (e := f.exception()) is not None), None)
        if failure is not None:
            self.roll_back()
            raise PieceFailedError(
                f"a piece of the parallel commit failed, so the write was rolled back and "
                f"nothing was enqueued: {_reason(failure)}"
            ) from failure
        counts = [f.result() for f in futures]
        return sum(c[0] for c in counts), sum(c[1] for c in counts)

    def _piece(self, index: int) -> tuple[int, int]:
        conn = self._connect()
        try:
            conn.tpc_begin(self.gids[index])
            conn.execute(_Q["spark_piece_lock_timeout"], {"timeout": PIECE_LOCK_TIMEOUT})
            params = {"now": self._now, "pieces": len(self.gids), "piece": index}
            statement = _Q["spark_piece_move"].format(stages=self._stages)
            row = conn.execute(statement, params).fetchone()
            conn.tpc_prepare()
        finally:
            conn.close()  # a piece that failed before its prepare ends with its connection
        assert row is not None
        self._prepared.append(self.gids[index])
        self._queues.update(row[2])
        return int(row[0]), int(row[1])

    def commit(self, conn: Connection) -> None:
        """Commit every piece (the decision is committed), then wake the queues' workers."""
        for name in self._prepared:
            _finish(conn, name, commit=True)
        conn.execute(_Q["spark_notify"], {"queues": sorted(self._queues)})

    def roll_back(self) -> None:
        conn = self._connect()
        try:
            for name in self._prepared:
                _finish(conn, name, commit=False)
        finally:
            conn.close()


def settle(
    conn: Connection,
    drop_stages: Callable[[Connection, str], None],
    end_write: Callable[[Connection, str], None],
) -> list[str]:
    """Finish the pieces of committers that ended or died before finishing them.

    A decided write's pieces are committed, its staging dropped (through
    ``drop_stages``, given the write's token) and its decision forgotten; an
    undecided write's pieces are rolled back and the write ended (through
    ``end_write``, given its token): its committer is gone, so it can never
    commit. A committer still at work holds its lock, and its pieces are left
    to it. ``conn`` is in autocommit mode. Returns the tokens of the writes
    whose pieces it finished.
    """
    settled: list[str] = []
    pieces: dict[str, list[str]] = {}
    for name, token in conn.execute(_Q["spark_prepared_pieces"]).fetchall():
        pieces.setdefault(token, []).append(name)
    decided = {row[0] for row in conn.execute(_Q["spark_commit_decisions"]).fetchall()}
    for token in sorted(set(pieces) | decided):
        row = conn.execute(_Q["spark_committer_try_lock"], {"token": token}).fetchone()
        if not row or not row[0]:
            continue  # its committer is at work
        try:
            for name in pieces.get(token, []):
                _finish(conn, name, commit=token in decided)
            with conn.transaction():
                if token in decided:
                    drop_stages(conn, token)
                    conn.execute(_Q["spark_commit_forget"], {"token": token})
                else:
                    end_write(conn, token)
            if token in pieces:
                settled.append(token)
        finally:
            conn.execute(_Q["spark_committer_unlock"], {"token": token})
    return settled


def stalled(conn: Connection) -> set[str]:
    """Tokens of the writes with pieces prepared and no committer at work on them.

    Their committer died: until a settle finishes them, their pieces hold their
    keys' locks, and the oldest holds back the event stream and VACUUM.
    """
    tokens = {token for _, token in conn.execute(_Q["spark_prepared_pieces"]).fetchall()}
    found = set()
    for token in sorted(tokens):
        row = conn.execute(_Q["spark_committer_try_lock"], {"token": token}).fetchone()
        if row and row[0]:
            conn.execute(_Q["spark_committer_unlock"], {"token": token})
            found.add(token)
    return found


def _finish(conn: Connection, name: str, *, commit: bool) -> None:
    try:
        if commit:
            conn.tpc_commit(name)
        else:
            conn.tpc_rollback(name)
    except pg_errors.UndefinedObject:
        pass  # finished already, by a settle that ran in between


def _reason(exc: BaseException) -> str:
    if isinstance(exc, pg_errors.LockNotAvailable):
        return (
            f"it waited over {PIECE_LOCK_TIMEOUT} for a key that another transaction holds; "
            "run the write again"
        )
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
