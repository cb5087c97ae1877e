"""The job record, its states and the pure rules of the state machine (no I/O).

The state machine is described in docs/architecture.md.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol, TypeVar

from conveyor.errors import (
    ConfigurationError,
    EncryptedPayloadError,
    InvalidJobError,
    JobStateError,
)

#: What a job's stored arguments decode to: a list (args) or a dict (kwargs).
_Payload = TypeVar("_Payload")

#: Longest queue, task, key, group or batch name, in characters.
MAX_NAME_LENGTH = 200
#: Largest encoded payload (args and kwargs together as JSON), in bytes. A job
#: queue is no place for blobs: store them elsewhere and enqueue a reference.
MAX_PAYLOAD_BYTES = 1024 * 1024

#: Deepest nesting of lists and objects a payload or result may have: deeper
#: JSON than the decoder will read back would be stored and then never run.
MAX_JSON_DEPTH = 500
#: Largest encoded headers of a job (a JSON object of strings), in bytes: room for
#: trace context and a few ids, not for data.
MAX_HEADERS_BYTES = 16 * 1024
#: Largest max_attempts: the databases keep attempts in a 32-bit integer.
MAX_ATTEMPTS_LIMIT = 2**31 - 1
#: The largest job id (the stores' 64-bit integer column).
MAX_JOB_ID = 2**63 - 1
#: The priorities a job may have: every 32-bit integer (the stores' integer column).
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1
#: No job may be due later than this: times up to the end of year 9999 are all
#: that Python's datetime (and so every reader of the store) can represent.
MAX_RUN_AT = datetime(9999, 1, 1, tzinfo=UTC)
#: Where a held job's run_at is parked: no job may otherwise be due then, and a
#: claim takes due jobs only, so no worker starts a held job.
HOLD_AT = MAX_RUN_AT


def seconds_later(now: datetime, seconds: float) -> datetime:
    """``now`` plus ``seconds``, or MAX_RUN_AT when that is past what a datetime holds."""
    try:
        return now + timedelta(seconds=seconds)
    except OverflowError:
        return MAX_RUN_AT


#: How an encrypted value begins (see conveyor.encryption): a JSON string, so the
#: json columns of PostgreSQL take it, opening with an escaped slash, which no JSON
#: our encoder writes ever holds (it never escapes "/"): a clear value is never
#: mistaken for an encrypted one.
SEALED_PREFIX = '"\\/fernet:'

Unique = Literal["live", "forever"]
AfterFailure = Literal["cancel", "run"]
OnConflict = Literal["answer", "replace"]


class JobState(enum.StrEnum):
    #: Enqueued after other jobs (``after=``) that have not all succeeded yet:
    #: never claimed; queued by the finish of the last of them.
    WAITING = "waiting"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
LIVE_STATES = frozenset({JobState.WAITING, JobState.QUEUED, JobState.RUNNING})


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
    HELD = "held"  # a queued job held back by an operator: no worker claims it
    UNHELD = "unheld"  # a held job let go: due at the run_at it had (or now)
    # Redis only: the job's data was gone (its hash deleted or evicted) or incomplete,
    # and its index entries were dropped; the job is in no state any more.
    DROPPED = "dropped"
    # The last job it waited for succeeded (``after=``): waiting -> queued.
    READY = "ready"
    # A queued job's arguments, run_at and priority replaced by an enqueue of its
    # key (on_conflict="replace", debounce=).
    REPLACED = "replaced"


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
    #: The key a per-key limit of the queue counts this job under (see limits.py).
    limit_key: str | None = None
    #: The key a fair queue's turns count this job under when it is not its
    #: limit_key (store/fair.py): None to go by limit_key, "" for the shared key.
    fair_key: str | None = None
    #: Metadata for the worker side (trace context, a request id): strings by name.
    headers: dict[str, str] | None = None
    #: Ids of stored jobs this one waits for (see docs/workflows.md).
    after: tuple[int, ...] = ()
    #: Positions of earlier jobs of the same insert this one waits for: a graph
    #: enqueued at once, each node naming only nodes before it (so no cycle).
    after_new: tuple[int, ...] = ()
    #: What a parent that fails or is cancelled does to this job: "cancel" it,
    #: or "run" it anyway once every parent has ended.
    after_failure: AfterFailure = "cancel"
    #: The moment by which the job must have started, or None: see expiry.py.
    expires_at: datetime | None = None
    #: How long the job is kept once finished, by final state (JSON; retain.py), or None.
    retain: str | None = None
    #: A key's window (unique.py): the finished states that also hold the key (None:
    #: as ``unique`` says), and the earliest creation time of a job that does.
    unique_states: tuple[str, ...] | None = None
    unique_since: datetime | None = None
    #: With a key: "replace" updates the queued job holding it in place (its args,
    #: run_at and priority); a running one gives its key to a new job (replace.py).
    on_conflict: OnConflict = "answer"

    @property
    def waits(self) -> bool:
        """Whether this job names jobs it waits for."""
        return bool(self.after or self.after_new)

    def headers_text(self) -> str | None:
        """The headers as stored: a JSON object, or None when there are none."""
        return _ENCODER.encode(self.headers) if self.headers else None


class JobSource(Protocol):
    """Where a Job can be read again and waited for: the App it came from.

    A protocol, so that these rules at the bottom of the package never import
    the App above them.
    """

    def get(self, job_id: int) -> Job: ...

    def wait(
        self,
        job_id: int,
        timeout: float | None = None,
        *,
        on_progress: Callable[[float | None, str | None], None] | None = None,
    ) -> Any: ...

    async def await_result(self, job_id: int, timeout: float | None = None) -> Any: ...

    @property
    def durable(self) -> Any: ...


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
    limit_key: str | None = None
    #: The job's headers as stored (a JSON object of strings), or None: see ``headers``.
    headers_json: str | None = None
    _app: JobSource | None = field(default=None, repr=False, compare=False)
    #: Set by an enqueue that found a live job holding its key (that job, returned
    #: instead of a new one). Not stored: False on any job read back later.
    existing: bool = field(default=False, repr=False, compare=False)

    @property
    def args(self) -> list[Any]:
        if self.args_json == "[]":  # most jobs of many tasks: no decoding
            return []
        return self._arguments(self.args_json, list, "args are not a JSON array")

    @property
    def kwargs(self) -> dict[str, Any]:
        if self.kwargs_json == "{}":
            return {}
        return self._arguments(self.kwargs_json, dict, "kwargs are not a JSON object")

    def _arguments(self, text: str, kind: type[_Payload], wrong: str) -> _Payload:
        """Stored arguments decoded, refused (``wrong`` says why) unless a ``kind``."""
        value = decode_stored(text, f"job {self.id}'s arguments", plural=True)
        if not isinstance(value, kind):
            raise ValueError(f"job {self.id}: {wrong}")
        return value

    @property
    def headers(self) -> dict[str, str]:
        """Metadata given at enqueue (by the caller or a middleware): strings by name."""
        if self.headers_json is None:
            return {}
        value = json.loads(self.headers_json)
        if not isinstance(value, dict):
            raise ValueError(f"job {self.id}: headers are not a JSON object")
        return value

    @property
    def result(self) -> Any:
        if self.result_json is None:
            return None
        return decode_stored(self.result_json, f"job {self.id}'s result")

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def held(self) -> bool:
        """Held back by an operator (``app.hold``): queued, and no worker claims it."""
        return self.state == JobState.QUEUED and self.run_at >= HOLD_AT

    def detailed_state(self, now: datetime | None = None) -> str:
        """The state as an operator reads it: a queued job is ready, scheduled or retrying."""
        return detailed_state(self.state, self.run_at, self.attempts, self.error, now or utcnow())

    def wait(
        self,
        timeout: float | None = None,
        *,
        on_progress: Callable[[float | None, str | None], None] | None = None,
    ) -> Any:
        """Block until the job is terminal; return its result.

        Raises JobFailed, JobCancelled or TimeoutError. ``on_progress(fraction,
        message)`` hears the handler's progress at once when it runs in this
        process.
        """
        return self._attached("app.wait(job_id)").wait(
            self.id, timeout=timeout, on_progress=on_progress
        )

    async def await_result(self, timeout: float | None = None) -> Any:
        """``wait()`` for async code: does not block the event loop."""
        return await self._attached("app.await_result(job_id)").await_result(
            self.id, timeout=timeout
        )

    def refresh(self) -> Job:
        """Read the job again from the store."""
        return self._attached("app.get(job_id)").get(self.id)

    def waiting(self) -> Any:
        """What the job waits for, read now, when a wait parked it (``ctx.sleep``,
        ``ctx.wait_for``, ``ctx.wait``): a ``Waiting`` (the signal or the children, or
        neither for a sleep; the step; until when), else None."""
        port = self._attached("app.durable").durable
        return None if port is None else port.job_waiting(self.id)

    def _attached(self, instead: str) -> JobSource:
        """The App this job was read through; refused, naming the call to use
        ``instead``, for a job built or unpickled without one."""
        if self._app is None:
            raise ConfigurationError(f"this Job is not attached to an App; use {instead}")
        return self._app


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


def is_sealed(text: str | None) -> bool:
    """Whether a stored value is encrypted (see conveyor.encryption)."""
    return text is not None and text.startswith(SEALED_PREFIX)


def decode_stored(text: str, what: str, *, plural: bool = False) -> Any:
    """A stored JSON value decoded; EncryptedPayloadError when it is still encrypted.

    An App given the keys opens what it reads before anyone decodes it, so a
    value still encrypted here is one that no key of this process opens.
    """
    if text.startswith(SEALED_PREFIX):
        raise EncryptedPayloadError(
            f"{what} {'are' if plural else 'is'} encrypted and no encryption key given to this "
            f"process opens {'them' if plural else 'it'} (App(encryption_keys=...) or "
            "CONVEYOR_ENCRYPTION_KEYS, newest first)"
        )
    return json.loads(text)


# One encoder for every payload and result: json.dumps with options builds a
# new encoder on each call, which cost more than encoding a small payload.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def encode_json(what: str, value: Any) -> str:
    """Encode a value as strict JSON (no NaN), or raise InvalidJobError naming what failed."""
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidJobError(
            f"{what} must be JSON-serialisable: {exc}. "
            "Pass plain lists, dicts, strings, numbers, booleans and None."
        ) from None
    except RecursionError:
        raise InvalidJobError(
            f"{what} is nested too deeply to encode (the limit is {MAX_JSON_DEPTH} levels)"
        ) from None
    # Counting brackets is cheap; only text with that many looks at its real depth.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and json_depth(text) > MAX_JSON_DEPTH:
        raise InvalidJobError(
            f"{what} is nested {json_depth(text)} levels deep; the limit is {MAX_JSON_DEPTH}, "
            "so that every worker can read it back"
        )
    return text


_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def json_depth(text: str) -> int:
    """How deeply lists and objects nest in JSON text (strings skipped)."""
    depth = deepest = 0
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


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
    check_payload_size(args_json, kwargs_json)
    return args_json, kwargs_json


def check_headers(headers: object) -> dict[str, str] | None:
    """Check a job's headers (a dict of non-empty string names to strings); None when empty."""
    if headers is None:
        return None
    if not isinstance(headers, dict):
        raise InvalidJobError(f"headers must be a dict of strings, got {type(headers).__name__}")
    for name, value in headers.items():
        if not isinstance(name, str) or not name:
            raise InvalidJobError(f"header names must be non-empty strings, got {name!r}")
        if not isinstance(value, str):
            raise InvalidJobError(
                f"header {name!r} must be a string, got {type(value).__name__} "
                "(encode numbers and ids as text)"
            )
        if name != storable_text(name) or value != storable_text(value):
            raise InvalidJobError(
                f"header {name!r} contains a NUL character or a lone surrogate, "
                "which the databases cannot store"
            )
    if not headers:
        return None
    size = len(_ENCODER.encode(headers).encode())
    if size > MAX_HEADERS_BYTES:
        raise InvalidJobError(
            f"headers are {size} bytes as JSON; the limit is {MAX_HEADERS_BYTES} bytes "
            "(headers carry ids and trace context; put data in the arguments)"
        )
    return dict(headers)


def check_payload_size(args_json: str, kwargs_json: str) -> None:
    size = len(args_json.encode()) + len(kwargs_json.encode())
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidJobError(
            f"payload is {size} bytes; the limit is {MAX_PAYLOAD_BYTES} bytes. "
            "Store large data elsewhere and enqueue a reference to it."
        )


def resolve_run_at(
    now: datetime, delay: float | timedelta | None, run_at: datetime | None
) -> datetime:
    """When a new job becomes ready: ``run_at`` if given, else ``now + delay``.

    Refuses times that the store could hold but not give back (past year 9999).
    """
    if delay is not None and run_at is not None:
        raise InvalidJobError("give either delay or run_at, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise InvalidJobError(f"run_at must be a datetime, got {type(run_at).__name__}")
        if run_at.tzinfo is None:
            raise InvalidJobError("run_at must be timezone-aware (e.g. datetime.now(UTC))")
        try:
            when = run_at.astimezone(UTC)
        except OverflowError:
            raise InvalidJobError(f"run_at {run_at.isoformat()} is out of range") from None
        if when >= MAX_RUN_AT:
            raise InvalidJobError(
                f"run_at {run_at.isoformat()} is too far ahead: jobs must be due before "
                f"{MAX_RUN_AT.isoformat()}"
            )
        return when
    if delay is None:
        return now
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        raise InvalidJobError(f"delay must be a number of seconds, got {type(delay).__name__}")
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidJobError(f"delay must be a finite number of seconds >= 0, got {seconds}")
    when = seconds_later(now, seconds)
    if when >= MAX_RUN_AT:
        raise InvalidJobError(
            f"delay of {seconds} seconds is too long: jobs must be due before "
            f"{MAX_RUN_AT.isoformat()}"
        )
    return when


def is_job_id(value: object) -> bool:
    """Whether ``value`` is an int a job's id can be (1 to MAX_JOB_ID; not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_JOB_ID


def validate_max_attempts(value: object) -> int:
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or not 1 <= value <= MAX_ATTEMPTS_LIMIT
    ):
        raise InvalidJobError(
            f"max_attempts must be an integer from 1 to {MAX_ATTEMPTS_LIMIT}, got {value!r}"
        )
    return value


def validate_new_job(job: NewJob) -> NewJob:
    """Check a prepared NewJob (the bulk path) by the same rules as an enqueue."""
    validate_name("queue", job.queue)
    validate_name("task name", job.task)
    for what, value in (
        ("key", job.key),
        ("group", job.group),
        ("batch", job.batch),
        ("limit_key", job.limit_key),
    ):
        validate_name(what, value, optional=True)
    if job.fair_key:  # "" is the shared key
        validate_name("fair_key", job.fair_key)
    validate_max_attempts(job.max_attempts)
    validate_priority(job.priority)
    resolve_run_at(job.run_at, None, job.run_at)
    if job.expires_at is not None and (
        job.expires_at.tzinfo is None or job.expires_at <= job.run_at
    ):
        raise InvalidJobError("expires_at must be an aware datetime later than run_at")
    if job.unique not in ("live", "forever"):
        raise InvalidJobError(f"unique must be 'live' or 'forever', got {job.unique!r}")
    if job.unique_states is not None and not set(job.unique_states) <= TERMINAL_STATES:
        raise InvalidJobError("unique_states must name finished states only")
    job.headers = check_headers(job.headers)
    for what, text, kind in (("args", job.args_json, list), ("kwargs", job.kwargs_json, dict)):
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            raise InvalidJobError(f"{what} must be JSON text, got {text[:80]!r}") from None
        if not isinstance(value, kind):
            raise InvalidJobError(f"{what} must be a JSON {'array' if kind is list else 'object'}")
    check_payload_size(job.args_json, job.kwargs_json)
    for what, text in (("args", job.args_json), ("kwargs", job.kwargs_json)):
        if text.count("[") + text.count("{") > MAX_JSON_DEPTH and json_depth(text) > MAX_JSON_DEPTH:
            raise InvalidJobError(f"{what} are nested deeper than {MAX_JSON_DEPTH} levels")
    return job


def validate_priority(value: object) -> int:
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or not MIN_PRIORITY <= value <= MAX_PRIORITY
    ):
        raise InvalidJobError(
            f"priority must be a 32-bit integer ({MIN_PRIORITY} to {MAX_PRIORITY}), got {value!r}"
        )
    return value


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
DETAILED_STATES = (
    "waiting",
    READY,
    SCHEDULED,
    RETRYING,
    "running",
    "succeeded",
    "failed",
    "cancelled",
)
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


def retry_refusal(job: Job) -> JobStateError:
    """Why a manual retry of ``job`` changed nothing (every store's words, written once)."""
    if job.state in (JobState.FAILED, JobState.CANCELLED):
        return JobStateError(
            f"job {job.id} cannot be retried: its key {job.key!r} in queue {job.queue!r} "
            "belongs to a live or a newer job"
        )
    return JobStateError(
        f"job {job.id} is {job.state}; only failed or cancelled jobs can be retried"
    )


#: How a parent ended without succeeding, or went: the resolutions of an edge
#: that do not let its child run (unless it runs anyway). 'deleted': an
#: operator deleted it (an edge onto a parent that had ended says so too, once
#: the parent is deleted); 'dropped': its data was deleted or evicted behind
#: conveyor's back (Redis).
PARENT_LOST_HOW = {
    "failed": "failed",
    "cancelled": "was cancelled",
    "deleted": "was deleted",
    "dropped": "was dropped (its data was deleted or evicted)",
}


def lost_parent_error(parent: int, how: str) -> str:
    """The error of a job a parent did not succeed for (``how``: a key of PARENT_LOST_HOW)."""
    return f"job {parent}, which this job waits for, {PARENT_LOST_HOW[how]}"
