"""App: the task registry and the client API (enqueue, inspect, operate, wait)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from conveyor import bulk, signals
from conveyor import fair as fair_turns
from conveyor.bulk import BULK_ACTIONS, check_age, check_final_states, job_selection, retry_one
from conveyor.changes import Change, ChangeHub, ChangeListener, notifications_setting, wait_for_job
from conveyor.diagnosis import Why, diagnose
from conveyor.encryption import ROTATE_BATCH, RotationProgress, payload_codec, reencrypt
from conveyor.enqueueing import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE, new_jobs_of
from conveyor.errors import ConfigurationError, JobNotFoundError, JobStateError, UnknownTaskError
from conveyor.expiry import check_task_expires
from conveyor.fleet import SILENT_AFTER, WorkerStatus, control_worker, worker_statuses
from conveyor.job import (
    DETAILED_STATES,
    EventKind,
    Job,
    JobState,
    NewJob,
    utcnow,
    validate_max_attempts,
    validate_name,
    validate_new_job,
    validate_priority,
)
from conveyor.limits import QueueLimits, Rate, make_limit, throttle_seconds
from conveyor.middleware import Middleware, around_enqueue, check_middleware
from conveyor.middleware import chain as middleware_chain
from conveyor.retain import Retain
from conveyor.retry import Backoff, check_backoff
from conveyor.schedule import Periodic, make_schedule
from conveyor.store.capabilities import (
    Capabilities,
    flow_control_store,
    hold_store,
    insight_store,
    operator_store,
    outcome_store,
    payload_store,
    require,
    step_store,
    store_capabilities,
    worker_control_store,
    workflow_retry_store,
    workflow_store,
)
from conveyor.store.dsn import open_store
from conveyor.store.expiring import ExpiringStore
from conveyor.store.limit_keys import KeyThrottle, LimitKeyStore
from conveyor.store.metrics_protocol import TaskMetricsStore
from conveyor.store.protocols import (
    HoldStore,
    InsightStore,
    JobStore,
    OperatorStore,
    TransactionalStore,
)
from conveyor.store.records import (
    BatchStatus,
    FinishedCount,
    JobSelection,
    LimitChange,
    LimitStatus,
    Page,
    Purge,
    Relative,
    Stats,
    Step,
    WorkflowInfo,
)
from conveyor.store.signals import SignalStore
from conveyor.task import BY_LIMIT_KEY, EnqueueOptions, Task, check_timeout
from conveyor.twins import async_twin
from conveyor.worker.retention import MAX_KEEP, Keep, Retention, check_keep_finished
from conveyor.worker.runtime import Runtime
from conveyor.workflow import (
    Workflow,
    WorkflowRun,
    WorkflowStatus,
    check_workflow,
    workflow_new_jobs,
)

if TYPE_CHECKING:
    from conveyor.worker import Worker
    from conveyor.worker.consume import ConsumedJob, Consumer

P = ParamSpec("P")
R = TypeVar("R")

#: The newest jobs whose task names count as known to ``known_tasks``.
KNOWN_TASKS_READ = 5_000
#: How long a finished job without a processed mark counts as unprocessed (``unprocessed``).
OUTCOME_GRACE = timedelta(days=7)
#: "Not given" for arguments where None means something (``app.limit(queue, None)`` drops the rate).
_UNSET: Any = object()


class App:
    """A conveyor application: where tasks are registered and jobs are enqueued and read.

    ``App()`` opens the store named by ``CONVEYOR_DSN``, else ``./conveyor.db``.
    ``store_options`` go to the backend (for PostgreSQL: ``min_size``, ``max_size``,
    ``connect_timeout``; for Redis: ``connect_timeout``, ``socket_timeout``).
    ``middleware`` wraps every enqueue and every attempt, in order (see
    ``conveyor.middleware``). ``notifications=False`` (or ``CONVEYOR_NOTIFICATIONS=0``
    in the environment) runs poll-only: nothing listens to the store (behind a
    pooler in transaction mode, where LISTEN cannot work), and work enqueued by
    other processes is found within a ``poll_interval``. ``encryption_keys``
    (else ``CONVEYOR_ENCRYPTION_KEYS``, comma-separated), Fernet keys newest
    first, encrypt arguments and results at rest (see docs/encryption.md).
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        store: JobStore | None = None,
        retention: timedelta | None = None,
        inline: bool = False,
        retention_by_state: Mapping[str, timedelta | Keep] | None = None,
        keep_finished: int | Mapping[str, int] | None = None,
        middleware: Sequence[Middleware] | None = None,
        notifications: bool | None = None,
        encryption_keys: Sequence[str | bytes] | None = None,
        **store_options: Any,
    ):
        if store is not None and dsn is not None:
            raise ConfigurationError("give App a dsn or a store, not both")
        listen = notifications_setting(notifications)  # checked before the store opens
        #: This App's middleware, after the globally installed ones (``middleware_chain``).
        self.middleware = check_middleware(middleware)
        # Checked before the store opens: a bad option leaves no connection behind.
        retention_policy = Retention(retention, retention_by_state, keep_finished)
        #: Seals arguments and results at rest, opens them when read; None: stored clear.
        self.codec = payload_codec(encryption_keys)
        # A store may have only the core (JobStore): workers and consumers need no
        # more, and the methods that need a capability check it (``needs``).
        self.store: JobStore = store if store is not None else open_store(dsn, **store_options)
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.periodic_tasks: list[Periodic] = []
        #: Whether this App listens to the store's notifications (LISTEN on
        #: PostgreSQL, pub/sub on Redis, the file's data_version on SQLite); off,
        #: workers and consumers find other processes' work by their poll only.
        self.notifications = listen
        #: Changes seen by this process: local enqueues and completions, and the database's feed.
        self.changes = ChangeHub(self.store, listen=self.notifications)
        #: Inline mode (for tests): every enqueue runs its jobs before it returns.
        self.inline = inline
        self._inline_with_scheduled = True
        #: What workers, consumers, inline mode and maintenance run on (never the App).
        self.runtime = Runtime(
            store=self.store,
            tasks=MappingProxyType(self.tasks),
            changes=self.changes,
            middleware=self.middleware_chain,
            periodic=self.periodic_tasks,
            retention=retention_policy,
            attach=self._attach,
            codec=self.codec,
        )

    def __repr__(self) -> str:
        return f"<App {self.store.description} tasks={len(self.tasks)}>"

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release its consumers' jobs, stop its change feed, close the store's connections."""
        for consumer in list(self.runtime.consumers):
            consumer.close()
        self.changes.close()
        self.store.close()

    def set_inline(self, enabled: bool, *, with_scheduled: bool = True) -> None:
        """Switch inline mode: each enqueue then runs the new jobs' queues in the calling thread.

        The jobs run on the worker's execution path (claim under a lease, the
        executor, the completer), so they leave the rows and events a worker
        would. ``with_scheduled`` also runs deferred jobs and retries at once.
        """
        self.inline = enabled
        self._inline_with_scheduled = with_scheduled

    def _run_inline(self, jobs: list[Job]) -> list[Job]:
        from conveyor.worker.inline import drain

        for queue in dict.fromkeys(job.queue for job in jobs):
            drain(self.runtime, [queue], with_scheduled=self._inline_with_scheduled)
        return [self.get(job.id) for job in jobs]

    def middleware_chain(self) -> tuple[Middleware, ...]:
        """The middleware around each enqueue and attempt: the installed ones, then the App's."""
        return middleware_chain(self.middleware)

    def migrate(self) -> int:
        """Bring the database schema up to date; return its version."""
        return self.store.migrate()

    # --- registering tasks ----------------------------------------------------

    @overload
    def task(
        self,
        fn: Callable[P, R],
        /,
        *,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | timedelta | None = None,
        name: str | None = None,
        priority: int = 0,
        backoff: Backoff | None = None,
        expires: float | timedelta | datetime | None = None,
        retain: Retain | None = None,
        fair_key: str | None = BY_LIMIT_KEY,
    ) -> Task[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | timedelta | None = None,
        name: str | None = None,
        priority: int = 0,
        backoff: Backoff | None = None,
        expires: float | timedelta | datetime | None = None,
        retain: Retain | None = None,
        fair_key: str | None = BY_LIMIT_KEY,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | timedelta | None = None,
        name: str | None = None,
        priority: int = 0,
        backoff: Backoff | None = None,
        expires: float | timedelta | datetime | None = None,
        retain: Retain | None = None,
        fair_key: str | None = BY_LIMIT_KEY,
    ) -> Task[P, R] | Callable[[Callable[P, R]], Task[P, R]]:
        """Register a handler: ``@app.task`` or ``@app.task(queue="mail", max_attempts=5)``."""

        def register(fn: Callable[P, R]) -> Task[P, R]:
            task_name = validate_name("task name", name or fn.__name__)
            assert task_name is not None
            if task_name in self.tasks:
                raise ConfigurationError(
                    f"a task named {task_name!r} is already registered; pass name=... to tell "
                    "them apart"
                )
            try:
                checked_backoff = check_backoff(backoff) if backoff is not None else None
            except (TypeError, ValueError) as exc:
                raise ConfigurationError(f"task {task_name!r}: {exc}") from None
            task = Task(
                self,
                fn,
                name=task_name,
                queue=validate_name("queue", queue) or DEFAULT_QUEUE,
                max_attempts=validate_max_attempts(max_attempts),
                priority=validate_priority(priority),
                timeout=check_timeout(task_name, timeout),
                backoff=checked_backoff,
                expires=check_task_expires(task_name, expires),
                retain=retain,
                fair_key=fair_key,
            )
            self.tasks[task_name] = task
            return task

        return register(fn) if fn is not None else register

    def periodic(
        self,
        *,
        every: timedelta | float | None = None,
        cron: str | None = None,
        queue: str = DEFAULT_QUEUE,
        name: str | None = None,
    ) -> Callable[[Callable[[], R]], Task[[], R]]:
        """Register a task that the workers enqueue on a schedule (UTC).

        ``@app.periodic(every=timedelta(minutes=5))`` or ``@app.periodic(cron="0 3 * * *")``.
        Each tick is enqueued once, however many workers run.
        """
        schedule = make_schedule(every, cron)

        def register(fn: Callable[[], R]) -> Task[[], R]:
            task = self.task(fn, queue=queue, name=name)
            self.periodic_tasks.append(Periodic(task.name, schedule))
            return task

        return register

    # --- working --------------------------------------------------------------------

    def worker(self, **options: Any) -> Worker:
        """A Worker for this App (see Worker for the options); use it with ``with``."""
        from conveyor.worker import Worker

        return Worker(self.runtime, **options)

    def run_worker(
        self,
        queues: Sequence[str] | None = None,
        concurrency: int = 8,
        burst: bool = False,
        stop_timeout: float = 30.0,
        lease: float = 30.0,
        **options: Any,
    ) -> int:
        """Run a worker in this thread until SIGTERM/SIGINT (or, with burst, until idle)."""
        return self.worker(
            queues=queues,
            concurrency=concurrency,
            burst=burst,
            stop_timeout=stop_timeout,
            lease=lease,
            **options,
        ).run()

    def consume(
        self,
        queues: Sequence[str],
        group: str | None = None,
        lease: float = 30.0,
        poll_interval: float = 1.0,
        *,
        idle_timeout: float | None = None,
        batch_size: int = 1,
        backoff_first: float = 0.05,
        backoff_max: float = 2.0,
    ) -> Consumer:
        """Claim jobs and yield them, one at a time, to a loop you own.

        End each with ``job.complete(result)``, ``job.fail(error)`` (retried while
        attempts remain), ``job.fail(error, final=True)`` (failed for good) or
        ``job.release()``, or use ``with job:`` (complete on exit; an exception is
        judged as a handler's: ``Fail`` fails for good, ``Retry`` runs it again
        later, anything else fails the attempt). Stopping the iteration releases a
        job still held; ``consumer.stop()`` ends the loop from another thread, and
        ``idle_timeout`` ends it after that many seconds without a job.

        ``batch_size`` claims up to that many jobs in one call, each held and
        renewed under its own lease until it is handed out and ended. When nothing
        is ready the loop sleeps until a wake-up, the next due job, or at most
        ``poll_interval`` seconds; after a store error it waits ``backoff_first``
        seconds, doubling up to ``backoff_max``, before it claims again.
        """
        from conveyor.worker.consume import ConsumeOptions, Consumer

        options = ConsumeOptions(
            lease, poll_interval, idle_timeout, batch_size, backoff_first, backoff_max
        )
        return Consumer(self.runtime, queues, group, options)

    def aconsume(
        self,
        queues: Sequence[str],
        group: str | None = None,
        lease: float = 30.0,
        poll_interval: float = 1.0,
        *,
        idle_timeout: float | None = None,
        batch_size: int = 1,
        backoff_first: float = 0.05,
        backoff_max: float = 2.0,
    ) -> AsyncIterator[ConsumedJob]:
        """``consume`` for async code: ``async for job in app.aconsume([...])``."""
        from conveyor.worker.consume import ConsumeOptions, aconsume

        options = ConsumeOptions(
            lease, poll_interval, idle_timeout, batch_size, backoff_first, backoff_max
        )
        return aconsume(self.runtime, queues, group, options)

    def get_task(self, name: str) -> Task[Any, Any]:
        """The registered task of that name; UnknownTaskError lists the known ones."""
        try:
            return self.tasks[name]
        except KeyError:
            raise UnknownTaskError(
                f"no task named {name!r} is registered; known tasks: "
                f"{', '.join(sorted(self.tasks)) or 'none'}"
            ) from None

    def task_schema(self, name: str) -> dict[str, Any]:
        """A JSON Schema of a registered task's arguments, for clients in any language."""
        return self.get_task(name).schema()

    # --- enqueueing -------------------------------------------------------------

    def enqueue(
        self,
        /,
        task: str,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Job:
        """Enqueue by task name, without the handler's code (e.g. from another service).

        ``options`` are those of ``task.options(...)``: key, group, priority, delay,
        run_at, queue, max_attempts, batch, unique, limit_key, expires, retain, connection.
        """
        opts = EnqueueOptions(**options)
        return self.enqueue_calls(task, [(args, kwargs or {})], opts)[0]

    def enqueue_calls(
        self,
        task: str,
        calls: Iterable[tuple[Sequence[Any], dict[str, Any]]],
        opts: EnqueueOptions,
    ) -> list[Job]:
        """Validate and insert calls of one task in one transaction. Nothing is written on error."""
        new_jobs, now = new_jobs_of(self.store, self.tasks.get(task), task, calls, opts)
        queue = new_jobs[0].queue if new_jobs else DEFAULT_QUEUE
        if opts.connection is not None:
            require(self.store, TransactionalStore, "enqueue inside a caller's transaction")
        chain = self.middleware_chain()
        if chain:
            jobs = around_enqueue(
                chain, new_jobs, lambda: self._insert(new_jobs, now, [queue], opts.connection)
            )
        else:
            jobs = self._insert(new_jobs, now, [queue], opts.connection)
        if self.inline and opts.connection is None:
            jobs = self._run_inline(jobs)
        return jobs

    def _insert(
        self, new_jobs: list[NewJob], now: datetime, queues: Iterable[str], connection: Any = None
    ) -> list[Job]:
        """Insert checked jobs of ``queues``; wake this process's workers; attach the jobs."""
        known = None if self.codec is None else self.codec.seal_new(new_jobs)
        jobs = self.store.job_insert_many(new_jobs, now, connection=connection)
        for queue in queues:
            self.changes.publish("jobs", queue)  # wakes this process's workers at once
        for job in jobs:
            # A new job is built from this call's ``now``; a job read back (one that
            # holds the key already) carries the time it was really created.
            job.existing = job.key is not None and job.created_at != now
            self._attach(job, known)
        return jobs

    def enqueue_many(self, jobs: Iterable[NewJob]) -> list[Job]:
        """Insert prepared NewJob records in one transaction (the fast path of bulk loaders).

        They are checked by the rules of ``enqueue`` first; nothing is written
        when one is refused.
        """
        new_jobs = [validate_new_job(job) for job in jobs]
        now = utcnow()
        queues = dict.fromkeys(job.queue for job in new_jobs)
        chain = self.middleware_chain()
        if chain:
            inserted = around_enqueue(chain, new_jobs, lambda: self._insert(new_jobs, now, queues))
        else:
            inserted = self._insert(new_jobs, now, queues)
        if self.inline:
            inserted = self._run_inline(inserted)
        return inserted

    # --- reading ----------------------------------------------------------------

    def _attach(self, job: Job, known: Mapping[str, str] | None = None) -> Job:
        """The job, attached to this App, its sealed values opened (``known``: the
        clear texts of values this process has just sealed)."""
        job._app = self
        return job if self.codec is None else self.codec.open_job(job, known)

    def get(self, job_id: int) -> Job:
        """The job as stored now; JobNotFoundError if there is none (never created, or purged,
        or, on Redis, dropped because its data was deleted, evicted or incomplete)."""
        job = self.store.job_get(job_id)
        if job is None:
            # A job Redis dropped says so, with when and why, until retention forgets it.
            history = self.store.event_list(job_id) if isinstance(self.store, OperatorStore) else []
            for event in history:
                if event.kind == EventKind.DROPPED:
                    raise JobNotFoundError(
                        f"job {job_id} was dropped at {event.at:%Y-%m-%d %H:%M:%S} UTC: "
                        f"{event.error}"
                    )
            raise JobNotFoundError(f"no job with id {job_id} (never created, or purged)")
        return self._attach(job)

    def why(self, job_id: int) -> Why:
        """Why the job is not running: each thing that holds it back (paused queue, limit,
        throttle, group, hold, parents, due time, no live worker); see conveyor.diagnosis."""
        return diagnose(self.store, self.get(job_id), utcnow(), silent_after=SILENT_AFTER)

    def throttled_keys(self, queue: str, limit: int = 1000) -> list[KeyThrottle]:
        """The limit keys of ``queue`` throttled now, soonest end first (none on a store
        that cannot read them)."""
        if not isinstance(self.store, LimitKeyStore):
            return []
        return self.store.limit_throttled_keys(
            utcnow(), limit, validate_name("queue", queue) or queue
        )

    # --- workflows ------------------------------------------------------------------

    def enqueue_workflow(self, workflow: Workflow) -> WorkflowRun:
        """Store every job of a declared workflow at once: all of them, or none on error.

        A workflow stored under the same id already is returned instead (its
        ``existing`` is True), whatever this one holds.
        """
        store = workflow_store(self.store, "enqueue workflows")
        wf = check_workflow(workflow)
        new_jobs, now = workflow_new_jobs(self.store, wf, self)

        def insert() -> list[Job]:
            known = None if self.codec is None else self.codec.seal_new(new_jobs)
            jobs, existed[0] = store.workflow_insert(wf.id, wf.name, new_jobs, now)
            for queue in dict.fromkeys(job.queue for job in jobs):
                self.changes.publish("jobs", queue)
            return [self._attach(job, known) for job in jobs]

        existed = [False]
        chain = self.middleware_chain()
        jobs = around_enqueue(chain, new_jobs, insert) if chain else insert()
        run = WorkflowRun(wf.id, wf.name, jobs, existed[0], self)
        if self.inline:
            self._run_inline([j for j in jobs if j.state == JobState.QUEUED])
            run.jobs = [self.get(j.id) for j in jobs]
        return run

    def workflow(self, workflow_id: str) -> WorkflowRun:
        """A stored workflow, by id; JobNotFoundError when there is none."""
        store = workflow_store(self.store, "read workflows")
        info = store.workflow_get(workflow_id)
        if info is None:
            raise JobNotFoundError(f"no workflow with id {workflow_id!r}")
        jobs = [self._attach(j) for j in store.workflow_jobs(workflow_id)]
        return WorkflowRun(info.id, info.name, jobs, True, self)

    def workflows(self, limit: int = 100) -> list[WorkflowInfo]:
        """The newest workflows first."""
        store = workflow_store(self.store, "list workflows")
        return store.workflow_list(limit)

    def workflow_status(self, workflow_id: str) -> WorkflowStatus:
        """A workflow's jobs counted by state, and the first of them that failed."""
        store = workflow_store(self.store, "read workflows")
        counts = store.workflow_counts(workflow_id)
        failed = None
        if counts.get(JobState.FAILED):
            failed_jobs = [
                j for j in store.workflow_jobs(workflow_id) if j.state == JobState.FAILED
            ]
            failed = min(failed_jobs, key=lambda j: (j.finished_at or j.created_at, j.id))
            self._attach(failed)
        return WorkflowStatus(workflow_id, counts, failed)

    def cancel_workflow(self, workflow_id: str) -> int:
        """Cancel every job of a workflow that has not ended (running ones: asked to stop).

        Returns how many changed.
        """
        store = workflow_store(self.store, "cancel workflows")
        live = [j.id for j in store.workflow_jobs(workflow_id) if not j.terminal]
        return self.cancel_jobs(ids=live) if live else 0

    def workflow_of(self, job_id: int) -> str | None:
        """The id of the workflow ``job_id`` belongs to, if any."""
        store = workflow_store(self.store, "read workflows")
        return store.job_workflow(job_id)

    def workflow_edges(self, workflow_id: str) -> list[tuple[int, int, str | None]]:
        """A workflow's edges: (parent id, child id, the state the edge resolved in)."""
        store = workflow_store(self.store, "read workflows")
        return store.workflow_edges(workflow_id)

    def retry_workflow(self, workflow_id: str) -> int:
        """Run a workflow again from its failures: its failed jobs, and the jobs their
        failure cancelled, go back as new; succeeded jobs keep their results (see
        conveyor.store.workflow_retry). Returns how many jobs were put back."""
        store = workflow_retry_store(self.store, "retry workflows")
        if workflow_store(self.store, "retry workflows").workflow_get(workflow_id) is None:
            raise JobNotFoundError(f"no workflow with id {workflow_id!r}")
        return len(store.workflow_retry(workflow_id, utcnow()))

    def parents(self, job_id: int) -> list[Job]:
        """The jobs ``job_id`` waits (or waited) for (``after=``), by id."""
        store = workflow_store(self.store, "read the jobs a job waits for")
        return [self._attach(r.job) for r in store.job_parents(job_id) if r.job is not None]

    def parent_edges(self, job_id: int) -> list[Relative]:
        """The edges onto the jobs ``job_id`` waits (or waited) for, by parent id: each
        parent's id, the job (None once deleted) and the state the edge resolved in
        (None while the parent has not ended; 'deleted' once it is gone)."""
        workflow_store(self.store, "read the jobs a job waits for")
        return self.runtime.parent_edges(job_id)

    def children(self, job_id: int) -> list[Job]:
        """The jobs that wait (or waited) for ``job_id``, by id."""
        store = workflow_store(self.store, "read the jobs waiting for a job")
        return [self._attach(r.job) for r in store.job_children(job_id) if r.job is not None]

    def jobs(
        self,
        /,
        state: JobState | str | None = None,
        queue: str | None = None,
        task: str | None = None,
        limit: int = 100,
        *,
        batch: str | None = None,
        error: str | None = None,
        before_id: int | None = None,
        group: str | None = None,
        worker: str | None = None,
        key: str | None = None,
        limit_key: str | None = None,
        args: str | None = None,
    ) -> list[Job]:
        """Jobs newest first; page with ``before_id=<last id of the previous page>``.

        ``state`` is a state, or ``ready``, ``scheduled`` or ``retrying`` (kinds of
        queued job); ``error`` keeps the jobs whose last error contains that text;
        ``group`` the jobs of one group; ``worker`` those claimed by one worker id;
        ``key`` the job holding an idempotency key, ``limit_key`` the jobs a per-key
        limit counts under it; ``args`` the jobs whose arguments (as JSON) contain
        that text, among the newest ARGS_SEARCH_SPAN jobs only.
        """
        store = operator_store(self.store, "list jobs")
        selection = job_selection(
            state=None if state is None else str(state), queue=queue, task=task, group=group,
            batch=batch, error=error, worker=worker, key=key, limit_key=limit_key, args=args,
        )  # fmt: skip
        found = store.job_select(selection, utcnow(), Page(limit, before_id))
        return [self._attach(job) for job in found]

    def workers(self) -> list[WorkerStatus]:
        """The registered workers, each with the running jobs the store says it holds.

        The one count of a worker's jobs that every surface shows (a dead
        worker's last check-in may name jobs since rescued). Workers silent for
        over FORGET_AFTER are left out, pruned or not.
        """
        store = operator_store(self.store, "list workers")
        return worker_statuses(store, utcnow(), self._attach)

    def control_worker(
        self,
        worker_id: str,
        *,
        quiet: bool | None = None,
        stop: bool | None = None,
        concurrency: int | None = None,
    ) -> dict[str, Any]:
        """Ask a worker (on any machine) to go quiet or claim again, to stop, or to run
        ``concurrency`` slots; it obeys at its next check-in (conveyor.fleet)."""
        store = worker_control_store(self.store, "control workers")
        return control_worker(store, worker_id, quiet, stop, concurrency)

    def known_tasks(self) -> set[str]:
        """Task names this App registers, with those the store has seen lately.

        The store's: the tasks of its KNOWN_TASKS_READ newest jobs and its
        periodic tasks (every tick leaves a row). What ``conveyor enqueue``
        checks a name against when it is given no App.
        """
        store = operator_store(self.store, "read the tasks the store has seen")
        known = set(self.tasks) | set(self.store.periodic_last_ticks())
        newest = store.job_select(JobSelection(), utcnow(), Page(KNOWN_TASKS_READ))
        return known | {job.task for job in newest}

    @property
    def description(self) -> str:
        """The store, as errors and logs name it (its DSN without a password)."""
        return self.store.description

    @property
    def insight(self) -> InsightStore:
        """The store's figures (the event feed, counts over time) for /metrics: a named port."""
        return insight_store(self.store, "report figures")

    @property
    def expiry(self) -> ExpiringStore | None:
        """Deadlines and expired counts (``expires=``): a named port; None without."""
        return self.store if isinstance(self.store, ExpiringStore) else None

    @property
    def task_metrics(self) -> TaskMetricsStore | None:
        """The per-task metrics the store folds (the tasks page, /metrics); None without."""
        return self.store if isinstance(self.store, TaskMetricsStore) else None

    def port(self, capability: type[R]) -> R | None:
        """The store as ``capability`` (a runtime-checkable protocol of it); None without."""
        return self.store if isinstance(self.store, capability) else None

    @property
    def durable(self) -> SignalStore | None:
        """Signals sent and what parked jobs wait for (``ctx.wait_for``, ``ctx.wait``): a port."""
        return self.store if isinstance(self.store, SignalStore) else None

    def ping(self) -> None:
        """Raise unless the store answers (a health check's cheapest question)."""
        self.store.ping()

    def queue_names(self) -> list[str]:
        """Every queue the store knows: with jobs, paused, or limited."""
        return insight_store(self.store, "list queues").queue_names()

    def finished_per_slot(self, since: datetime, slot: timedelta) -> list[FinishedCount]:
        """Jobs finished since ``since``, per queue, state and slot of ``slot`` length."""
        insight = insight_store(self.store, "count finished jobs over time")
        return insight.stats_finished_per_slot(since, slot)

    def periodic_ticks(self) -> dict[str, datetime]:
        """The last tick enqueued of each periodic task the store has seen, by name."""
        return self.store.periodic_last_ticks()

    def events(self, job_id: int) -> list[Any]:
        """The job's history, oldest first."""
        return list(operator_store(self.store, "read a job's history").event_list(job_id))

    def steps(self, job_id: int) -> list[Step]:
        """The job's durable steps (``ctx.step``), in the order they finished."""
        store = step_store(self.store, "read a job's durable steps")
        steps = store.step_list(job_id)
        return steps if self.codec is None else [self.codec.open_step(s) for s in steps]

    def stats(self) -> Stats:
        """Counts per queue and state, parked jobs, oldest ready age, last minute's finishes."""
        store = operator_store(self.store, "count jobs")
        return signals.with_parked(store, store.stats(utcnow()), utcnow())

    def batch_status(self, batch: str) -> BatchStatus:
        """How many of a batch's jobs are done (succeeded), failed, cancelled and outstanding.

        Outstanding jobs are queued (including those waiting to retry) or
        running. Purged jobs are no longer counted.
        """
        store = operator_store(self.store, "count a batch")
        return store.batch_status(validate_name("batch", batch) or batch)

    def on_change(self, callback: Callable[[Change], None]) -> ChangeListener:
        """Be told when something changes: ``callback(change)`` for each ``Change``.

        The App's own feed, which wakes its workers and waiters: this process's
        enqueues, claims, holds, outcomes, cancels and progress at once, and
        other processes' through the store's notifications (LISTEN/NOTIFY, pub/sub, SQLite's file
        watch; not when the App runs with ``notifications=False``). Called from a
        background thread: keep it short (hand the change to a queue of yours);
        an exception it raises is logged and the feed goes on. A hint, not a
        log: changes may come merged, twice, or (after "reconnected") not at
        all, so read the store again for the truth. ``close()`` on the returned
        listener (or ``with``) stops it.
        """
        return ChangeListener(self.changes, callback)

    def capabilities(self) -> Capabilities:
        """What this App's store supports, read off the protocols it implements.

        ``app.capabilities().caller_transactions`` says whether
        ``enqueue(..., connection=conn)`` works; ``.limits``, ``.spark``,
        ``.operations``, ``.several_machines``, ``.notifications`` (listening,
        unless the App runs poll-only) the rest; ``.as_dict()`` all of it.
        """
        return store_capabilities(self.store, self.notifications)

    def health(self) -> dict[str, Any]:
        """Whether the store answers, how fast, and its schema version. Never raises.

        On Redis also ``persistence`` (its appendonly, appendfsync and save settings)
        and, when a restart or crash of Redis could lose jobs, a ``warning``.
        """
        return self.runtime.health()

    # --- operating ----------------------------------------------------------------

    def cancel(self, job_id: int) -> Job:
        """Cancel a queued job (and the children it waits for, ``ctx.wait``), ask the worker
        of a running one to stop; a finished job stays."""
        store = operator_store(self.store, "cancel jobs")
        # The bulk operation with one id: one way to cancel, in every store.
        store.job_cancel_many([job_id], utcnow())
        job = self.store.job_get(job_id)
        if job is None:
            raise JobNotFoundError(f"no job with id {job_id}")
        if job.state == JobState.RUNNING and job.cancel_requested and job.lease_token:
            # A worker of this process holding that attempt hears it at once.
            self.changes.publish("cancel", f"{job.id}:{job.lease_token}")
        return self._attach(job)

    def signal(self, job_id: int, name: str, payload: Any = None) -> bool:
        """Send signal ``name`` to a job (``ctx.wait_for``); True when it woke the job."""
        return signals.send(self.store, job_id, name, payload)

    def retry(self, job_id: int) -> Job:
        """Queue a failed or cancelled job again with its attempts reset."""
        return self._attach(retry_one(self.store, job_id))

    def retry_failed(
        self,
        queue: str | None = None,
        *,
        batch_size: int = 1000,
        on_batch: Callable[[int], None] | None = None,
    ) -> int:
        """Queue every failed job (of ``queue``, or of all queues) again; return how many.

        Works in batches of ``batch_size``, one transaction each, calling
        ``on_batch(count)`` after each (for a progress bar). A keyed job whose key a
        newer or live job holds stays failed. Jobs that fail again while this runs
        are not retried a second time.
        """
        store = operator_store(self.store, "retry jobs")
        if queue is not None:
            validate_name("queue", queue)
        started = utcnow()
        total = 0
        while True:
            ids = store.job_retry_failed(queue, started, utcnow(), batch_size)
            if not ids:
                return total
            total += len(ids)
            self.changes.publish("jobs", queue or "")
            if on_batch is not None:
                on_batch(len(ids))

    def purge(
        self,
        older_than: timedelta,
        *,
        states: Sequence[str] | None = None,
        queue: str | None = None,
        on_batch: Callable[[int], None] | None = None,
    ) -> int:
        """Delete terminal jobs (and their events) that finished more than ``older_than`` ago.

        ``states`` narrows it to some final states (succeeded, failed, cancelled),
        ``queue`` to one queue. Deletes in batches, one transaction each, calling
        ``on_batch(count)`` after each.
        """
        store = operator_store(self.store, "purge jobs")
        cutoff = utcnow() - check_age(older_than)
        chosen = check_final_states(states)
        if queue is not None:
            validate_name("queue", queue)
        total = 0
        while True:
            deleted = store.job_purge_where(Purge(cutoff, chosen, queue))
            total += deleted
            if deleted == 0:
                return total
            if on_batch is not None:
                on_batch(deleted)

    def pause(self, queue: str) -> None:
        """Stop workers from claiming from ``queue``; running jobs finish."""
        store = operator_store(self.store, "pause queues")
        store.queue_pause(validate_name("queue", queue) or queue, utcnow())

    def resume(self, queue: str) -> None:
        """Let workers claim from a paused ``queue`` again."""
        store = operator_store(self.store, "resume queues")
        store.queue_resume(validate_name("queue", queue) or queue, utcnow())

    # --- waiting ----------------------------------------------------------------

    def wait(
        self,
        job_id: int,
        timeout: float | None = None,
        *,
        on_progress: Callable[[float | None, str | None], None] | None = None,
    ) -> Any:
        """Block until the job is terminal and return its result.

        Raises JobFailed (with the remote error and traceback), JobCancelled, or
        TimeoutError. Woken by the same signals as workers; it listens before
        it reads the job, so a completion between the two is never missed.
        ``on_progress(fraction, message)`` hears the job's ``ctx.progress()``
        calls at once when the job runs in this process's worker.
        """
        return wait_for_job(self.changes, job_id, lambda: self.get(job_id), timeout, on_progress)

    async def await_result(self, job_id: int, timeout: float | None = None) -> Any:
        """``wait`` for async code: does not block the event loop."""
        return await asyncio.to_thread(self.wait, job_id, timeout)

    # --- operating in bulk (conveyor.bulk), groups, retention ---------------------------

    def check_schema(self) -> int:
        """Raise SchemaMissingError unless the database has this code's schema; return its version.

        The CLI, the dashboard and the worker call it before anything else, so a
        database that was never migrated says "run conveyor migrate" instead of
        "no such table".
        """
        return self.runtime.check_schema()

    def count_jobs(
        self, /, ids: Sequence[int] | None = None, **filters: str | None
    ) -> dict[str, int]:
        """Jobs matching ``ids`` and/or filters, per detailed state (zeros left out).

        Filters: state (a state, or ready, scheduled, retrying), queue, task, group,
        batch, error (text in the last error), worker, key, limit_key, args (text in
        the arguments, among the newest jobs only). ``app.count_jobs(group="g")``
        counts a group's jobs; the keys are ready, scheduled, retrying, running,
        succeeded, failed and cancelled.
        """
        store = operator_store(self.store, "count jobs")
        selection = job_selection(ids, **filters)
        counts = store.job_count_selected(selection, utcnow())
        return {state: counts[state] for state in DETAILED_STATES if counts.get(state)}

    def count_matching(self, /, **filters: str | None) -> int:
        """How many jobs a listing's filters match, all pages together.

        By state and queue alone (or none) it is read from the counts the
        overview shows, which read no finished job; other filters count the
        matching jobs (those of a group or batch through its index; a task,
        worker, key, limit key or text by reading the jobs, of the queue given
        or of all; text in the arguments among the newest jobs only).
        """
        operator_store(self.store, "count jobs")
        chosen = {name: value for name, value in filters.items() if value}
        if set(chosen) <= {"state", "queue"}:
            stats = self.stats()
            state = chosen.get("state")
            if state is None:
                return sum(sum(q.counts.values()) for name, q in stats.queues.items()
                           if chosen.get("queue") in (None, name))  # fmt: skip
            return stats.count(state, chosen.get("queue"))
        return sum(self.count_jobs(None, **chosen).values())

    def retry_jobs(
        self,
        /,
        ids: Sequence[int] | None = None,
        *,
        on_batch: Callable[[int], None] | None = None,
        **filters: str | None,
    ) -> int:
        """Queue the failed and cancelled jobs among those named again, attempts reset.

        Of several jobs with one key, only the newest goes back, and none while a
        live job holds the key. Returns how many were queued.
        """
        operator_store(self.store, "retry jobs")
        return self._bulk("retry", ids, filters, on_batch)

    def cancel_jobs(
        self,
        /,
        ids: Sequence[int] | None = None,
        *,
        on_batch: Callable[[int], None] | None = None,
        **filters: str | None,
    ) -> int:
        """Cancel the queued jobs among those named; ask the workers of the running ones to stop.

        ``app.cancel_jobs(group="session-42", state="queued")`` cancels a group's
        pending jobs and leaves its running one alone. Returns how many changed.
        """
        operator_store(self.store, "cancel jobs")
        return self._bulk("cancel", ids, filters, on_batch)

    def delete_jobs(
        self,
        /,
        ids: Sequence[int] | None = None,
        *,
        on_batch: Callable[[int], None] | None = None,
        **filters: str | None,
    ) -> int:
        """Delete the jobs named (queued or finished) with their history; running ones stay.

        Cancel a running job first: its worker holds it. Returns how many were deleted.
        """
        operator_store(self.store, "delete jobs")
        return self._bulk("delete", ids, filters, on_batch)

    def run_jobs_now(
        self,
        /,
        ids: Sequence[int] | None = None,
        *,
        on_batch: Callable[[int], None] | None = None,
        **filters: str | None,
    ) -> int:
        """Make the scheduled and retrying jobs among those named due now; returns how many."""
        operator_store(self.store, "run jobs now")
        return self._bulk("run_now", ids, filters, on_batch)

    def take_back(
        self,
        /,
        ids: Sequence[int] | None = None,
        *,
        on_batch: Callable[[int], None] | None = None,
        **filters: str | None,
    ) -> int:
        """Take back now the running jobs named, as if their leases had expired.

        For a worker or consumer known to be dead (``app.take_back(group="g")``,
        ``app.take_back(worker=worker_id)``): each job is queued again (failed when
        out of attempts) with error "worker lost: taken back by an operator". If
        the holder was alive after all, its outcome is refused (its lease is void)
        and the job may run twice, as after any rescue. Returns how many.
        """
        operator_store(self.store, "take jobs back")
        return self._bulk("take_back", ids, filters, on_batch)

    def _bulk(
        self,
        action: str,
        ids: Sequence[int] | None,
        filters: Mapping[str, str | None],
        on_batch: Callable[[int], None] | None,
        act: bulk.Act | None = None,
    ) -> int:
        selection = job_selection(ids, **filters)
        store = operator_store(self.store, "act on jobs in bulk")
        chosen = act or bulk.store_action(store, action)
        changed = functools.partial(self.changes.publish, "jobs")
        return bulk.walk(store, selection, BULK_ACTIONS[action], chosen, on_batch, changed)

    def reencrypt(
        self,
        *,
        after_id: int = 0,
        batch_size: int = ROTATE_BATCH,
        on_batch: Callable[[RotationProgress], None] | None = None,
    ) -> RotationProgress:
        """Seal every stored job's arguments and results under the newest encryption key.

        Resumable: values under the newest key already are skipped, and
        ``after_id`` starts after a job id (``RotationProgress.last_id``).
        """
        store = payload_store(self.store, "re-encrypt stored jobs")
        if self.codec is None:
            raise ConfigurationError(
                "re-encrypting needs the encryption keys (App(encryption_keys=...) or "
                "CONVEYOR_ENCRYPTION_KEYS, newest first)"
            )
        return reencrypt(
            store, self.codec, after_id=after_id, batch_size=batch_size, on_batch=on_batch
        )

    def delete_queue(self, queue: str) -> int:
        """Delete a queue: its jobs (queued and finished) and their history, and its pause.

        Refused while jobs of the queue run (cancel them, or wait). A producer that
        enqueues to the name afterwards makes the queue anew. Returns the jobs deleted.
        """
        store = operator_store(self.store, "delete queues")
        validate_name("queue", queue)
        running = self.count_jobs(queue=queue, state="running").get("running", 0)
        if running:
            raise JobStateError(
                f"queue {queue!r} has {running} running job(s): cancel them "
                f"(conveyor jobs cancel --queue {queue} --state running) or let them finish, "
                "then delete the queue"
            )
        deleted = self.delete_jobs(queue=queue)
        store.queue_delete(queue)
        return deleted

    def purge_count(
        self,
        older_than: timedelta,
        *,
        states: Sequence[str] | None = None,
        queue: str | None = None,
    ) -> int:
        """How many jobs ``purge`` with the same arguments would delete now (a dry run)."""
        store = operator_store(self.store, "count purgeable jobs")
        cutoff = utcnow() - check_age(older_than)
        if queue is not None:
            validate_name("queue", queue)
        return store.job_purge_count(Purge(cutoff, check_final_states(states), queue))

    def apply_retention(self, now: datetime) -> int:
        """One round of retention now (``conveyor.worker.retention.Retention.apply``), as
        its leader among the workers and consumers runs it; returns the jobs deleted."""
        store = operator_store(self.store, "apply retention")
        return self.runtime.retention.apply(store, now, own=True)

    def trim(
        self,
        queue: str,
        *,
        keep: int,
        states: Sequence[str] | None = None,
        on_batch: Callable[[int], None] | None = None,
    ) -> int:
        """Delete a queue's finished jobs beyond its ``keep`` newest, now; return how many.

        ``states`` narrows it to some final states (succeeded, failed,
        cancelled), counted together: ``app.trim("mail", keep=100,
        states=["failed"])`` keeps the 100 newest failed jobs of ``mail``.
        Newest is by id, the order the jobs were enqueued. Deletes in batches,
        one transaction each, calling ``on_batch(count)`` after each.
        """
        store = operator_store(self.store, "trim queues")
        validate_name("queue", queue)
        if keep is None or isinstance(keep, Mapping):  # one queue, one number
            raise ConfigurationError(
                f"keep must be a whole number of jobs from 0 to {MAX_KEEP:,}, got {keep!r}"
            )
        check_keep_finished(keep, "keep")
        chosen = check_final_states(states)
        total = 0
        while True:
            deleted = store.job_purge_beyond(queue, keep, chosen)
            total += deleted
            if deleted == 0:
                return total
            if on_batch is not None:
                on_batch(deleted)

    # --- holding single jobs back -------------------------------------------------------

    def hold(self, job_id: int) -> Job:
        """Hold a queued job back: no worker or consumer claims it until ``unhold``.

        Its place is kept (its key, its group: a held job at the head of a group
        holds the group behind it); ``job.held`` says so. Only a queued job can be
        held: holding never touches a running job (JobStateError says what to do
        instead). Holding a held job changes nothing.
        """
        self._hold(hold_store(self.store, "hold jobs"), job_id, holding=True)
        return self.get(job_id)

    def unhold(self, job_id: int) -> Job:
        """Let a held job go: due again at the run_at it had (now, if that has passed)."""
        self._hold(hold_store(self.store, "let held jobs go"), job_id, holding=False)
        return self.get(job_id)

    def _hold(self, store: HoldStore, job_id: int, holding: bool) -> None:
        act = store.job_hold if holding else store.job_unhold
        if act([job_id], utcnow()):
            if holding:
                # Said in this process: the stores send nothing for a hold.
                self.changes.publish("held", str(job_id))
            else:
                self.changes.publish("jobs", self.get(job_id).queue)
            return
        job = self.get(job_id)  # JobNotFoundError for one that is not there
        if holding and job.held:
            return  # held already: nothing to do
        if holding:
            if job.state == JobState.RUNNING:
                advice = "cancel it (it stops at its next check) or take it back"
            elif job.state == JobState.WAITING:
                advice = "hold it once the jobs it waits for have ended (it is queued then)"
            else:
                advice = "retry it first, then hold it"
            raise JobStateError(
                f"job {job_id} is {job.state}: only a queued job can be held; {advice}"
            )
        raise JobStateError(f"job {job_id} is {job.state}, not held: nothing to let go")

    def hold_jobs(
        self,
        /,
        ids: Sequence[int] | None = None,
        *,
        on_batch: Callable[[int], None] | None = None,
        **filters: str | None,
    ) -> int:
        """Hold the queued jobs among those named (ids and/or filters); returns how many."""
        store = hold_store(self.store, "hold jobs")

        def hold(batch: Sequence[int], now: datetime) -> list[int]:
            changed = store.job_hold(batch, now)
            if changed:  # said in this process: the stores send nothing for a hold
                self.changes.publish("held", ",".join(str(i) for i in changed))
            return changed

        return self._bulk("hold", ids, filters, on_batch, hold)

    def unhold_jobs(
        self,
        /,
        ids: Sequence[int] | None = None,
        *,
        on_batch: Callable[[int], None] | None = None,
        **filters: str | None,
    ) -> int:
        """Let the held jobs among those named go; returns how many."""
        store = hold_store(self.store, "let held jobs go")
        return self._bulk("unhold", ids, filters, on_batch, store.job_unhold)

    def held_jobs(
        self, queue: str | None = None, *, limit: int = 100, before_id: int | None = None
    ) -> list[Job]:
        """Held jobs (of ``queue``, or of all), newest first; page with ``before_id``."""
        store = hold_store(self.store, "list held jobs")
        if queue is not None:
            validate_name("queue", queue)
        ids = store.job_held(queue, before_id, limit)
        found = {job.id: job for job in self.store.job_get_many(ids)}
        return [self._attach(found[i]) for i in ids if i in found]

    # --- outcome readers ---------------------------------------------------------------

    def unprocessed(
        self,
        queue: str | None = None,
        *,
        states: Sequence[str] | None = None,
        limit: int = 100,
        grace: timedelta = OUTCOME_GRACE,
    ) -> list[Job]:
        """Finished jobs whose outcome no reader has marked processed yet, oldest finish first.

        For a service that acts on results (stores them, tells a user): read,
        act, then ``mark_processed(job.id)``. ``states`` narrows it to some
        final states. The grace rule: a finished job without a mark is
        unprocessed for ``grace`` (7 days) after it finished; past that it is no
        longer listed (taken as abandoned), so a reader that starts on years of
        history, or comes back after a long outage, is not flooded. A job run
        again (retried) and finished anew is unprocessed again.
        """
        store = outcome_store(self.store, "read unprocessed outcomes")
        if queue is not None:
            validate_name("queue", queue)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise ConfigurationError("limit must be a whole number from 1 to 10,000")
        since = utcnow() - check_age(grace)
        readers = store
        ids = readers.job_unprocessed(queue, check_final_states(states), since, limit)
        found = {job.id: job for job in self.store.job_get_many(ids)}
        return [self._attach(found[i]) for i in ids if i in found]

    def mark_processed(self, job_id: int) -> bool:
        """Mark a finished job's outcome processed: True for exactly one caller, once.

        A compare-and-set: of several readers marking the same job, one gets
        True (and acts), the others False. False too for a job that is not
        finished (raises JobNotFoundError for one that does not exist).
        """
        store = outcome_store(self.store, "mark outcomes processed")
        if store.job_mark_processed(job_id):
            return True
        self.get(job_id)  # JobNotFoundError names a job that is not there
        return False

    # --- flow control: rate and concurrency limits ----------------------------------

    def limit(
        self,
        queue: str,
        rate: str | Rate | None = _UNSET,
        *,
        concurrency: int | None = _UNSET,
        per_key: bool = False,
        clear: bool = False,
    ) -> QueueLimits | None:
        """Limit how often and how many jobs of ``queue`` start, across every worker.

        ``app.limit("payments", rate="10/s")``: at most 10 jobs started in any
        second (also ``"600/m"``, ``"1000/h"``, ``"5/10s"``); ``concurrency=3``: at
        most 3 running at once; both may be given. With ``per_key=True`` the
        limit applies to each value of the jobs' ``limit_key`` on its own (jobs
        without one are not held by it); a queue may have both a limit of its own
        and a per-key limit. A call changes only what it names: a rate given
        leaves the concurrency as it was, and the other way round; ``rate=None``
        or ``concurrency=None`` drops that part; ``clear=True`` drops both.
        Stored in the database: every worker obeys it from its next claim,
        without a restart. Returns what the queue has now (None: no limit, no
        throttle).
        """
        store = flow_control_store(self.store, "set limits")
        validate_name("queue", queue)
        named = {"rate": rate, "concurrency": concurrency}
        given = [part for part, value in named.items() if value is not _UNSET]
        if clear:
            if given:
                raise ConfigurationError(
                    f"app.limit({queue!r}, clear=True) drops the whole limit: "
                    f"give {' or '.join(given)} in another call"
                )
            return store.limit_set(LimitChange(queue, None, per_key), utcnow())
        if not given:
            raise ConfigurationError(
                "give rate= (such as '10/s'), concurrency=, or both; None drops that part, "
                f"app.limit({queue!r}, clear=True) the whole limit"
            )
        chosen = make_limit(
            None if rate is _UNSET else rate, None if concurrency is _UNSET else concurrency
        )
        keep = [part for part in named if part not in given]
        return store.limit_set(LimitChange(queue, chosen, per_key, keep), utcnow())

    fair = fair_turns.fair  # make a queue's claims take turns across its keys, weighted
    fair_queues = fair_turns.fair_queues  # the fair queues, their busiest keys

    def limits(self) -> dict[str, LimitStatus]:
        """Every queue's limits and how full they are now: running, started, room, held back."""
        store = flow_control_store(self.store, "read limits")
        return {status.queue: status for status in store.limit_status(utcnow())}

    def throttle(
        self, queue: str, seconds: float | timedelta, *, limit_key: str | None = None
    ) -> datetime:
        """Hold every ready job of ``queue`` (or of one ``limit_key`` in it) back for ``seconds``.

        What ``ctx.throttle`` does for a handler told "too many requests"; an
        operator's way to slow a partner's traffic down. A throttle is extended,
        never shortened, by another; ``seconds=0`` lifts it. Returns when it ends
        (on the store's clock).
        """
        flow_control_store(self.store, "throttle queues")
        validate_name("queue", queue)
        validate_name("limit_key", limit_key, optional=True)
        length = throttle_seconds(seconds, allow_zero=True)
        return self.runtime.throttle(queue, length, limit_key)

    # --- async twins ------------------------------------------------------------------
    # Every call above for asyncio code, run in a worker thread. Made from the sync
    # methods, so that their parameters cannot drift from them; a test checks that
    # every public method has its twin (or is listed as having none, and why).

    aenqueue = async_twin(enqueue)
    aenqueue_many = async_twin(enqueue_many)
    aget = async_twin(get)
    awhy = async_twin(why)
    ajobs = async_twin(jobs)
    aworkers = async_twin(workers)
    aknown_tasks = async_twin(known_tasks)
    aevents = async_twin(events)
    asteps = async_twin(steps)
    astats = async_twin(stats)
    abatch_status = async_twin(batch_status)
    ahealth = async_twin(health)
    acapabilities = async_twin(capabilities)
    acancel = async_twin(cancel)
    asignal = async_twin(signal)
    aretry = async_twin(retry)
    aretry_failed = async_twin(retry_failed)
    apurge = async_twin(purge)
    apurge_count = async_twin(purge_count)
    atrim = async_twin(trim)
    aunprocessed = async_twin(unprocessed)
    ahold = async_twin(hold)
    aunhold = async_twin(unhold)
    ahold_jobs = async_twin(hold_jobs)
    aunhold_jobs = async_twin(unhold_jobs)
    aheld_jobs = async_twin(held_jobs)
    amark_processed = async_twin(mark_processed)
    apause = async_twin(pause)
    aresume = async_twin(resume)
    acount_jobs = async_twin(count_jobs)
    acount_matching = async_twin(count_matching)
    aretry_jobs = async_twin(retry_jobs)
    acancel_jobs = async_twin(cancel_jobs)
    adelete_jobs = async_twin(delete_jobs)
    arun_jobs_now = async_twin(run_jobs_now)
    atake_back = async_twin(take_back)
    adelete_queue = async_twin(delete_queue)
    alimit = async_twin(limit)
    afair, afair_queues = async_twin(fair), async_twin(fair_queues)
    alimits, athrottle = async_twin(limits), async_twin(throttle)
    aenqueue_workflow = async_twin(enqueue_workflow)
    aworkflow = async_twin(workflow)
    aworkflows = async_twin(workflows)
    aworkflow_status = async_twin(workflow_status)
    acancel_workflow = async_twin(cancel_workflow)
    aretry_workflow = async_twin(retry_workflow)
    aparents, achildren = async_twin(parents), async_twin(children)
    aparent_edges = async_twin(parent_edges)
    aqueue_names = async_twin(queue_names)
    afinished_per_slot = async_twin(finished_per_slot)
    aperiodic_ticks = async_twin(periodic_ticks)
    aworkflow_of, aworkflow_edges = async_twin(workflow_of), async_twin(workflow_edges)
    athrottled_keys = async_twin(throttled_keys)
    aping, acontrol_worker = async_twin(ping), async_twin(control_worker)
    areencrypt = async_twin(reencrypt)
