"""SQLite: the watcher moves the write-ahead log into the database file in the background.

In WAL mode the database file itself is written only by a checkpoint. Commits
smaller than the autocheckpoint threshold never run one, so the file growing
while nothing but the watcher runs shows that the watcher checkpointed.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from conveyor.job import NewJob
from conveyor.store.sqlite import SQLiteStore


def test_watcher_checkpoints_what_was_written(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store = SQLiteStore(path)
    try:
        store._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size_before = path.stat().st_size
        now = datetime.now(UTC)
        payload = '["' + "x" * 2000 + '"]'  # a page's worth per job: the file must grow
        store.job_insert_many([NewJob("q", "t", payload, "{}", now) for _ in range(200)], now)
        assert path.stat().st_size == size_before, "a small commit checkpointed by itself"

        changes: list[str] = []
        subscription = store.subscribe(lambda kind, payload: changes.append(kind))
        try:
            deadline = time.monotonic() + 10
            while path.stat().st_size == size_before and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            subscription.close()
        assert path.stat().st_size > size_before + 200 * 2000
        assert changes, "the watcher never reported"
        # Everything is still there, now read from the database file.
        assert store.stats(datetime.now(UTC)).count("queued", "q") == 200
    finally:
        store.close()
