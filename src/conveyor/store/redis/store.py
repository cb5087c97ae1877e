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
"""

from __future__ import annotations

import heapq
import itertools
import json
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from conveyor.errors import ConfigurationError, StoreUnavailableError
from conveyor.job import HOLD_AT, Event, EventKind, Job, JobState, NewJob
from conveyor.limits import Limit, QueueLimits
from conveyor.store.flows import DROPPED, GONE, check_order, unknown_parent
from conveyor.store.keys import new_job_record
from conveyor.store.limiting import LIMIT_SLACK_SECONDS, limit_status, limits_of_row
from conveyor.store.protocols import ChangeCallback, Subscription
from conveyor.store.records import (
    LEASE_EXPIRED_ERROR,
    TAKEN_BACK_ERROR,
    BatchStatus,
    EventCounts,
    EventOffset,
    Finish,
    FinishedCount,
    JobSelection,
    Lease,
    LeaseStatus,
    LimitStatus,
    QueueStats,
    Relative,
    RunTimeBucket,
    Stats,
    Step,
    WorkerInfo,
    WorkflowInfo,
)
from conveyor.store.redis.history import (
    PurgeWalks,
    beyond_newest,
    count_matching,
    run_times,
    slot_counts,
)
from conveyor.store.redis.listener import RedisListener
from conveyor.store.selection import NO_ID_BOUND, args_floor

#: The layout of keys this code reads and writes (``schema_version`` on Redis). 2: a
#: queue's running set scored by lease expiry (no ``leases`` set); events in one field.
LAYOUT_VERSION = 2
DEFAULT_PREFIX = "{conveyor}:"
TERMINAL = ("succeeded", "failed", "cancelled")
_STATES = ("waiting", "queued", "running", *TERMINAL)
#: Keys of one index read per round trip when Python walks it.
_CHUNK = 500
#: The fields every job's hash has (REQUIRED in upkeep.lua): one without them cannot be read.
_REQUIRED = (
    "id", "queue", "task", "state", "args", "kwargs", "priority", "run_at", "attempts",
    "max_attempts", "created_at",
)  # fmt: skip
#: The sweep of dropped jobs' ids (job_sweep_lost.lua), run after each rescue while one
#: is due: keys a slice (a script of about 2 ms at 2,000), seconds of slices a rescue.
_SWEEP_KEYS = 2_000
_SWEEP_SECONDS = 0.05
#: Where a walk met an id: the queue and state of its index ("finished": a terminal
#: state), None when the index does not say.
_Where = tuple[str | None, str | None]
_T = TypeVar("_T")


def _load_scripts() -> dict[str, str]:
    """Each operation's script with common.lua before it, and upkeep.lua when it says
    it uses it (the others hand the jobs they could not read back: see _drop)."""
    folder = resources.files("conveyor.store.redis").joinpath("scripts")
    common = folder.joinpath("common.lua").read_text(encoding="utf-8")
    upkeep = folder.joinpath("upkeep.lua").read_text(encoding="utf-8")
    # Workflows' functions: for the scripts that say so, and those with upkeep.lua
    # (whose delete forgets a job's edges).
    flows = folder.joinpath("flows.lua").read_text(encoding="utf-8")
    scripts = {}
    for entry in folder.iterdir():
        if not entry.name.endswith(".lua") or entry.name in (
            "common.lua",
            "upkeep.lua",
            "flows.lua",
        ):
            continue
        text = entry.read_text(encoding="utf-8")
        if "\n-- uses upkeep.lua\n" in text:
            parts = [common, flows, upkeep, text]
        elif "\n-- uses flows.lua\n" in text:
            parts = [common, flows, text]
        else:
            parts = [common, text]
        scripts[entry.name[: -len(".lua")]] = "\n".join(parts)
    return scripts


_SCRIPTS = _load_scripts()


def _ts(value: datetime) -> str:
    """A moment as the scripts take it: epoch seconds, six decimals."""
    return f"{value.timestamp():.6f}"


def _now_arg(value: datetime | None) -> str:
    """'' asks the script for Redis's own clock (TIME)."""
    return "" if value is None else _ts(value)


def _dt(value: str | float) -> datetime:
    return datetime.fromtimestamp(float(value), UTC)


def _odt(value: str | float | None) -> datetime | None:
    return None if value is None else _dt(value)


def _nm(name: str) -> str:
    """A name inside a key, as common.lua writes it: "<byte length>.<name>"."""
    return f"{len(name.encode())}.{name}"


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {str(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}


def job_of(fields: dict[str, str]) -> Job:
    progress = fields.get("progress")
    # The hash keeps its last lease after the attempt ends (fewer writes): a lease
    # is only ever shown, and checked, while the job runs.
    leased = fields["state"] == "running"
    return Job(
        id=int(fields["id"]),
        queue=fields["queue"],
        task=fields["task"],
        state=JobState(fields["state"]),
        args_json=fields["args"],
        kwargs_json=fields["kwargs"],
        priority=int(fields["priority"]),
        run_at=_dt(fields["run_at"]),
        attempts=int(fields["attempts"]),
        max_attempts=int(fields["max_attempts"]),
        created_at=_dt(fields["created_at"]),
        key=fields.get("key"),
        group=fields.get("group_key"),
        batch=fields.get("batch"),
        worker=fields.get("worker"),
        lease_token=fields.get("lease_token") if leased else None,
        lease_expires_at=_odt(fields.get("lease_expires_at")) if leased else None,
        cancel_requested=fields.get("cancel_requested") == "1",
        result_json=fields.get("result"),
        error=fields.get("error"),
        progress=None if progress is None else float(progress),
        progress_message=fields.get("progress_message"),
        started_at=_odt(fields.get("started_at")),
        finished_at=_odt(fields.get("finished_at")),
        limit_key=fields.get("limit_key"),
        headers_json=fields.get("headers"),
    )


def _step_of(name: str, value: str) -> Step:
    """A step as step_record.lua keeps it: JSON [result, attempt, started_at, finished_at]."""
    result, attempt, started_at, finished_at = json.loads(value)
    return Step(name, result, int(attempt), _dt(started_at), _dt(finished_at))


def _readable(fields: dict[str, str]) -> bool:
    """Whether a job's hash holds every field a job has (an empty one: deleted or evicted)."""
    return all(name in fields for name in _REQUIRED)


#: The job's fields that name its running attempt, for event_list.
_RUNNING_ATTEMPT = ("state", "queue", "task", "attempts", "worker", "started_at")


def _history(
    job_id: int, entries: list[tuple[str, dict[str, str]]], running: list[str | None]
) -> list[Event]:
    """A job's history, every attempt with its start, as event_list in shared.sql
    gives it on the SQL stores: an event that ended an attempt carries the
    attempt's start, shown as a "claimed" event with that event's seq, right
    after the last event before it other than a cancel request; the running
    attempt's (``running``: the job's _RUNNING_ATTEMPT fields) comes from the
    job itself, with the seq of the job's last event."""
    history: list[Event] = []
    after_last = 0  # where a claim goes: after the last event other than a cancel request
    for entry in entries:
        event, started = _event_and_start(entry)
        if started is not None:
            claim = replace(event, kind=EventKind.CLAIMED, at=_dt(started), error=None)
            history.insert(after_last, claim)
        history.append(event)
        if event.kind != EventKind.CANCEL_REQUESTED:
            after_last = len(history)
    state, queue, task, attempts, worker, started_at = running
    if state == JobState.RUNNING and queue and task and attempts and started_at:
        seq = history[-1].seq if history else 0
        claim = Event(seq, job_id, queue, task, EventKind.CLAIMED, int(attempts), worker,
                      _dt(started_at))  # fmt: skip
        history.insert(after_last, claim)
    return history


def _event_of(entry: tuple[str, dict[str, str]]) -> Event:
    return _event_and_start(entry)[0]


def _event_and_start(entry: tuple[str, dict[str, str]]) -> tuple[Event, str | None]:
    """A stream entry: one field "e", the JSON array [job id, queue, task, kind, attempt,
    at, worker, error, started] without its trailing nulls (common.lua's event; started:
    the start of the attempt the event ends); entries of the first layout name each
    field. The event, and that start."""
    entry_id, f = entry
    seq = int(entry_id.split("-", 1)[0])
    if "e" in f:
        e = [*json.loads(f["e"]), None, None, None]
        event = Event(seq, int(e[0]), e[1], e[2], e[3], int(e[4]), e[6], _dt(e[5]), e[7])
        return event, e[8]
    return Event(
        seq=seq,
        job_id=int(f["job_id"]),
        queue=f["queue"],
        task=f["task"],
        kind=f["kind"],
        attempt=int(f["attempt"]),
        worker=f.get("worker"),
        at=_dt(f["at"]),
        error=f.get("error"),
    ), None


def _new_job_json(job: NewJob) -> list[str | None]:
    return [
        job.queue,
        job.task,
        job.args_json,
        job.kwargs_json,
        str(job.priority),
        _ts(job.run_at),
        str(job.max_attempts),
        job.key,
        job.unique,
        job.group,
        job.batch,
        job.limit_key,
        job.headers_text(),
    ]


class _WorkflowTaken(Exception):
    """job_insert_many found the workflow's id taken: the ids of its jobs."""

    def __init__(self, ids: list[int]) -> None:
        super().__init__(ids)
        self.ids = ids


def flow_link_json(job: NewJob, workflow: str) -> list[Any] | None:
    """What job_insert_many links a job with (flows.lua): None when it waits for nothing."""
    if not job.waits and not workflow:
        return None
    return [[str(p) for p in job.after], list(job.after_new), job.after_failure]


def split_prefix(dsn: str) -> tuple[str, str | None]:
    """A Redis DSN without its ``prefix`` query parameter, and that prefix (None: none)."""
    parts = urlsplit(dsn)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    prefixes = [value for name, value in pairs if name == "prefix"]
    if not prefixes:
        return dsn, None
    if len(prefixes) > 1:
        raise ConfigurationError("the Redis DSN gives prefix= twice: keep one")
    rest = urlencode([(name, value) for name, value in pairs if name != "prefix"])
    return urlunsplit(parts._replace(query=rest)), prefixes[0]


def redis_where(dsn: str) -> str:
    """host:port (or the socket path) of a Redis DSN, for messages; never the password."""
    parts = urlsplit(dsn)
    if parts.scheme == "unix":
        if not parts.path:
            raise ConfigurationError(
                "malformed Redis DSN: a unix:// DSN needs the socket's path "
                "(use unix:///path/to/redis.sock?db=0)"
            )
        return parts.path
    try:
        port = parts.port or 6379
    except ValueError:
        raise ConfigurationError(
            "malformed Redis DSN: the port is not a number between 0 and 65535 "
            "(use redis://[user:password@]host:port/db)"
        ) from None
    db = parts.path.strip("/")
    if db and not db.isdigit():
        # redis-py would quietly use database 0: jobs would land where nobody looks.
        raise ConfigurationError(
            f"malformed Redis DSN: the database {db!r} is not a number "
            "(use redis://[user:password@]host:port/db, db 0 to 15 by default)"
        )
    return f"{parts.hostname or 'localhost'}:{port}"


#: What Redis answers when it cannot take writes for now: over its maxmemory
#: (noeviction), a failed save or append-only write (a full disk: stop-writes-on-
#: bgsave-error, or the AOF), a replica after a failover.
_SHORT_OF_ROOM = ("OOM command not allowed", "MISCONF ", "READONLY ")


def _short_of_room(exc: redis.ResponseError) -> str | None:
    """Why Redis refused a write for now (an outage, not a refusal of the data), or None.

    A script's first write is refused before any other of it is made (Redis
    checks memory and disk before a script's first write, and neither changes
    while a script runs), so nothing was written and the call may be made again.
    redis-py reads OOM and READONLY replies as their own classes, without the
    code in the text; a pipeline prefixes the text of the command that failed.
    """
    text = str(exc)
    if isinstance(exc, (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError)) or any(
        code in text for code in _SHORT_OF_ROOM
    ):
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        return f"cannot take writes for now ({type(exc).__name__}: {first})"
    return None


class RedisStore:
    """Every capability of base.Store, and DurabilityReport; not TransactionalStore (Redis
    has no transaction a caller could enqueue inside)."""

    def __init__(
        self,
        dsn: str,
        *,
        migrate: bool = False,
        connect_timeout: float = 10.0,
        socket_timeout: float = 30.0,
        prefix: str | None = None,
    ) -> None:
        # The prefix may be in the DSN (?prefix=...), so that every command that
        # takes only --dsn reaches the same application's keys.
        dsn, in_dsn = split_prefix(dsn)
        if prefix is not None and in_dsn is not None and prefix != in_dsn:
            raise ConfigurationError(
                f"two prefixes: {in_dsn!r} in the DSN and {prefix!r} given: keep one"
            )
        prefix = prefix if prefix is not None else in_dsn or DEFAULT_PREFIX
        if (
            not isinstance(prefix, str)
            or not 0 < len(prefix) <= 100
            or any(c.isspace() for c in prefix)
        ):
            raise ConfigurationError(
                f"prefix must be 1 to 100 characters without spaces, such as '{{myapp}}:' "
                f"(the braces keep an App's keys in one cluster slot), got {prefix!r}"
            )
        self.dsn = dsn
        self.where = redis_where(dsn)
        self.description = f"Redis at {self.where}"
        if prefix != DEFAULT_PREFIX:
            self.description += f" (prefix {prefix})"
        self.prefix = prefix
        try:
            # Any: redis-py's replies are typed loosely (bytes | str | ...); with
            # decode_responses they are str, and the methods below say what they read.
            self._client: Any = redis.Redis.from_url(
                dsn,
                decode_responses=True,
                socket_connect_timeout=connect_timeout,
                socket_timeout=socket_timeout,
                # No silent retries: a script whose reply was lost may have run,
                # and running it twice (an enqueue) would do it twice. Callers
                # that retry (the worker) get StoreUnavailableError and decide.
                retry=Retry(NoBackoff(), 0),
                health_check_interval=30,
            )
        except ValueError as exc:
            raise ConfigurationError(f"malformed Redis DSN: {exc}") from None
        self._scripts = {
            name: self._client.register_script(text) for name, text in _SCRIPTS.items()
        }
        #: Where each retention rule's walk of finished jobs goes on (history.py).
        self._purge_walks = PurgeWalks()
        self.ping()
        if migrate:
            self.migrate()

    # --- connection -------------------------------------------------------------

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """redis-py's connection errors become StoreUnavailableError at the store's boundary."""
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            reason = str(exc).strip() or type(exc).__name__
            raise StoreUnavailableError(
                f"cannot reach Redis at {self.where}: {reason}. "
                "Is the server running, and is the DSN right?"
            ) from exc
        except redis.AuthenticationError as exc:  # pragma: no cover - a subclass above
            raise StoreUnavailableError(f"Redis at {self.where} refused us: {exc}") from exc
        except redis.ResponseError as exc:
            short = _short_of_room(exc)
            if short is None:
                raise
            raise StoreUnavailableError(f"{self.description} {short}") from exc

    def _do(self, call: Callable[[], _T]) -> _T:
        with self._guard():
            return call()

    def _run(self, name: str, *args: Any) -> Any:
        with self._guard():
            return self._scripts[name](keys=[self.prefix], args=list(args), client=self._client)

    def _k(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def close(self) -> None:
        self._client.close()

    def ping(self) -> None:
        self._do(self._client.ping)

    def persistence(self) -> dict[str, str] | None:
        """The server's persistence and eviction settings; None if CONFIG is off."""
        try:
            with self._guard():
                found: dict[str, str] = {}
                for name in ("appendonly", "appendfsync", "save", "maxmemory", "maxmemory-policy"):
                    found.update(self._client.config_get(name))
                return found
        except redis.ResponseError:
            return None  # CONFIG renamed or disabled (managed Redis services)

    def durability(self) -> tuple[str, str | None]:
        """The persistence settings in words, and a warning when jobs could be lost."""
        found = self.persistence()  # one read of the settings for both checks
        said, warning = self._durability(found)
        evicts = self._eviction_warning(found or {})
        if evicts:
            warning = f"{warning}; {evicts}" if warning else evicts
        return said, warning

    def _eviction_warning(self, found: dict[str, str]) -> str | None:
        """A warning when a full Redis would delete keys (jobs among them) to make room."""
        policy = found.get("maxmemory-policy", "noeviction")
        if found.get("maxmemory", "0") in ("0", "") or policy == "noeviction":
            return None
        return (
            f"Redis at {self.where} has maxmemory-policy {policy}: when its memory fills it "
            "deletes keys, jobs among them; set maxmemory-policy noeviction"
        )

    def _durability(self, found: dict[str, str] | None) -> tuple[str, str | None]:
        if found is None:
            return "persistence unknown", (
                f"cannot read the persistence settings of Redis at {self.where} (CONFIG is "
                "disabled): make sure it runs with appendonly yes, or a restart loses jobs"
            )
        aof = found.get("appendonly", "?")
        fsync = found.get("appendfsync", "?")
        save = found.get("save", "").strip()
        said = f"appendonly {aof}, appendfsync {fsync}, save {save or 'off'}"
        if aof != "yes" and not save:
            return said, (
                f"persistence is OFF on Redis at {self.where}: a restart of Redis loses "
                "every job; run it with appendonly yes (appendfsync everysec or always)"
            )
        if aof != "yes":
            return said, (
                f"Redis at {self.where} only takes snapshots (save {save}): a crash loses the "
                "jobs written since the last one; run it with appendonly yes"
            )
        if fsync == "no":
            return said, (
                f"Redis at {self.where} has appendfsync no: a crash of its host can lose "
                "the last 30 seconds or so of acknowledged writes; use everysec or always"
            )
        return said, None

    # --- layout version -----------------------------------------------------------

    def schema_version(self) -> int:
        value = self._do(lambda: self._client.hget(self._k("meta"), "layout"))
        return int(value) if value else 0

    def schema_latest(self) -> int:
        return LAYOUT_VERSION

    def migrate(self) -> int:
        current = self.schema_version()
        if current > LAYOUT_VERSION:
            raise ConfigurationError(
                f"Redis at {self.where} holds key layout {current}, newer than this "
                f"conveyor's ({LAYOUT_VERSION}): upgrade conveyor"
            )
        if current == 1:
            self._run("layout_2")
        self._do(lambda: self._client.hset(self._k("meta"), "layout", str(LAYOUT_VERSION)))
        return LAYOUT_VERSION

    # --- producing ------------------------------------------------------------

    def job_insert_many(
        self, jobs: Sequence[NewJob], now: datetime, connection: Any = None
    ) -> list[Job]:
        if connection is not None:
            raise ConfigurationError(
                "enqueue inside a caller's transaction needs SQLite or PostgreSQL; "
                "Redis has no transaction to join"
            )
        if not jobs:
            return []
        return self._insert(jobs, now)

    def _insert(
        self, jobs: Sequence[NewJob], now: datetime, workflow: str = "", name: str = ""
    ) -> list[Job]:
        """The insert of job_insert_many; the jobs that wait linked in the same script."""
        args = [_ts(now), json.dumps([_new_job_json(j) for j in jobs])]
        check_order(jobs)
        if workflow or any(j.waits for j in jobs):
            args += [json.dumps([flow_link_json(j, workflow) for j in jobs]), workflow, name]
        reply = self._run("job_insert_many", *args)
        if reply[0] == "workflow":
            raise _WorkflowTaken([int(i) for i in reply[1]])
        if reply[0] == "missing":
            raise unknown_parent([int(reply[1])])
        answers, unreadable = reply
        self._drop(unreadable)
        out: list[Job] = []
        made: dict[int, Job] = {}
        for new, answer in zip(jobs, answers, strict=True):
            job_id = int(answer[1])
            if int(answer[0]) == 0:
                if job_id not in made:
                    made[job_id] = new_job_record(job_id, new, now)
                    if len(answer) > 2:  # linked to its parents: its first state
                        made[job_id].state = JobState(answer[2])
                        made[job_id].error = answer[3] if len(answer) > 3 else None
                out.append(made[job_id])
            else:
                out.append(job_of(_pairs(answer[2:])))
        return out

    # --- reading ------------------------------------------------------------

    def job_get(self, job_id: int) -> Job | None:
        return self._load([job_id])[0]

    # --- workflows: jobs that wait for other jobs (flows.lua) ------------------------

    def job_parents(self, job_id: int) -> list[Relative]:
        edges: dict[str, str] = self._do(lambda: self._client.hgetall(self._k("wp", str(job_id))))
        ids = sorted(int(i) for i in edges)
        # A parent that cannot be read is gone (deleted, or dropped, or about to
        # be): named, with no job, so that its child does not leave it out.
        return [
            Relative(i, job, edges[str(i)] or None)
            if job is not None
            else Relative(i, None, edges[str(i)] if edges[str(i)] in GONE else DROPPED)
            for i, job in zip(ids, self._load(ids), strict=True)
        ]

    def job_workflow(self, job_id: int) -> str | None:
        found: str | None = self._do(
            lambda: self._client.hget(self._k("job", str(job_id)), "workflow")
        )
        return found

    def workflow_insert(
        self, workflow_id: str, name: str, jobs: Sequence[NewJob], now: datetime
    ) -> tuple[list[Job], bool]:
        try:
            return self._insert(jobs, now, workflow_id, name), False
        except _WorkflowTaken as taken:
            return [j for j in self._load(taken.ids) if j is not None], True

    def workflow_get(self, workflow_id: str) -> WorkflowInfo | None:
        fields: dict[str, str] = self._do(lambda: self._client.hgetall(self._k("wf", workflow_id)))
        if not fields:
            return None
        return WorkflowInfo(
            workflow_id, fields["name"], int(fields["jobs"]), _dt(fields["created_at"])
        )

    def workflow_list(self, limit: int = 100) -> list[WorkflowInfo]:
        def read() -> list[tuple[str, dict[str, str]]]:
            ids = self._client.zrevrange(self._k("workflows"), 0, limit - 1)
            pipe = self._client.pipeline(transaction=False)
            for workflow_id in ids:
                pipe.hgetall(self._k("wf", workflow_id))
            return list(zip(ids, pipe.execute(), strict=True))

        return [
            WorkflowInfo(i, f["name"], int(f["jobs"]), _dt(f["created_at"]))
            for i, f in self._do(read)
            if f
        ]

    def _workflow_ids(self, workflow_id: str) -> list[int]:
        ids = self._do(lambda: self._client.zrange(self._k("wfj", workflow_id), 0, -1))
        return [int(i) for i in ids]

    def workflow_jobs(self, workflow_id: str) -> list[Job]:
        return [j for j in self._load(self._workflow_ids(workflow_id)) if j is not None]

    def workflow_counts(self, workflow_id: str) -> dict[str, int]:
        ids = self._workflow_ids(workflow_id)

        def read() -> list[str | None]:
            pipe = self._client.pipeline(transaction=False)
            for job_id in ids:
                pipe.hget(self._k("job", str(job_id)), "state")
            return list(pipe.execute())

        counts: dict[str, int] = {}
        for state in self._do(read):
            if state is not None:
                counts[state] = counts.get(state, 0) + 1
        return dict(sorted(counts.items()))

    def workflow_edges(self, workflow_id: str) -> list[tuple[int, int, str | None]]:
        ids = self._workflow_ids(workflow_id)

        def read() -> list[dict[str, str]]:
            pipe = self._client.pipeline(transaction=False)
            for job_id in ids:
                pipe.hgetall(self._k("wp", str(job_id)))
            return list(pipe.execute())

        return [
            (child, int(parent), resolved or None)
            for child, edges in zip(ids, self._do(read), strict=True)
            for parent, resolved in sorted(edges.items(), key=lambda e: int(e[0]))
        ]

    def job_children(self, job_id: int) -> list[Relative]:
        def read() -> list[tuple[int, str | None]]:
            ids = [int(i) for i in self._client.zrange(self._k("wc", str(job_id)), 0, -1)]
            pipe = self._client.pipeline(transaction=False)
            for child in ids:
                pipe.hget(self._k("wp", str(child)), str(job_id))
            return list(zip(ids, pipe.execute(), strict=True))

        edges = dict(self._do(read))
        return [
            Relative(job.id, job, edges.get(job.id) or None)
            for job in self._load(sorted(edges))
            if job is not None
        ]

    def job_get_many(self, job_ids: Sequence[int]) -> list[Job]:
        return [job for job in self._load(list(job_ids)) if job is not None]

    def _load(
        self, job_ids: Sequence[int], met_in: Sequence[_Where] | None = None
    ) -> list[Job | None]:
        """The jobs of some ids, None for those that cannot be read, which are dropped.

        ``met_in``: where a walk of the indexes met each id. An id met there whose
        hash is gone is a job deleted by hand or evicted; an id a caller names may
        never have existed, so of those only a hash that lacks fields is dropped.
        """
        if not job_ids:
            return []

        def read() -> list[dict[str, str]]:
            pipe = self._client.pipeline(transaction=False)
            for job_id in job_ids:
                pipe.hgetall(self._k("job", str(job_id)))
            return list(pipe.execute())

        jobs: list[Job | None] = []
        unreadable: list[dict[str, str]] = []
        for n, fields in enumerate(self._do(read)):
            if _readable(fields):
                jobs.append(job_of(fields))
                continue
            jobs.append(None)
            if met_in is not None or fields:
                queue, state = met_in[n] if met_in is not None else (None, None)
                seen = {"id": str(job_ids[n]), "queue": queue, "state": state}
                unreadable.append({k: v for k, v in seen.items() if v is not None})
        self._drop(unreadable)
        return jobs

    def _drop(self, unreadable: Sequence[dict[str, str] | str]) -> None:
        """Drop jobs met in an index that could not be read (job_drop.lua): where each
        was met, as a dict or as the JSON a script handed back (``unreadable`` in
        common.lua: the claim, finish and enqueue scripts do not drop them themselves)."""
        if unreadable:
            seen = [json.loads(s) if isinstance(s, str) else s for s in unreadable]
            self._run("job_drop", "", json.dumps(seen))

    def _ids_of(self, index: str, before_id: int | None) -> Iterator[int]:
        """The ids in a sorted set of ids (score = id), newest first, below ``before_id``.

        A queue's running set is scored by lease expiry: it holds the jobs in hand
        (a fleet's concurrency at most), read whole and sorted.
        """
        if index.startswith(self._k("qs")) and index.endswith(":running"):
            below = NO_ID_BOUND if before_id is None else before_id
            held = self._do(lambda: self._client.zrange(index, 0, -1))
            yield from sorted((i for i in map(int, held) if i < below), reverse=True)
            return
        bound = f"({NO_ID_BOUND if before_id is None else before_id}"
        while True:
            with self._guard():
                ids = self._client.zrevrangebyscore(index, bound, "-inf", 0, _CHUNK)
            if not ids:
                return
            yield from (int(i) for i in ids)
            bound = f"({ids[-1]}"

    def _walk(self, indexes: Sequence[tuple[str, _Where]], before_id: int | None) -> Iterator[Job]:
        """The jobs of some sorted sets of ids, merged newest first, below ``before_id``."""

        def met(key: str, where: _Where) -> Iterator[tuple[int, _Where]]:
            return ((i, where) for i in self._ids_of(key, before_id))

        merged = heapq.merge(
            *(met(key, where) for key, where in indexes), key=lambda m: m[0], reverse=True
        )
        while True:
            chunk = list(itertools.islice(merged, _CHUNK))
            if not chunk:
                return
            jobs = self._load([i for i, _ in chunk], [where for _, where in chunk])
            yield from (job for job in jobs if job is not None)

    def _indexes_for(
        self, queue: str | None, state: str | None, group: str | None, batch: str | None
    ) -> list[tuple[str, _Where]]:
        """The narrowest sorted sets of ids that hold every job of a selection."""
        if group is not None:
            return [(self._k("group", group), (None, None))]
        if batch is not None and (queue is None or state is None):
            return [(self._k("batch", batch), (None, None))]
        queues = [queue] if queue is not None else self.queue_names()
        states = [state] if state is not None else list(_STATES)
        return [(self._k("qs", _nm(q), s), (q, s)) for q in queues for s in states]

    def event_list(self, job_id: int) -> list[Event]:
        def read() -> list[Event]:
            # The job's "events" field: the seqs of its events, comma-separated; those
            # of a dropped job are kept in "dropped" (see upkeep.lua).
            pipe = self._client.pipeline(transaction=False)
            pipe.hget(self._k("job", str(job_id)), "events")
            pipe.hget(self._k("dropped"), str(job_id))
            held, dropped = pipe.execute()
            seqs = (held or dropped).split(",") if held or dropped else []
            pipe = self._client.pipeline(transaction=False)
            for seq in seqs:
                pipe.xrange(self._k("events"), f"{seq}-0", f"{seq}-0")
            pipe.hmget(self._k("job", str(job_id)), *_RUNNING_ATTEMPT)
            *read, running = pipe.execute()
            return _history(job_id, [e for entries in read for e in entries], running)

        return self._do(read)

    def event_since(self, seq: int, limit: int) -> list[Event]:
        entries = self._do(
            lambda: self._client.xrange(self._k("events"), f"({seq}-0", "+", count=limit)
        )
        return [_event_of(e) for e in entries]

    def stats(self, now: datetime) -> Stats:
        names = self.queue_names()
        now_s = _ts(now)

        def read() -> tuple[list[Any], int, set[str]]:
            pipe = self._client.pipeline(transaction=True)  # one moment
            for q in names:
                for state in _STATES:
                    pipe.zcard(self._k("qs", _nm(q), state))
                pipe.zcount(self._k("due", _nm(q)), f"({now_s}", "+inf")
                pipe.zcount(self._k("retrying", _nm(q)), f"({now_s}", "+inf")
                pipe.zrangebyscore(self._k("due", _nm(q)), "-inf", now_s, 0, 1, withscores=True)
            pipe.zcount(self._k("finished"), _ts(now - timedelta(minutes=1)), "+inf")
            pipe.smembers(self._k("paused"))
            replies = pipe.execute()
            return replies[:-2], int(replies[-2]), set(replies[-1])

        replies, finished, paused = self._do(read)
        queues: dict[str, QueueStats] = {}
        step = len(_STATES) + 3
        for i, q in enumerate(names):
            part = replies[i * step : (i + 1) * step]
            counts = {s: int(n) for s, n in zip(_STATES, part, strict=False) if int(n)}
            later, retrying, oldest = int(part[-3]), int(part[-2]), part[-1]
            queues[q] = QueueStats(
                name=q,
                paused=q in paused,
                counts=dict(sorted(counts.items())),
                oldest_ready_age=max(0.0, now.timestamp() - oldest[0][1]) if oldest else None,
                scheduled=later - retrying,
                retrying=retrying,
            )
        limits = self.limit_status(now)
        return Stats(
            queues=queues,
            finished_last_minute=finished,
            limits={status.queue: status for status in limits},
        )

    def batch_status(self, batch: str) -> BatchStatus:
        counts = self._do(lambda: self._client.hgetall(self._k("bcount", batch)))
        return BatchStatus(
            batch, {state: int(n) for state, n in sorted(counts.items()) if int(n) > 0}
        )

    def next_run_in(
        self, queues: Sequence[str], now: datetime | None = None, group: str | None = None
    ) -> float | None:
        answer, unreadable = self._run(
            "next_run_in", json.dumps(list(dict.fromkeys(queues))), _now_arg(now), group or ""
        )
        self._drop(unreadable)
        if len(answer) < 2:
            return None
        return max(0.0, float(answer[1]) - float(answer[0]))

    # --- working ------------------------------------------------------------

    def job_claim(
        self,
        queues: Sequence[str],
        limit: int,
        worker: str,
        lease: timedelta,
        now: datetime | None = None,
        group: str | None = None,
    ) -> list[Job]:
        if limit <= 0 or not queues:
            return []
        flats, unreadable = self._run(
            "job_claim",
            json.dumps(list(dict.fromkeys(queues))),
            str(limit),
            worker,
            secrets.token_hex(16),
            f"{lease.total_seconds():.6f}",
            _now_arg(now),
            group or "",
            str(LIMIT_SLACK_SECONDS),
        )
        self._drop(unreadable)
        return [job_of(_pairs(f)) for f in flats]

    def job_heartbeat(
        self, leases: Sequence[Lease], lease: timedelta, now: datetime | None = None
    ) -> list[LeaseStatus]:
        if not leases:
            return []
        rows = self._run(
            "job_heartbeat",
            json.dumps([[str(le.id), le.token] for le in leases]),
            f"{lease.total_seconds():.6f}",
            _now_arg(now),
        )
        return [LeaseStatus(id=int(r[0]), cancel_requested=bool(int(r[1]))) for r in rows]

    def job_finish(self, finishes: Sequence[Finish], now: datetime | None = None) -> list[int]:
        if not finishes:
            return []
        items = [
            [
                str(f.id),
                f.token,
                f.kind,
                f.result_json,
                f.error,
                None if f.run_at is None else _ts(f.run_at),
            ]
            for f in finishes
        ]
        changed, unreadable = self._run("job_finish", _now_arg(now), json.dumps(items))
        self._drop(unreadable)
        return [int(i) for i in changed]

    def job_progress(
        self, lease: Lease, fraction: float | None, message: str | None, now: datetime
    ) -> bool:
        return bool(
            self._run(
                "job_progress",
                str(lease.id),
                lease.token,
                "" if fraction is None else repr(float(fraction)),
                message or "",
                "0" if message is None else "1",
            )
        )

    def job_rescue_expired(self, now: datetime | None = None, limit: int = 1000) -> list[int]:
        ids = self._run("job_rescue_expired", _now_arg(now), str(limit), LEASE_EXPIRED_ERROR)
        self._sweep_lost()
        return [int(i) for i in ids]

    def _sweep_lost(self) -> None:
        """Walk on with the sweep of dropped jobs' ids (job_sweep_lost.lua), if one is due:
        slices of ``_SWEEP_KEYS`` keys, each a short script, for ``_SWEEP_SECONDS`` at most."""
        deadline = time.monotonic() + _SWEEP_SECONDS
        while self._run("job_sweep_lost", str(_SWEEP_KEYS)) and time.monotonic() < deadline:
            pass

    def periodic_enqueue(self, name: str, tick: datetime, job: NewJob, now: datetime) -> bool:
        taken = self._run(
            "periodic_enqueue", name, _ts(tick), _ts(now), json.dumps(_new_job_json(job))
        )
        return bool(taken)

    def periodic_last_ticks(self) -> dict[str, datetime]:
        rows = self._do(lambda: self._client.hgetall(self._k("periodic")))
        return {name: _dt(tick) for name, tick in rows.items()}

    # --- operating ------------------------------------------------------------

    def _ids(self, job_ids: Sequence[int]) -> str:
        return json.dumps([str(i) for i in sorted(set(job_ids))])

    def job_retry_failed(
        self, queue: str | None, failed_before: datetime, now: datetime, limit: int = 1000
    ) -> list[int]:
        queues = [queue] if queue is not None else self.queue_names()

        def failed_ids() -> list[int]:
            pipe = self._client.pipeline(transaction=False)
            for q in queues:
                pipe.zrange(self._k("qs", _nm(q), "failed"), 0, -1)
            return sorted(int(i) for ids in pipe.execute() for i in ids)

        candidates = self._do(failed_ids)
        done: list[int] = []
        while candidates and len(done) < limit:
            chunk, candidates = candidates[: limit - len(done)], candidates[limit - len(done) :]
            changed = self._run("job_retry", _ts(now), self._ids(chunk), "1", _ts(failed_before))
            done += [int(i) for i in changed]
        return done

    def _forget_dropped(self, before: datetime, limit: int) -> None:
        """The histories of jobs dropped before ``before`` (job_forget_dropped.lua): kept
        as long as a failed job's, so they go with the purges of failed jobs."""
        self._run("job_forget_dropped", _ts(before), str(limit))

    def _delete(
        self,
        job_ids: Sequence[int],
        finished_before: datetime | None = None,
        states: Sequence[str] | None = None,
        queue: str | None = None,
    ) -> list[int]:
        if not job_ids:
            return []
        deleted: list[int] = []
        ordered = list(dict.fromkeys(job_ids))
        for start in range(0, len(ordered), 1000):  # bounded script runs
            deleted += self._run(
                "job_delete",
                json.dumps([str(i) for i in ordered[start : start + 1000]]),
                "" if finished_before is None else _ts(finished_before),
                json.dumps(None if states is None else list(states)),
                queue or "",
            )
        return sorted(int(i) for i in deleted)

    def queue_pause(self, queue: str, now: datetime) -> None:
        self._run("queue_set_paused", queue, "1")

    def queue_resume(self, queue: str, now: datetime) -> None:
        self._run("queue_set_paused", queue, "0")

    def queue_paused(self) -> set[str]:
        return set(self._do(lambda: self._client.smembers(self._k("paused"))))

    # --- workers and maintenance ------------------------------------------------

    def subscribe(self, on_change: ChangeCallback) -> Subscription:
        return RedisListener(self._client, self.prefix, on_change)

    def worker_register(
        self,
        worker_id: str,
        host: str,
        pid: int,
        queues: list[str],
        concurrency: int,
        now: datetime,
    ) -> None:
        info = json.dumps({"host": host, "pid": pid, "queues": queues, "concurrency": concurrency})
        self._run("worker_register", worker_id, info, _ts(now))

    def worker_beat(self, worker_id: str, jobs_in_hand: int, now: datetime) -> None:
        self._run("worker_beat", worker_id, str(jobs_in_hand), _ts(now))

    def worker_unregister(self, worker_id: str) -> None:
        self._run("worker_unregister", worker_id)

    def worker_list(self) -> list[WorkerInfo]:
        def read() -> list[tuple[str, dict[str, str]]]:
            ids = self._client.zrange(self._k("workers"), 0, -1)
            pipe = self._client.pipeline(transaction=False)
            for worker_id in ids:
                pipe.hgetall(self._k("worker", worker_id))
            return list(zip(ids, pipe.execute(), strict=True))

        workers = []
        for worker_id, row in self._do(read):
            if not row:
                continue
            info = json.loads(row["info"])
            workers.append(
                WorkerInfo(
                    id=worker_id,
                    host=info["host"],
                    pid=int(info["pid"]),
                    queues=list(info["queues"]),
                    concurrency=int(info["concurrency"]),
                    jobs_in_hand=int(row["jobs_in_hand"]),
                    started_at=_dt(row["started_at"]),
                    last_seen_at=_dt(row["last_seen_at"]),
                )
            )
        workers.sort(key=lambda w: (w.started_at, w.id))
        return workers

    def worker_prune(self, last_seen_before: datetime) -> int:
        return int(self._run("worker_prune", _ts(last_seen_before)))

    def leader_acquire(self, name: str, holder: str, ttl: timedelta, now: datetime) -> bool:
        return bool(self._run("leader_acquire", name, holder, _ts(now + ttl), _ts(now)))

    def leader_release(self, name: str, holder: str) -> None:
        self._run("leader_release", name, holder)

    # --- the dashboard and metrics ------------------------------------------------

    def stats_finished_per_slot(self, since: datetime, slot: timedelta) -> list[FinishedCount]:
        counts = slot_counts(self, _ts(since), since.timestamp(), slot.total_seconds())
        return [FinishedCount(queue=q, state=s, slot=i, count=c) for (q, s, i), c in counts.items()]

    def event_count_by_kind(self, after: EventOffset) -> EventCounts:
        counts: dict[tuple[str, str], int] = {}
        last = after[1]
        while True:
            with self._guard():
                entries = self._client.xrange(self._k("events"), f"({last}-0", "+", count=5000)
            if not entries:
                break
            for entry in entries:
                e = _event_of(entry)
                counts[(e.queue, e.kind)] = counts.get((e.queue, e.kind), 0) + 1
                last = e.seq
        return EventCounts(counts=counts, offset=(0, last))

    def queue_names(self) -> list[str]:
        def read() -> tuple[dict[str, str], set[str]]:
            pipe = self._client.pipeline(transaction=False)
            pipe.hgetall(self._k("queues"))
            pipe.smembers(self._k("paused"))
            held, paused = pipe.execute()
            return held, set(paused)

        held, paused = self._do(read)
        return sorted({q for q, n in held.items() if int(n) > 0} | paused)

    def event_offset(self) -> EventOffset:
        newest = self._do(lambda: self._client.xrevrange(self._k("events"), "+", "-", count=1))
        return (0, int(newest[0][0].split("-", 1)[0])) if newest else (0, 0)

    def job_run_time_histogram(
        self, finished_after: datetime, finished_until: datetime, bounds: Sequence[float]
    ) -> list[RunTimeBucket]:
        buckets = run_times(self, f"({_ts(finished_after)}", _ts(finished_until), bounds)
        return [
            RunTimeBucket(queue=q, bucket=b, count=c, total_seconds=s)
            for (q, b), (c, s) in buckets.items()
        ]

    # --- operating in bulk, groups, retention and the operator's views ------------

    def _selected(
        self, selection: JobSelection, now: datetime, before_id: int | None
    ) -> Iterator[Job]:
        """The jobs of a selection, newest first, walked along its narrowest index."""
        if selection.ids is not None:
            bound = NO_ID_BOUND if before_id is None else before_id
            ids = sorted((i for i in set(selection.ids) if i < bound), reverse=True)
            jobs: Iterator[Job] = (
                j for start in range(0, len(ids), _CHUNK)
                for j in self._load(ids[start : start + _CHUNK]) if j is not None
            )  # fmt: skip
        else:
            state = selection.state
            stored = None
            if state is not None:
                stored = "queued" if state in ("ready", "scheduled", "retrying") else state
            indexes = self._indexes_for(selection.queue, stored, selection.group, selection.batch)
            jobs = self._walk(indexes, before_id)
        if selection.args is not None:
            # No index looks inside arguments: only the newest jobs are searched.
            floor = args_floor(selection, self._newest_id)
            jobs = itertools.takewhile(lambda job: job.id > floor, jobs)
        return (job for job in jobs if _matches(job, selection, now))

    def _newest_id(self) -> int:
        return int(self._do(lambda: self._client.get(self._k("ids"))) or 0)

    def job_select(
        self,
        selection: JobSelection,
        now: datetime,
        before_id: int | None = None,
        limit: int = 100,
    ) -> list[Job]:
        out: list[Job] = []
        if limit <= 0:
            return out
        for job in self._selected(selection, now, before_id):
            out.append(job)
            if len(out) >= limit:
                break
        return out

    def job_count_selected(self, selection: JobSelection, now: datetime) -> dict[str, int]:
        if all(getattr(selection, name) is None for name in _SKIP_FILTERS):
            counts = self._count_from_indexes(selection.queue, now)
        else:
            counts = {}
            for job in self._selected(selection, now, None):
                shown = job.detailed_state(now)
                counts[shown] = counts.get(shown, 0) + 1
        if selection.state is None:
            return counts
        if selection.state == JobState.QUEUED:
            return {s: n for s, n in counts.items() if s in ("ready", "scheduled", "retrying")}
        return {s: n for s, n in counts.items() if s == selection.state}

    def _count_from_indexes(self, queue: str | None, now: datetime) -> dict[str, int]:
        """Jobs per detailed state of a queue (or of all), from the indexes' sizes."""
        names = [queue] if queue is not None else self.queue_names()
        now_s = _ts(now)

        def read() -> list[int]:
            pipe = self._client.pipeline(transaction=True)
            for q in names:
                for state in _STATES:
                    pipe.zcard(self._k("qs", _nm(q), state))
                pipe.zcount(self._k("due", _nm(q)), f"({now_s}", "+inf")
                pipe.zcount(self._k("retrying", _nm(q)), f"({now_s}", "+inf")
            return [int(n) for n in pipe.execute()]

        replies = self._do(read)
        counts: dict[str, int] = {}
        step = len(_STATES) + 2
        for i in range(len(names)):
            part = replies[i * step : (i + 1) * step]
            by_state = dict(zip(_STATES, part[: len(_STATES)], strict=True))
            later, retrying = part[-2], part[-1]
            detailed = {
                "ready": by_state["queued"] - later,
                "scheduled": later - retrying,
                "retrying": retrying,
                **{s: by_state[s] for s in _STATES if s != "queued"},
            }
            for name, n in detailed.items():
                if n:
                    counts[name] = counts.get(name, 0) + n
        return counts

    def job_retry_many(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        if not job_ids:
            return []
        return sorted(int(i) for i in self._run("job_retry", _ts(now), self._ids(job_ids), "1", ""))

    def job_cancel_many(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        if not job_ids:
            return []
        return sorted(int(i) for i in self._run("job_cancel", _ts(now), self._ids(job_ids)))

    def job_delete_many(self, job_ids: Sequence[int]) -> list[int]:
        return self._delete(sorted(set(job_ids)))

    def job_run_now(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        if not job_ids:
            return []
        return sorted(int(i) for i in self._run("job_run_now", _ts(now), self._ids(job_ids)))

    def job_take_back(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        held = [j for j in self._load(sorted(set(job_ids))) if j is not None]
        finishes = [
            Finish(j.id, j.lease_token, "take_back", error=TAKEN_BACK_ERROR)
            for j in held
            if j.state == JobState.RUNNING and j.lease_token is not None
        ]
        return self.job_finish(finishes, now)

    def job_purge_where(
        self,
        finished_before: datetime,
        states: Sequence[str],
        queue: str | None,
        limit: int = 10_000,
    ) -> int:
        cutoff = f"({_ts(finished_before)}"
        ids = self._purge_walks.candidates(self, cutoff, states, queue, limit)
        if queue is None and "failed" in states:
            self._forget_dropped(finished_before, limit)
        return len(self._delete(ids, finished_before, states, queue))

    def job_purge_count(
        self, finished_before: datetime, states: Sequence[str], queue: str | None
    ) -> int:
        return count_matching(self, f"({_ts(finished_before)}", states, queue)

    def job_purge_beyond(
        self, queue: str, keep: int, states: Sequence[str], limit: int = 10_000
    ) -> int:
        chosen = [state for state in TERMINAL if state in states]
        keys = [self._k("qs", _nm(queue), state) for state in chosen]
        ids = self._do(lambda: beyond_newest(self._client, keys, keep, limit))
        far_future = datetime(9999, 12, 31, tzinfo=UTC)
        # job_delete checks each job's state again: one retried meanwhile stays.
        return len(self._delete(ids, far_future, chosen, queue))

    def job_hold(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        return self._hold("job_hold", job_ids, now)

    def job_unhold(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        return self._hold("job_unhold", job_ids, now)

    def _hold(self, name: str, job_ids: Sequence[int], now: datetime) -> list[int]:
        if not job_ids:
            return []
        ordered = json.dumps([str(i) for i in sorted(set(job_ids))])
        changed = self._run(name, _ts(now), ordered, _ts(HOLD_AT))
        return sorted(int(i) for i in changed)

    def job_held(self, queue: str | None, before_id: int | None, limit: int) -> list[int]:
        names = [queue] if queue is not None else self.queue_names()

        def read() -> list[int]:
            pipe = self._client.pipeline(transaction=False)
            for name in names:  # held: due at the hold moment, in the due index
                pipe.zrangebyscore(self._k("due", _nm(name)), _ts(HOLD_AT), "+inf")
            return [int(i) for ids in pipe.execute() for i in ids]

        bound = before_id if before_id is not None else NO_ID_BOUND
        return sorted((i for i in self._do(read) if i < bound), reverse=True)[:limit]

    def job_unprocessed(
        self, queue: str | None, states: Sequence[str], since: datetime, limit: int
    ) -> list[int]:
        wanted = set(states)
        found: list[int] = []
        offset, chunk = 0, max(limit, 500)
        while len(found) < limit:
            # The finished index, oldest finish first, a chunk at a time.
            def chunk_of(start: int = offset) -> list[str]:
                return list(
                    self._client.zrangebyscore(
                        self._k("finished"), _ts(since), "+inf", start=start, num=chunk
                    )
                )

            ids = self._do(chunk_of)
            if not ids:
                break
            offset += len(ids)

            def read(batch: list[str] = ids) -> list[list[str | None]]:
                pipe = self._client.pipeline(transaction=False)
                for job_id in batch:
                    pipe.hmget(
                        self._k("job", job_id), "queue", "state", "finished_at", "processed_mark"
                    )
                return list(pipe.execute())

            for job_id, (q, state, finished, mark) in zip(ids, self._do(read), strict=True):
                if state in wanted and (queue is None or q == queue) and mark != finished:
                    found.append(int(job_id))
        return found[:limit]

    def job_mark_processed(self, job_id: int) -> bool:
        return bool(self._run("job_mark_processed", str(job_id)))

    def queue_delete(self, queue: str) -> None:
        self._do(lambda: self._client.srem(self._k("paused"), queue))

    # --- flow control: rate and concurrency limits --------------------------------

    def _limits_of(self, queue: str, row: dict[str, str]) -> QueueLimits:
        names = ("rate", "per", "concurrency", "key_rate", "key_per", "key_concurrency")
        values: list[Any] = [queue]
        for name in names:
            raw = row.get(name)
            values.append(None if raw is None else float(raw) if "per" in name else int(raw))
        values.append(row.get("throttled_until"))
        return limits_of_row(values, _odt)

    def limit_set(
        self, queue: str, limit: Limit | None, per_key: bool, now: datetime
    ) -> QueueLimits | None:
        rate = limit.rate if limit is not None else None
        concurrency = limit.concurrency if limit is not None else None
        row = self._run(
            "limit_set",
            queue,
            "key" if per_key else "queue",
            "" if rate is None else str(rate.count),
            "" if rate is None else repr(float(rate.per)),
            "" if concurrency is None else str(concurrency),
            _ts(now),
        )
        return None if row is None else self._limits_of(queue, _pairs(row))

    def limit_get(self, queue: str) -> QueueLimits | None:
        def read() -> tuple[bool, dict[str, str]]:
            pipe = self._client.pipeline(transaction=True)
            pipe.sismember(self._k("limited"), queue)
            pipe.hgetall(self._k("limit", _nm(queue)))
            limited, row = pipe.execute()
            return bool(limited), row

        limited, row = self._do(read)
        return self._limits_of(queue, row) if limited else None

    def limit_throttle(
        self, queue: str, limit_key: str | None, seconds: float, now: datetime | None = None
    ) -> datetime:
        until = self._run("limit_throttle", queue, limit_key or "", repr(float(seconds)),
                          _now_arg(now))  # fmt: skip
        return _dt(until)

    def limit_status(self, now: datetime) -> list[LimitStatus]:
        queues = sorted(self._do(lambda: self._client.smembers(self._k("limited"))))
        return [self._limit_usage(q, now) for q in queues]

    def _limit_usage(self, queue: str, now: datetime) -> LimitStatus:
        limits = self.limit_get(queue)
        if limits is None:
            limits = QueueLimits(queue=queue, limit=None, key_limit=None, throttled_until=None)
        usage = [int(n) for n in self._run("limit_usage", queue, _ts(now))]
        return limit_status(limits, now, *usage)

    def limit_prune(self, now: datetime) -> None:
        self._run("limit_prune", _ts(now), str(LIMIT_SLACK_SECONDS))

    # --- durable steps (docs/effects.md) --------------------------------------------

    def step_list(self, job_id: int) -> list[Step]:
        found = self._do(lambda: self._client.hgetall(self._k("steps", str(job_id))))
        steps = [_step_of(str(name), value) for name, value in found.items()]
        return sorted(steps, key=lambda step: (step.finished_at, step.name))

    def step_record(
        self,
        lease: Lease,
        name: str,
        result_json: str,
        started_at: datetime,
        now: datetime | None = None,
    ) -> Step | None:
        step = json.dumps([result_json, None, _ts(started_at), _now_arg(now)])
        recorded = self._run("step_record", str(lease.id), lease.token, name, step)
        return None if recorded is None else _step_of(name, recorded)


#: Filters the per-queue counters cannot answer: a count with one of them reads the jobs.
_SKIP_FILTERS = ("task", "group", "batch", "error", "worker", "ids", "key", "limit_key", "args")


def _matches(job: Job, selection: JobSelection, now: datetime) -> bool:
    """Whether a job is one a selection names (the SQL stores' job_select filters)."""
    s = selection
    if s.ids is not None and job.id not in s.ids:
        return False
    for wanted, actual in (
        (s.queue, job.queue),
        (s.task, job.task),
        (s.group, job.group),
        (s.batch, job.batch),
        (s.worker, job.worker),
        (s.key, job.key),
        (s.limit_key, job.limit_key),
    ):
        if wanted is not None and wanted != actual:
            return False
    if s.error and (job.error is None or s.error.lower() not in job.error.lower()):
        return False
    if s.args and s.args.lower() not in f"{job.args_json} {job.kwargs_json}".lower():
        return False
    if s.state is not None and s.state != job.state:
        return job.state == JobState.QUEUED and job.detailed_state(now) == s.state
    return True
