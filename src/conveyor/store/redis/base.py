"""The Redis store's plumbing: the client, its scripts, keys, and jobs read back.

Every capability mixin of ``RedisStore`` builds on ``RedisBase``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from conveyor.errors import ConfigurationError, StoreUnavailableError
from conveyor.job import Event, Job, JobState, NewJob
from conveyor.store.flows import check_order, unknown_parent
from conveyor.store.keys import new_job_record
from conveyor.store.redis.history import PurgeWalks

#: The layout of keys this code reads and writes (``schema_version`` on Redis). 2: a
#: queue's running set scored by lease expiry (no ``leases`` set); events in one field.
#: 3: a job that others wait for is marked in its hash (``children``).
LAYOUT_VERSION = 3
DEFAULT_PREFIX = "{conveyor}:"

#: The fields every job's hash has (REQUIRED in upkeep.lua): one without them cannot be read.
_REQUIRED = (
    "id", "queue", "task", "state", "args", "kwargs", "priority", "run_at", "attempts",
    "max_attempts", "created_at",
)  # fmt: skip

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


def _readable(fields: dict[str, str]) -> bool:
    """Whether a job's hash holds every field a job has (an empty one: deleted or evicted)."""
    return all(name in fields for name in _REQUIRED)


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


def _unique_arg(job: NewJob) -> str:
    """A job's key rule as find_key in common.lua reads it: "live", "forever", or a
    window "w|<earliest creation time, or empty>|<finished states, comma-separated>"."""
    if job.unique_states is None:
        return job.unique
    since = "" if job.unique_since is None else _ts(job.unique_since)
    return f"w|{since}|{','.join(job.unique_states)}"


def _new_job_json(job: NewJob) -> list[str | None]:
    fields = [
        job.queue,
        job.task,
        job.args_json,
        job.kwargs_json,
        str(job.priority),
        _ts(job.run_at),
        str(job.max_attempts),
        job.key,
        _unique_arg(job),
        job.group,
        job.batch,
        job.limit_key,
        job.headers_text(),
    ]
    # Fields only the jobs that use them carry: a deadline, the replace rule, retention,
    # a fair key of its own.
    optional = [
        None if job.expires_at is None else _ts(job.expires_at),
        "replace" if job.on_conflict == "replace" else None,
        job.retain,
        job.fair_key,
    ]
    while optional and optional[-1] is None:
        optional.pop()
    return fields + optional


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


class RedisBase:
    """The client, the loaded scripts and the helpers every capability uses."""

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
        #: The next_run_in answer ({now, moment} or {now}) of the last claim on each set
        #: of queues that took fewer than it could, and when it came (monotonic; core.py).
        self._next_due: dict[tuple[str, ...], tuple[list[str], float]] = {}
        self.ping()
        if migrate:
            self.migrate()

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """redis-py's connection errors become StoreUnavailableError at the store's boundary."""
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            reason = str(exc).strip() or type(exc).__name__
            raise StoreUnavailableError.saying(
                f"cannot reach Redis at {self.where}", reason
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

    def _queue_names(self) -> list[str]:
        """Queues with jobs, or paused (InsightStore's, and listings' and counts' walks)."""

        def read() -> tuple[dict[str, str], set[str]]:
            pipe = self._client.pipeline(transaction=False)
            pipe.hgetall(self._k("queues"))
            pipe.smembers(self._k("paused"))
            held, paused = pipe.execute()
            return held, set(paused)

        held, paused = self._do(read)
        return sorted({q for q, n in held.items() if int(n) > 0} | paused)

    def _job_field(self, job_ids: Sequence[int], field: str) -> list[str | None]:
        """One field of each job's hash, in the order of ``job_ids`` (None where the
        job or the field is missing): one round trip, however many jobs."""

        def read() -> list[str | None]:
            pipe = self._client.pipeline(transaction=False)
            for job_id in job_ids:
                pipe.hget(self._k("job", str(job_id)), field)
            return list(pipe.execute())

        return self._do(read)

    def _k(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def close(self) -> None:
        self._client.close()

    def ping(self) -> None:
        self._do(self._client.ping)

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
        if current in (1, 2):
            self._mark_parents()
        self._do(lambda: self._client.hset(self._k("meta"), "layout", str(LAYOUT_VERSION)))
        return LAYOUT_VERSION

    def _mark_parents(self) -> None:
        """Layout 3: the jobs with children (a ``wc:`` set) are marked in their hash."""
        start = len(self._k("wc:"))
        # The prefix as a glob matches itself only: its special characters escaped.
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", self._k("wc:")) + "*"

        def walk() -> list[str]:
            keys = self._client.scan_iter(match=pattern, count=1000)
            return [key[start:] for key in keys]

        ids = self._do(walk)
        for at in range(0, len(ids), 1000):
            self._run("layout_3", *ids[at : at + 1000])

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
