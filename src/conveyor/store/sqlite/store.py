"""The SQLite store: the embedded default, one file, nothing to install.

One connection per thread (sqlite3 connections must not be shared across
threads), WAL so readers never block the writer, and ``BEGIN IMMEDIATE`` for
every write so that each read-then-write happens under SQLite's single write
lock: that is what makes a claim atomic here, where PostgreSQL needs row locks.

The class is composed of one mixin per capability (``core.py`` for the
``JobStore`` every other builds on, ``operations.py``, ``insight.py``, ...),
over the connection plumbing of ``base.py``.
"""

from __future__ import annotations

from conveyor.store.boundary import translate_errors
from conveyor.store.sqlite.archive import ArchiveMixin
from conveyor.store.sqlite.audit import SQLiteAudit
from conveyor.store.sqlite.base import _away, _missing_table
from conveyor.store.sqlite.core import CoreMixin
from conveyor.store.sqlite.expiry import SQLiteExpiry
from conveyor.store.sqlite.fair import SQLiteFair
from conveyor.store.sqlite.holds import HoldsMixin
from conveyor.store.sqlite.insight import InsightMixin
from conveyor.store.sqlite.limit_keys import SQLiteLimitKeys
from conveyor.store.sqlite.limits import LimitsMixin
from conveyor.store.sqlite.metrics import SQLiteTaskMetrics
from conveyor.store.sqlite.operations import OperationsMixin
from conveyor.store.sqlite.outcomes import OutcomesMixin
from conveyor.store.sqlite.payloads import SQLitePayloads
from conveyor.store.sqlite.retaining import SQLiteRetaining
from conveyor.store.sqlite.session import SQLiteSession
from conveyor.store.sqlite.signals import SQLiteSignals
from conveyor.store.sqlite.steps import StepsMixin
from conveyor.store.sqlite.transactions import TransactionsMixin
from conveyor.store.sqlite.worker_control import SQLiteWorkerControl
from conveyor.store.sqlite.workflow_retry import SQLiteWorkflowRetry
from conveyor.store.sqlite.workflows import WorkflowsMixin


@translate_errors(_missing_table, _away)
class SQLiteStore(
    OperationsMixin,
    InsightMixin,
    LimitsMixin,
    WorkflowsMixin,
    HoldsMixin,
    OutcomesMixin,
    StepsMixin,
    SQLiteSignals,
    TransactionsMixin,
    ArchiveMixin,
    SQLiteAudit,
    SQLiteLimitKeys,
    SQLiteWorkflowRetry,
    SQLitePayloads,
    SQLiteTaskMetrics,
    SQLiteWorkerControl,
    SQLiteExpiry,
    SQLiteRetaining,
    SQLiteFair,  # its claim first: a fair queue's, the others to the core's
    # Last: every capability above builds on the core.
    CoreMixin,
):
    """Every capability of a store, in one SQLite file (see ``conveyor.store.protocols``)."""

    def session(self) -> SQLiteSession:
        """Public access to this store's connections, transactions and migrations, for a
        layer built on top of it (Spark's storage) instead of its private members."""
        return SQLiteSession(self)
