"""The Redis store's reads of finished jobs are bounded, however many there are.

Retention, trims, the dashboard's chart and the ``/metrics`` histogram each
read a page at a time, only what they need, and (but for trims, which count)
in a script that answers with counts or the ids to delete. Measured on the server itself:
``INFO stats``' bytes sent to clients and ``INFO commandstats``' reads of job
hashes (``HGETALL``, ``HMGET``: the delete script's own reads included).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
import redis

from conveyor.job import NewJob
from conveyor.store.records import Finish, Purge
from conveyor.store.redis import RedisStore, history

pytestmark = pytest.mark.redis

T0 = datetime(2026, 1, 1, tzinfo=UTC)
#: Finished jobs in the store: several pages more than any round may read.
MANY = 4_000


@pytest.fixture
def store(redis_clean_dsn: str) -> Iterator[RedisStore]:
    opened = RedisStore(redis_clean_dsn, migrate=True)
    yield opened
    opened.close()


@pytest.fixture
def server(redis_clean_dsn: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_clean_dsn)
    yield client
    client.close()


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def finish(
    store: RedisStore, count: int, *, queue: str = "q", outcome: str = "complete", when: float = 10
) -> list[int]:
    """``count`` jobs of ``queue``, run from ``when - 1`` and ended at ``when``."""
    new = NewJob(queue=queue, task="t", args_json="[]", kwargs_json="{}", run_at=at(0))
    ids: list[int] = []
    for start in range(0, count, 1000):
        inserted = store.job_insert_many([new] * min(1000, count - start), at(0))
        claimed = store.job_claim([queue], len(inserted), "w", timedelta(hours=1), now=at(when - 1))
        assert len(claimed) == len(inserted)
        assert claimed[0].lease_token is not None
        ends = [
            Finish.complete(j.id, j.lease_token or "", None)
            if outcome == "complete"
            else Finish.fail(j.id, j.lease_token or "", "boom")
            for j in claimed
        ]
        assert len(store.job_finish(ends, at(when))) == len(claimed)
        ids += [j.id for j in claimed]
    return ids


def measured(server: redis.Redis) -> Callable[[], tuple[int, int]]:
    """From now on: ``() -> (bytes sent to clients, job hashes read)``."""

    def now() -> tuple[int, int]:
        sent = int(server.info("stats")["total_net_output_bytes"])
        stats = server.info("commandstats")
        reads = sum(
            int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("hgetall", "hmget")
        )
        return sent, reads

    start = now()

    def since() -> tuple[int, int]:
        sent, reads = now()
        return sent - start[0], reads - start[1]

    return since


def range_reads(server: redis.Redis) -> Callable[[], int]:
    """From now on: ``() -> ZRANGEBYSCORE commands run``."""

    def now() -> int:
        stats = server.info("commandstats")
        return int(stats.get("cmdstat_zrangebyscore", {}).get("calls", 0))

    start = now()
    return lambda: now() - start


def test_a_retention_round_reads_a_page_and_what_it_deletes(
    store: RedisStore, server: redis.Redis
) -> None:
    finish(store, MANY)
    cost = measured(server)
    assert store.job_purge_where(Purge(at(20), ["succeeded"]), limit=100) == 100
    sent, reads = cost()
    # The hundred oldest finished jobs read and deleted: no more.
    assert reads <= 2 * 100, reads
    assert sent < 10_000, sent  # every finished job loaded whole is several hundred kB
    assert len(server.zrange("{conveyor}:finished", 0, -1)) == MANY - 100


def test_a_rule_that_passes_over_kept_jobs_goes_on_where_it_stopped(
    store: RedisStore, server: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(history, "PURGE_WALK", 1_000)
    kept = finish(store, 3_000, outcome="fail", when=10)  # failed jobs are kept longer
    doomed = finish(store, 500, when=11)
    deleted = 0
    rounds = 0
    while deleted < len(doomed):
        rounds += 1
        assert rounds <= 7, "the rule never reached the jobs it deletes"
        cost = measured(server)
        deleted += store.job_purge_where(Purge(at(20), ["succeeded", "cancelled"]), limit=200)
        reads = cost()[1]
        assert reads <= 1_000 + history.PAGE + 200, (rounds, reads)
    assert deleted == len(doomed)
    assert {int(i) for i in server.zrange("{conveyor}:finished", 0, -1)} == set(kept)
    # With nothing left to delete, the next rounds walk again from the oldest, a
    # bounded stretch at a time, and delete nothing.
    for _ in range(4):
        assert store.job_purge_where(Purge(at(20), ["succeeded", "cancelled"])) == 0


def test_a_trim_reads_counts_and_what_it_deletes(store: RedisStore, server: redis.Redis) -> None:
    ids = finish(store, MANY)
    finish(store, 10, queue="other")
    cost = measured(server)
    assert store.job_purge_beyond("q", MANY - 50, ["succeeded", "failed", "cancelled"]) == 50
    sent, reads = cost()
    assert reads <= 2 * 50, reads  # the delete script's reads of what it deletes
    assert sent < 10_000, sent  # every id of the queue read is more than 20 kB
    left = {int(i) for i in server.zrange("{conveyor}:finished", 0, -1)}
    assert set(ids[:50]).isdisjoint(left)
    assert set(ids[50:]) <= left
    # Nothing beyond the newest: nothing to delete; keep 0 deletes a batch, oldest last.
    assert store.job_purge_beyond("q", MANY, ["succeeded"]) == 0
    assert store.job_purge_beyond("q", 0, ["succeeded"], limit=10) == 10
    left_now = {int(i) for i in server.zrange("{conveyor}:finished", 0, -1)}
    assert set(ids[-10:]).isdisjoint(left_now)


def test_a_trim_counts_the_states_together(store: RedisStore) -> None:
    failed = finish(store, 30, outcome="fail", when=10)
    succeeded = finish(store, 30, when=11)
    failed_later = finish(store, 30, outcome="fail", when=12)
    # The 40 newest of the queue, by id, whatever their state, are kept.
    assert store.job_purge_beyond("q", 40, ["succeeded", "failed"]) == 50
    kept = {j.id for j in store.job_get_many(failed + succeeded + failed_later)}
    assert kept == set(failed_later + succeeded[-10:])


def test_the_histogram_and_the_chart_count_in_the_server_a_page_at_a_time(
    store: RedisStore, server: redis.Redis
) -> None:
    finish(store, MANY, when=10)
    cost = measured(server)
    walks = range_reads(server)
    (bucket,) = store.job_run_time_histogram(at(0), at(20), [0.5, 5.0])
    assert (bucket.queue, bucket.bucket, bucket.count) == ("q", 1, MANY)
    assert bucket.total_seconds == pytest.approx(MANY * 1.0)
    rows = store.stats_finished_per_slot(at(0), timedelta(minutes=1))
    assert [(r.queue, r.state, r.slot, r.count) for r in rows] == [("q", "succeeded", 0, MANY)]
    sent, reads = cost()
    # A page at a time (each reply at most PAGE entries), not the window at once.
    assert walks() >= 2 * MANY // history.PAGE, walks()
    assert reads == 2 * MANY  # a few fields of each job, read in the server
    assert sent < 20_000, sent  # the counts (and INFO's own replies), not megabytes of jobs
