"""The caller's own transactions on SQLite: enqueue in them (TransactionalStore)
and complete a job in them (TransactionalCompletion, docs/effects.md).
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any

from conveyor.errors import ConfigurationError
from conveyor.job import utcnow
from conveyor.store.records import Finish, Lease
from conveyor.store.sqlite.base import _finish, _ts
from conveyor.store.sqlite.core import CoreMixin


class TransactionsMixin(CoreMixin):
    """Work done on a caller's sqlite3 connection, committed with its transaction."""

    #: TransactionalStore: enqueue inside the caller's transaction on this connection.
    transaction_connection = "a sqlite3 Connection"

    def job_complete_in(
        self, lease: Lease, result_json: str, connection: Any, now: datetime | None = None
    ) -> bool:
        # The worker's own finish of a success, in the caller's transaction.
        conn = self._caller_transaction(connection)
        success = Finish.complete(lease.id, lease.token, result_json)
        return bool(_finish(conn, [success], _ts(now or utcnow())))

    def _caller_transaction(self, connection: Any) -> sqlite3.Connection:
        """The caller's connection, checked: a sqlite3 one, on this file, in a transaction."""
        if not isinstance(connection, sqlite3.Connection):
            raise ConfigurationError(
                f"ctx.complete needs a sqlite3 Connection to {self.path}, "
                f"got {type(connection).__name__}"
            )
        files = [row[2] for row in connection.execute("PRAGMA database_list") if row[1] == "main"]
        if not files or not files[0] or Path(files[0]).resolve() != self.path.resolve():
            raise ConfigurationError(
                f"ctx.complete needs a connection to {self.path}, the queue's database; "
                f"this one is connected to {files[0] if files and files[0] else 'memory'}"
            )
        if not connection.in_transaction:
            raise ConfigurationError(
                "ctx.complete needs an open transaction on the connection: write your "
                "effect first (or run BEGIN IMMEDIATE), then commit after ctx.complete"
            )
        return connection
