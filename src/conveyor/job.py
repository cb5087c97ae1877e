"""The job record, its states and the pure rules of DESIGN.md's state machine (no I/O)."""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from conveyor.errors import InvalidJobError

if TYPE_CHECKING:
    from conveyor.app import App

#: Longest queue, task, key, group or batch name, in characters.
MAX_NAME_LENGTH = 200
#: Largest encoded payload (args and kwargs together as JSON), in bytes. A job
#: queue is no place for blobs: store them elsewhere and enqueue a reference.
MAX_PAYLOAD_BYTES = 1024 * 1024

Unique = Literal["live", "forever"]


class JobState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
LIVE_STATES = frozenset({JobState.QUEUED, JobState.RUNNING})


class EventKind(enum.StrEnum):
    ENQUEUED = "enqueued"
    CLAIMED = "claimed"
    SUCCEEDED = "succeeded"
    RETRIED = "retried"  # failed attempt, queued again with backoff
    SNOOZED = "snoozed"  # handler asked to run again later; does not use up an attempt
    FAILED = "failed"
    CANCEL_REQUESTED = "cancel_requested"
    CANCELLED = "cancelled"
    RESCUED = "rescued"  # lease expired; queued again (or failed when out of attempts)
    RELEASED = "released"  # handed back on shutdown; does not use up an attempt
    MANUAL_RETRY = "manual_retry"
    RUN_NOW = "run_now"  # a scheduled or retrying job made due now by hand


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class NewJob:
    """A job about to be inserted: already validated and with its payload encoded."""

    queue: str
    task: str
    args_json: str
    kwargs_json: str
    run_at: datetime
    priority: int = 0
    max_attempts: int = 3
    key: str | None = None
    unique: Unique = "live"
    group: str | None = None
    batch: str | None = None


@dataclass(slots=True)
class Job:
    """One row of the jobs table, as read at one moment.

    ``args``, ``kwargs`` and ``result`` are decoded from JSON when read, so a
    job whose stored payload is not valid JSON can still be loaded, listed and
    failed with a clear error.
    """

    id: int
    queue: str
    task: str
    state: JobState
    args_json: str
    kwargs_json: str
    priority: int
    run_at: datetime
    attempts: int
    max_attempts: int
    created_at: datetime
    key: str | None = None
    group: str | None = None
    batch: str | None = None
    worker: str | None = None
    lease_token: str | None = None
    lease_expires_at: datetime | None = None
    cancel_requested: bool = False
    result_json: str | None = None
    error: str | None = None
    progress: float | None = None
    progress_message: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    _app: App | None = field(default=None, repr=False, compare=False)
    #: Set by an enqueue that found a live job holding its key (that job, returned
    #: instead of a new one). Not stored: False on any job read back later.
    existing: bool = field(default=False, repr=False, compare=False)

    @property
    def args(self) -> list[Any]:
        value = json.loads(self.args_json)
        if not isinstance(value, list):
            raise ValueError(f"job {self.id}: args are not a JSON array")
        return value

    @property
    def kwargs(self) -> dict[str, Any]:
        value = json.loads(self.kwargs_json)
        if not isinstance(value, dict):
            raise ValueError(f"job {self.id}: kwargs are not a JSON object")
        return value

    @property
    def result(self) -> Any:
        return None if self.result_json is None else json.loads(self.result_json)

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    def detailed_state(self, now: datetime | None = None) -> str:
        """The state as an operator reads it: a queued job is ready, scheduled or retrying."""
        return detailed_state(self.state, self.run_at, self.attempts, self.error, now or utcnow())

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the job is terminal; return its result.

        Raises JobFailed, JobCancelled or TimeoutError.
        """
        if self._app is None:
            raise RuntimeError("this Job is not attached to an App; use app.wait(job_id)")
        return self._app.wait(self.id, timeout=timeout)

    async def await_result(self, timeout: float | None = None) -> Any:
        """``wait()`` for async code: does not block the event loop."""
        if self._app is None:
            raise RuntimeError("this Job is not attached to an App; use app.await_result(job_id)")
        return await self._app.await_result(self.id, timeout=timeout)

    def refresh(self) -> Job:
        """Read the job again from the store."""
        if self._app is None:
            raise RuntimeError("this Job is not attached to an App; use app.get(job_id)")
        return self._app.get(self.id)


@dataclass(slots=True, frozen=True)
class Event:
    """One row of the append-only history."""

    seq: int
    job_id: int
    queue: str
    task: str
    kind: str
    attempt: int
    worker: str | None
    at: datetime
    error: str | None = None


# --- pure rules -------------------------------------------------------------


def validate_name(what: str, value: object, *, optional: bool = False) -> str | None:
    """Check a queue/task/key/group/batch name; raise InvalidJobError saying what is wrong."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise InvalidJobError(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidJobError(f"{what} must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidJobError(
            f"{what} is {len(value)} characters long; the limit is {MAX_NAME_LENGTH}"
        )
    if value != storable_text(value):
        raise InvalidJobError(
            f"{what} {value!r} contains a NUL character or a lone surrogate, "
            "which the databases cannot store"
        )
    return value


def storable_text(text: str) -> str:
    """``text`` as both databases can store it, for free text such as errors.

    PostgreSQL's text refuses NUL, SQLite's JSON functions cut a string at one,
    and a lone surrogate cannot be encoded as UTF-8 at all: NUL becomes U+FFFD
    and a lone surrogate its backslash escape, so nothing else is lost.
    """
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode()
    return text


# One encoder for every payload and result: json.dumps with options builds a
# new encoder on each call, which cost more than encoding a small payload.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def encode_json(what: str, value: Any) -> str:
    """Encode a value as strict JSON (no NaN), or raise InvalidJobError naming what failed."""
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidJobError(
            f"{what} must be JSON-serialisable: {exc}. "
            "Pass plain lists, dicts, strings, numbers, booleans and None."
        ) from None


def encode_payload(args: Any, kwargs: Any) -> tuple[str, str]:
    """Encode args and kwargs; enforce their types and the payload size limit."""
    if not isinstance(args, list | tuple):
        raise InvalidJobError(f"args must be a list or tuple, got {type(args).__name__}")
    if not isinstance(kwargs, dict):
        raise InvalidJobError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    for name in kwargs:
        if not isinstance(name, str):
            raise InvalidJobError(f"kwargs keys must be strings, got {name!r}")
    args_json = encode_json("args", list(args))
    kwargs_json = encode_json("kwargs", kwargs)
    size = len(args_json.encode()) + len(kwargs_json.encode())
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidJobError(
            f"payload is {size} bytes; the limit is {MAX_PAYLOAD_BYTES} bytes. "
            "Store large data elsewhere and enqueue a reference to it."
        )
    return args_json, kwargs_json


def resolve_run_at(
    now: datetime, delay: float | timedelta | None, run_at: datetime | None
) -> datetime:
    """When a new job becomes ready: ``run_at`` if given, else ``now + delay``."""
    if delay is not None and run_at is not None:
        raise InvalidJobError("give either delay or run_at, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise InvalidJobError(f"run_at must be a datetime, got {type(run_at).__name__}")
        if run_at.tzinfo is None:
            raise InvalidJobError("run_at must be timezone-aware (e.g. datetime.now(UTC))")
        return run_at.astimezone(UTC)
    if delay is None:
        return now
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        raise InvalidJobError(f"delay must be a number of seconds, got {type(delay).__name__}")
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidJobError(f"delay must be a finite number of seconds >= 0, got {seconds}")
    return now + timedelta(seconds=seconds)


def validate_max_attempts(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidJobError(f"max_attempts must be an integer >= 1, got {value!r}")
    return value


def validate_priority(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not -(2**31) < value < 2**31:
        raise InvalidJobError(f"priority must be a 32-bit integer, got {value!r}")
    return value


def state_after_failure(attempts: int, max_attempts: int, retryable: bool) -> JobState:
    """A failed attempt goes back to queued while attempts remain and the error is retryable."""
    return JobState.QUEUED if retryable and attempts < max_attempts else JobState.FAILED


# --- what an operator sees: queued jobs told apart ------------------------------

#: Due now: the next free worker takes it.
READY = "ready"
#: Queued to run later (a delay, a run_at, or a handler's Retry).
SCHEDULED = "scheduled"
#: Queued to run later after a failed attempt: waiting out its backoff.
RETRYING = "retrying"
#: The three kinds of queued job.
WAITING_STATES = (READY, SCHEDULED, RETRYING)
#: Every state a job is shown in, the queued ones told apart, in the order of a job's life.
DETAILED_STATES = (READY, SCHEDULED, RETRYING, "running", "succeeded", "failed", "cancelled")
#: What a filter may name: a state, or one of the kinds of queued job.
FILTER_STATES = ("queued", *DETAILED_STATES)


def detailed_state(
    state: str, run_at: datetime, attempts: int, error: str | None, now: datetime
) -> str:
    """``state``, with a queued job shown as ready, scheduled or retrying.

    The same rule as the stores' SQL (``detailed state`` in queries.sql): due
    later after an attempt that left an error is retrying; due later otherwise
    is scheduled; due now is ready.
    """
    if state != JobState.QUEUED:
        return str(state)
    if run_at <= now:
        return READY
    return RETRYING if error is not None and attempts > 0 else SCHEDULED


def base_state(state: str) -> JobState:
    """The stored state behind a detailed one (ready, scheduled and retrying are queued)."""
    return JobState.QUEUED if state in WAITING_STATES else JobState(state)
