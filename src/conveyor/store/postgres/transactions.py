"""The caller's own transactions on PostgreSQL: enqueue in them (TransactionalStore)
and complete a job in them (TransactionalCompletion, docs/effects.md).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from conveyor.errors import ConfigurationError
from conveyor.store.postgres import flows as pg_flows
from conveyor.store.postgres.base import _Q, _finish_params, _own_cursor
from conveyor.store.postgres.core import CoreMixin
from conveyor.store.records import Finish, Lease


class TransactionsMixin(CoreMixin):
    """Work done on a caller's psycopg connection, committed with its transaction."""

    #: TransactionalStore: enqueue inside the caller's transaction on this connection.
    transaction_connection = "a psycopg Connection"

    def job_complete_in(
        self, lease: Lease, result_json: str, connection: Any, now: datetime | None = None
    ) -> bool:
        if not isinstance(connection, psycopg.Connection):
            raise ConfigurationError(
                "ctx.complete needs a psycopg Connection to the queue's database, "
                f"got {type(connection).__name__}"
            )
        status = connection.info.transaction_status
        # In a transaction block, or one that this statement opens (not autocommit).
        open_one = status == psycopg.pq.TransactionStatus.INTRANS or (
            status == psycopg.pq.TransactionStatus.IDLE and not connection.autocommit
        )
        if not open_one:
            raise ConfigurationError(
                "ctx.complete needs an open transaction on the connection (not autocommit, "
                "not failed): call it inside `with conn.transaction():` or before conn.commit()"
            )
        # The worker's own finish of a success, in the caller's transaction (which,
        # unlike job_finish, waits for a row held a moment by a renewal or a rescue).
        params = _finish_params(
            [Finish.complete(lease.id, lease.token, result_json)], now, flows=True
        )
        with _own_cursor(connection) as cur:
            row = cur.execute(_Q["job_complete_in"], params).fetchone()
            if row is None or not row[1]:  # not ended (a row passed over: a lease lost meanwhile)
                return False
            # The jobs waiting for this one go on in the same transaction.
            pg_flows.release(cur, [lease.id], now)
            return True
