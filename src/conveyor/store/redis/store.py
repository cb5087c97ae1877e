"""The Redis store: the same contract on Redis, for teams that run it already.

Every change of state is one Lua script (``scripts/<name>.lua``, with
``scripts/common.lua`` prepended), loaded once and run by EVALSHA: Redis runs
a script alone, so each claim, finish or cancel reads and writes as one atomic
step, events and wake-ups included. Reads that serve operators (listings,
counts, purges' selections) walk sorted-set indexes from Python; what the
worker's hot path and ``stats`` need is kept in counters and sets.

All keys share one prefix with a hash tag (``{conveyor}:``), so that on a
cluster they sit in one slot and a script may touch any of them.

A job whose hash cannot be read (deleted by hand, evicted, or lacking fields)
is dropped by whoever meets it in an index (``scripts/upkeep.lua``; the claim,
finish and enqueue hand it back and ``_drop`` drops it), so that it holds no
group, limit or count (docs/architecture.md, "Jobs that cannot be read").

The class is composed of one mixin per capability (``core.py`` for the
``JobStore`` every other builds on, ``operations.py``, ``insight.py``, ...),
over the client plumbing of ``base.py``.
"""

from __future__ import annotations

from conveyor.store.redis.audit import RedisAudit
from conveyor.store.redis.base import LAYOUT_VERSION
from conveyor.store.redis.core import CoreMixin
from conveyor.store.redis.durability import DurabilityMixin
from conveyor.store.redis.expiry import RedisExpiry
from conveyor.store.redis.fair import RedisFair
from conveyor.store.redis.holds import HoldsMixin
from conveyor.store.redis.insight import InsightMixin
from conveyor.store.redis.limit_keys import RedisLimitKeys
from conveyor.store.redis.limits import LimitsMixin
from conveyor.store.redis.metrics import RedisTaskMetrics
from conveyor.store.redis.operations import OperationsMixin
from conveyor.store.redis.outcomes import OutcomesMixin
from conveyor.store.redis.payloads import RedisPayloads
from conveyor.store.redis.repair import RedisRepair
from conveyor.store.redis.retaining import RedisRetaining
from conveyor.store.redis.signals import RedisSignals
from conveyor.store.redis.steps import StepsMixin
from conveyor.store.redis.worker_control import RedisWorkerControl
from conveyor.store.redis.workflow_retry import RedisWorkflowRetry
from conveyor.store.redis.workflows import WorkflowsMixin

#: LAYOUT_VERSION: the layout of keys this code reads and writes.
__all__ = ["LAYOUT_VERSION", "RedisStore"]


class RedisStore(
    # Before LimitsMixin, which it builds on (``stats`` reports the limits).
    OperationsMixin,
    InsightMixin,
    LimitsMixin,
    WorkflowsMixin,
    HoldsMixin,
    OutcomesMixin,
    StepsMixin,
    RedisSignals,
    DurabilityMixin,
    RedisAudit,
    RedisLimitKeys,
    RedisWorkflowRetry,
    RedisPayloads,
    RedisTaskMetrics,
    RedisWorkerControl,
    RedisExpiry,
    RedisRetaining,
    RedisRepair,
    RedisFair,  # its claim first: a fair queue's, the others to the core's
    # Last: every capability above builds on the core.
    CoreMixin,
):
    """Every capability of ``Store``, and DurabilityReport; not TransactionalStore (Redis
    has no transaction a caller could enqueue inside)."""
