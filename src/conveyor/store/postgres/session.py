"""A public way into a PostgreSQL store's connections, for a layer built on top of it.

A layer with tables and statements of its own (the Spark data source's
storage) needs what the store's own methods use: a pooled connection, one
transaction, a connection of its own set like the pool's, and a line of
migrations applied under the store's rules. ``PostgresStore.session()`` lends
them through this object, so that such a layer holds a store instead of
subclassing it and reaching into its private members.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import psycopg

from conveyor.store.sql import Migration

if TYPE_CHECKING:
    from conveyor.store.postgres.base import PostgresBase

Connection = psycopg.Connection[tuple[Any, ...]]


class PostgresSession:
    """The connections and transactions of one ``PostgresStore`` (see the module)."""

    def __init__(self, store: PostgresBase) -> None:
        self._store = store

    @property
    def dsn(self) -> str:
        return self._store.dsn

    @property
    def description(self) -> str:
        """The database, for messages: ``PostgreSQL at host:port/dbname`` (never a password)."""
        return self._store.description

    def connection(self) -> AbstractContextManager[Connection]:
        """A pooled connection in autocommit mode, for the block (each statement commits)."""
        return self._store._conn()

    def transaction(self) -> AbstractContextManager[Connection]:
        """A pooled connection in one transaction, committed when the block ends."""
        return self._store._tx()

    def connect(self) -> Connection:
        """A connection of the caller's own, outside the pool, set as the pool's are.

        For work that must hold a connection of its own (a prepared transaction);
        the caller closes it.
        """
        from conveyor.store.postgres.store import session_options

        return psycopg.connect(
            self._store.dsn,
            options=session_options(self._store.dsn),
            connect_timeout=max(1, int(self._store._connect_timeout)),
        )

    def apply_migrations(
        self, conn: Connection, migrations: Sequence[Migration], version: str, record: str
    ) -> int:
        """Apply a line of migrations above the version ``version`` reads, recording each.

        In the caller's transaction, which holds the line's lock; returns the version reached.
        """
        return self._store._apply_migrations(conn, migrations, version, record)
