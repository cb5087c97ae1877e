"""Redis: the sets that mirror each job's own keys (retaining, parked) rebuilt by
``RedisStore.repair_sets`` after they were lost."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import redis

from conveyor.job import NewJob
from conveyor.retain import resolve_retain
from conveyor.store.dsn import open_store
from conveyor.store.records import Finish, Lease
from conveyor.store.redis import RedisStore

NOW = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)


def _job(retain: object = None) -> NewJob:
    return NewJob("q", "t", "[]", "{}", run_at=NOW, retain=resolve_retain(retain))


def test_repair_rebuilds_the_retaining_and_parked_sets(redis_clean_dsn: str) -> None:
    store = open_store(redis_clean_dsn)
    assert isinstance(store, RedisStore)
    client = redis.Redis.from_url(redis_clean_dsn)
    try:
        store.migrate()
        kept, plain, sleeper = store.job_insert_many(
            [_job({"succeeded": 10}), _job(), _job({"failed": 5})], NOW
        )
        claimed = store.job_claim(["q"], 3, "w", LEASE, NOW)
        leases = {j.id: Lease(j.id, j.lease_token or "") for j in claimed}
        done = [Finish.complete(i, leases[i].token, "1") for i in (kept.id, plain.id)]
        assert store.job_finish(done, NOW) == [kept.id, plain.id]
        until = NOW + timedelta(seconds=60)
        assert store.sleep_mark(leases[sleeper.id], "sleep-1", until, NOW) == until
        store.job_finish([Finish.snooze(sleeper.id, leases[sleeper.id].token, until)], NOW)
        later = NOW + timedelta(seconds=1)

        before = client.zrange("{conveyor}:retaining", 0, -1, withscores=True)
        assert [(int(i), s) for i, s in before] == [(kept.id, NOW.timestamp() + 10)]
        assert store.parked_counts(later) == {"q": 1}

        # Lost, and a stray entry of each left behind: the repair puts them right.
        client.delete("{conveyor}:retaining", "{conveyor}:parked")
        client.zadd("{conveyor}:retaining", {str(plain.id): 1})
        client.sadd("{conveyor}:parked", str(plain.id))
        assert store.parked_counts(later) == {}

        assert store.repair_sets() == {"retaining": 1, "parked": 1}
        after = client.zrange("{conveyor}:retaining", 0, -1, withscores=True)
        assert after == before
        assert client.smembers("{conveyor}:parked") == {str(sleeper.id).encode()}
        assert store.parked_counts(later) == {"q": 1}
        # The round finds the kept job again, when its rule has run out.
        assert store.job_purge_retained(NOW + timedelta(seconds=9)) == 0
        assert store.job_purge_retained(NOW + timedelta(seconds=10)) == 1
        assert store.job_get(kept.id) is None and store.job_get(plain.id) is not None
        # Nothing to put right: the same answer.
        assert store.repair_sets() == {"retaining": 0, "parked": 1}
    finally:
        client.close()
        store.close()
