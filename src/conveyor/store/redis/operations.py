"""OperatorStore on Redis: listings, counts, bulk actions, retries, purges, pauses."""

from __future__ import annotations

import heapq
import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from conveyor.job import Event, EventKind, Job, JobState, is_sealed
from conveyor.store.records import (
    FIRST_PAGE,
    TAKEN_BACK_ERROR,
    BatchStatus,
    Finish,
    JobSelection,
    Page,
    Purge,
    QueueStats,
    Stats,
    WorkerInfo,
)
from conveyor.store.redis.base import _dt, _event_and_start, _nm, _ts, _Where
from conveyor.store.redis.history import beyond_newest, count_matching
from conveyor.store.redis.limits import LimitsMixin
from conveyor.store.selection import NO_ID_BOUND, args_floor

TERMINAL = ("succeeded", "failed", "cancelled")
_STATES = ("waiting", "queued", "running", *TERMINAL)
#: Keys of one index read per round trip when Python walks it.
_CHUNK = 500

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


class OperationsMixin(LimitsMixin):
    """What an operator does to jobs and queues (``OperatorStore``)."""

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
        queues = [queue] if queue is not None else self._queue_names()
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

    def stats(self, now: datetime) -> Stats:
        names = self._queue_names()
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

    def _ids(self, job_ids: Sequence[int]) -> str:
        return json.dumps([str(i) for i in sorted(set(job_ids))])

    def job_retry_failed(
        self, queue: str | None, failed_before: datetime, now: datetime, limit: int = 1000
    ) -> list[int]:
        queues = [queue] if queue is not None else self._queue_names()

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
                    control=json.loads(row.get("control") or "{}"),
                )
            )
        workers.sort(key=lambda w: (w.started_at, w.id))
        return workers

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
        self, selection: JobSelection, now: datetime, page: Page = FIRST_PAGE
    ) -> list[Job]:
        out: list[Job] = []
        if page.limit <= 0:
            return out
        for job in self._selected(selection, now, page.before_id):
            out.append(job)
            if len(out) >= page.limit:
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
        names = [queue] if queue is not None else self._queue_names()
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

    def job_purge_where(self, purge: Purge, limit: int = 10_000) -> int:
        finished_before, states, queue = purge.finished_before, purge.states, purge.queue
        cutoff = f"({_ts(finished_before)}"
        walks = self._purge_walks
        ids = walks.candidates(self, cutoff, states, queue, limit, purge.by_policy)
        if queue is None and "failed" in states:
            self._forget_dropped(finished_before, limit)
        return len(self._delete(ids, finished_before, states, queue))

    def job_purge_count(self, purge: Purge) -> int:
        return count_matching(self, f"({_ts(purge.finished_before)}", purge.states, purge.queue)

    def job_purge_beyond(
        self, queue: str, keep: int, states: Sequence[str], limit: int = 10_000
    ) -> int:
        chosen = [state for state in TERMINAL if state in states]
        keys = [self._k("qs", _nm(queue), state) for state in chosen]
        ids = self._do(lambda: beyond_newest(self._client, keys, keep, limit))
        far_future = datetime(9999, 12, 31, tzinfo=UTC)
        # job_delete checks each job's state again: one retried meanwhile stays.
        return len(self._delete(ids, far_future, chosen, queue))

    def queue_delete(self, queue: str) -> None:
        self._do(lambda: self._client.srem(self._k("paused"), queue))


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
    if s.args and (
        is_sealed(job.args_json)  # ciphertext: never searched, so never found by chance
        or s.args.lower() not in f"{job.args_json} {job.kwargs_json}".lower()
    ):
        return False
    if s.state is not None and s.state != job.state:
        return job.state == JobState.QUEUED and job.detailed_state(now) == s.state
    return True
