"""A public way into a SQLite store's connections, for a layer built on top of it.

A layer with tables and statements of its own (the Spark data source's
storage) needs what the store's own methods use: the thread's connection, a
write transaction under the store's write lock (SQLite has one writer), and a
line of migrations applied under the store's rules. ``SQLiteStore.session()``
lends them through this object, so that such a layer holds a store instead of
subclassing it and reaching into its private members.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from conveyor.store.sql import Migration

if TYPE_CHECKING:
    from conveyor.store.sqlite.base import SQLiteBase


class SQLiteSession:
    """The connections and write transactions of one ``SQLiteStore`` (see the module)."""

    def __init__(self, store: SQLiteBase) -> None:
        self._store = store

    @property
    def path(self) -> Path:
        return self._store.path

    @property
    def description(self) -> str:
        """The database, for messages: ``SQLite database /path/to/file.db``."""
        return self._store.description

    def connection(self) -> sqlite3.Connection:
        """This thread's connection, in autocommit mode: for reads and single statements."""
        return self._store._conn()

    def write(self) -> AbstractContextManager[sqlite3.Connection]:
        """A write transaction under the store's write lock, committed when the block ends."""
        return self._store._write()

    def apply_migrations(
        self, conn: sqlite3.Connection, migrations: Sequence[Migration], version: str, record: str
    ) -> int:
        """Apply a line of migrations above the version ``version`` reads, recording each.

        In the caller's write transaction; returns the version reached.
        """
        return self._store._apply_migrations(conn, migrations, version, record)
