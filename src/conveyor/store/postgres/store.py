"""The PostgreSQL store: production, many workers on many machines.

psycopg 3 with a connection pool. Claims lock rows with ``FOR UPDATE SKIP
LOCKED`` so concurrent claimers pass each other; every change to a running job
re-checks its lease token in the WHERE clause of the same statement; events
and notifications are written by the statement that makes the change.

The class is composed of one mixin per capability (``core.py`` for the
``JobStore`` every other builds on, ``operations.py``, ``insight.py``, ...),
over the connection plumbing of ``base.py``.
"""

from __future__ import annotations

from conveyor.store.boundary import translate_errors
from conveyor.store.postgres.archive import ArchiveMixin
from conveyor.store.postgres.audit import PostgresAudit
from conveyor.store.postgres.base import _away, _missing_table, session_options
from conveyor.store.postgres.core import CoreMixin
from conveyor.store.postgres.expiry import PostgresExpiry
from conveyor.store.postgres.fair import PostgresFair
from conveyor.store.postgres.holds import HoldsMixin
from conveyor.store.postgres.insight import InsightMixin
from conveyor.store.postgres.limit_keys import PostgresLimitKeys
from conveyor.store.postgres.limits import LimitsMixin
from conveyor.store.postgres.metrics import PostgresTaskMetrics
from conveyor.store.postgres.operations import OperationsMixin
from conveyor.store.postgres.outcomes import OutcomesMixin
from conveyor.store.postgres.payloads import PostgresPayloads
from conveyor.store.postgres.retaining import PostgresRetaining
from conveyor.store.postgres.session import PostgresSession
from conveyor.store.postgres.signals import PostgresSignals
from conveyor.store.postgres.steps import StepsMixin
from conveyor.store.postgres.transactions import TransactionsMixin
from conveyor.store.postgres.worker_control import PostgresWorkerControl
from conveyor.store.postgres.workflow_retry import PostgresWorkflowRetry
from conveyor.store.postgres.workflows import WorkflowsMixin

#: session_options: Spark's storage opens its connections with the pool's settings.
__all__ = ["PostgresStore", "session_options"]


@translate_errors(_missing_table, _away)
class PostgresStore(
    OperationsMixin,
    InsightMixin,
    LimitsMixin,
    WorkflowsMixin,
    HoldsMixin,
    OutcomesMixin,
    StepsMixin,
    PostgresSignals,
    TransactionsMixin,
    ArchiveMixin,
    PostgresAudit,
    PostgresLimitKeys,
    PostgresWorkflowRetry,
    PostgresPayloads,
    PostgresTaskMetrics,
    PostgresWorkerControl,
    PostgresExpiry,
    PostgresRetaining,
    PostgresFair,  # its claim first: a fair queue's, the others to the core's
    # Last: every capability above builds on the core.
    CoreMixin,
):
    """Every capability of a store, on PostgreSQL (see ``conveyor.store.protocols``)."""

    def session(self) -> PostgresSession:
        """Public access to this store's connections, transactions and migrations, for a
        layer built on top of it (Spark's storage) instead of its private members."""
        return PostgresSession(self)
