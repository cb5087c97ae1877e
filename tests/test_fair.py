"""Fair turns (app.fair): claims of a fair queue take ready jobs from its keys in turn,
weighted, on every store; counted, never timed.

The claims are the store's own (``job_claim``), so each test counts exactly which
keys every claim started; the fleet test runs real worker processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import fair_app
from conveyor import App, JobState
from conveyor.cli import cli
from conveyor.errors import ConfigurationError, InvalidJobError
from conveyor.fair import Aging
from conveyor.job import NewJob, utcnow
from conveyor.store.dsn import DSN_ENV

LEASE = timedelta(minutes=5)
TESTS_DIR = Path(__file__).resolve().parent


def _jobs(
    queue: str,
    key: str | None,
    count: int,
    priority: int = 0,
    run_at: datetime | None = None,
    **more: object,
) -> list[NewJob]:
    now = run_at or utcnow()
    return [
        NewJob(task="t", queue=queue, limit_key=key, priority=priority, args_json="[]",
               kwargs_json="{}", run_at=now, **more)  # type: ignore[arg-type]
        for _ in range(count)
    ]  # fmt: skip


def _claim(app: App, queue: str, jobs: int, per_claim: int = 10) -> Counter[str | None]:
    """Keys of ``jobs`` jobs claimed ``per_claim`` at a time."""
    started: Counter[str | None] = Counter()
    while sum(started.values()) < jobs:
        got = app.store.job_claim([queue], per_claim, "w", LEASE)
        assert got, f"the queue ran dry after {started}"
        started.update(j.limit_key for j in got)
    return started


def test_latecomers_get_turns_before_a_backlog(app: App) -> None:
    app.fair("q")
    app.enqueue_many(_jobs("q", "A", 20_000))
    assert _claim(app, "q", 50) == {"A": 50}
    app.enqueue_many(_jobs("q", "B", 100) + _jobs("q", "C", 100))
    started: Counter[str | None] = Counter()
    while started["B"] + started["C"] < 200:
        got = app.store.job_claim(["q"], 10, "w", LEASE)
        assert got
        started.update(j.limit_key for j in got)
    # Equal weights: A had a third of the starts meanwhile (and a claim's worth more).
    assert started["A"] <= 110, started
    assert started["B"] == started["C"] == 100


def test_weights_split_starts(app: App) -> None:
    app.fair("q", weights={"gold": 3})
    app.enqueue_many(_jobs("q", "gold", 3000) + _jobs("q", "A", 3000))
    started = _claim(app, "q", 2000, per_claim=25)
    assert abs(started["gold"] / started["A"] - 3) < 3 * 0.05, started


def test_the_default_weight_and_many_keys(app: App) -> None:
    app.fair("q", weights={"big": 1}, default_weight=0.5)
    jobs = _jobs("q", "big", 400)
    for n in range(20):
        jobs += _jobs("q", f"small-{n}", 20)
    app.enqueue_many(jobs)
    started = _claim(app, "q", 300, per_claim=30)
    # 20 keys of weight 0.5 share 10/11 of the starts; "big" 1/11.
    assert 300 / 11 - 10 <= started["big"] <= 300 / 11 + 10, started
    smalls = [started[f"small-{n}"] for n in range(20)]
    assert max(smalls) - min(smalls) <= 3, smalls


def test_jobs_without_a_key_share_one_turn(app: App) -> None:
    # Looked for among the first 200 ready jobs of the queue (on Redis, as many as
    # the claim takes); further back, they come into reach as the jobs ahead start.
    app.fair("q")
    app.enqueue_many(_jobs("q", "A", 60))
    app.enqueue_many(_jobs("q", None, 50))
    started = app.store.job_claim(["q"], 100, "w", LEASE)
    assert 40 <= Counter(j.limit_key for j in started)[None] <= 50, started


def test_priority_comes_before_turns(app: App) -> None:
    app.fair("q")
    app.enqueue_many(_jobs("q", "A", 100))
    app.enqueue_many(_jobs("q", "A", 5, priority=10) + _jobs("q", "B", 20))
    first = app.store.job_claim(["q"], 5, "w", LEASE)
    assert [j.priority for j in first] == [10] * 5
    # A took those turns: B's jobs come next, alternating with A's.
    following = Counter(j.limit_key for j in app.store.job_claim(["q"], 10, "w", LEASE))
    assert following["B"] >= 5, following


def test_a_key_that_comes_back_has_saved_no_turns(app: App) -> None:
    app.fair("q")
    app.enqueue_many(_jobs("q", "B", 10))
    assert _claim(app, "q", 10) == {"B": 10}
    app.enqueue_many(_jobs("q", "A", 300))
    assert _claim(app, "q", 100) == {"A": 100}
    app.enqueue_many(_jobs("q", "B", 100))
    # B is back: it alternates with A, it does not take 100 turns in a row.
    started = _claim(app, "q", 40)
    assert 15 <= started["B"] <= 25, started


def test_groups_holds_and_pauses_hold_in_a_fair_queue(app: App) -> None:
    app.fair("q")
    grouped = app.enqueue_many(_jobs("q", "A", 5, group="g"))
    held = app.enqueue_many(_jobs("q", "B", 3))
    for job in held:
        app.hold(job.id)
    app.enqueue_many(_jobs("q", "C", 3))
    got = app.store.job_claim(["q"], 20, "w", LEASE)
    # One job of the group at a time; no held job; all of C.
    assert sorted(j.id for j in got if j.limit_key == "A") == [grouped[0].id]
    assert Counter(j.limit_key for j in got) == {"A": 1, "C": 3}
    app.pause("q")
    app.enqueue_many(_jobs("q", "D", 3))
    assert app.store.job_claim(["q"], 20, "w", LEASE) == []
    app.resume("q")
    assert Counter(j.limit_key for j in app.store.job_claim(["q"], 20, "w", LEASE)) == {"D": 3}


def test_a_per_key_limit_holds_in_a_fair_queue(app: App) -> None:
    app.fair("q")
    app.limit("q", concurrency=2, per_key=True)
    app.enqueue_many(_jobs("q", "A", 50) + _jobs("q", "B", 50))
    got = app.store.job_claim(["q"], 20, "w", LEASE)
    assert Counter(j.limit_key for j in got) == {"A": 2, "B": 2}


def test_unfair_queues_beside_a_fair_one_are_claimed_as_before(app: App) -> None:
    app.fair("fair")
    app.enqueue_many(_jobs("plain", "A", 30) + _jobs("plain", "B", 5))
    app.enqueue_many(_jobs("fair", "A", 30) + _jobs("fair", "B", 5))
    got = app.store.job_claim(["plain"], 10, "w", LEASE)
    assert Counter(j.limit_key for j in got) == {"A": 10}  # oldest first
    both = app.store.job_claim(["fair", "plain"], 20, "w", LEASE)
    assert Counter(j.limit_key for j in both if j.queue == "fair")["B"] == 5


def test_a_queue_made_unfair_claims_in_order_again(app: App) -> None:
    app.fair("q", weights={"B": 5})
    assert app.fair("q", enabled=False) is None
    assert app.store.fair_status(None, utcnow()) == []  # type: ignore[attr-defined]
    app.enqueue_many(_jobs("q", "A", 30) + _jobs("q", "B", 5))
    time.sleep(1.1)
    assert Counter(j.limit_key for j in app.store.job_claim(["q"], 10, "w", LEASE)) == {"A": 10}


def test_what_a_fair_queue_says_of_its_keys(app: App) -> None:
    app.fair("q", weights={"gold": 3})
    app.enqueue_many(_jobs("q", "gold", 100) + _jobs("q", "A", 100) + _jobs("q", None, 4))
    _claim(app, "q", 80)
    seen = app.fair_queues()["q"]
    assert seen.weights == {"gold": 3.0} and seen.default_weight == 1.0
    keys = {k.key: k for k in seen.keys}
    assert keys["gold"].starts + keys["A"].starts + keys[None].starts == 80
    assert keys["gold"].queued == 100 - keys["gold"].starts
    assert 0.6 < seen.share(keys["gold"]) < 0.8
    assert app.fair_queues("other") == {}


@pytest.mark.parametrize(
    ("weights", "default", "message"),
    [
        ({"gold": 0}, 1, "above 0"),
        ({"gold": "3"}, 1, "must be a number"),
        ({"": 3}, 1, "must not be empty"),
        ({"gold": 3}, -1, "above 0"),
        ({"gold": float("nan")}, 1, "above 0"),
        (["gold"], 1, "mapping"),
    ],
)
def test_bad_settings_are_refused(app: App, weights: object, default: object, message: str) -> None:
    with pytest.raises((ConfigurationError, InvalidJobError), match=message):
        app.fair("q", weights=weights, default_weight=default)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="takes no weights"):
        app.fair("q", weights={"a": 1}, enabled=False)


def test_a_key_is_data_never_syntax(app: App) -> None:
    odd = ["$.x", "a'b", 'q"}', "a b", "[0]", "ключ"]
    app.fair("q", weights={odd[0]: 3})
    for key in odd:
        app.enqueue_many(_jobs("q", key, 30))
    started = _claim(app, "q", 60)
    assert set(started) == set(odd)
    assert started[odd[0]] >= 3 * min(started[k] for k in odd[1:]) - 3


# --------------------------------------------------------------------------- aging


def _starved_until(app: App, queue: str) -> int | None:
    """Seconds until a priority-0 job starts under a stream of priority-3 jobs (each
    5 s, more than a claim takes), on a clock the test moves; None: never (2 min)."""
    start = utcnow()
    (low,) = app.enqueue_many(_jobs(queue, "A", 1, run_at=start))
    for second in range(0, 120, 5):
        at = start + timedelta(seconds=second)
        app.enqueue_many(_jobs(queue, "A", 6, priority=3, run_at=at))
        claimed = app.store.job_claim([queue], 5, "w", LEASE, now=at)
        assert len(claimed) == 5
        if low.id in {j.id for j in claimed}:
            return second
    return None


def test_aging_lifts_a_job_starved_by_a_stream_of_higher_ones(app: App) -> None:
    app.fair("plain")
    assert _starved_until(app, "plain") is None
    # One level a 10 s, up to 5: level with the stream at 30 s, and the older.
    app.fair("aged", aging=Aging(every=timedelta(seconds=10), step=1, cap=5))
    assert _starved_until(app, "aged") == 30
    app.fair("stepped", aging=Aging(every=20, step=3, cap=3))
    assert _starved_until(app, "stepped") == 20
    assert app.fair_queues()["aged"].aging == Aging(10.0, 1, 5)
    assert app.fair_queues()["plain"].aging is None


@pytest.mark.parametrize(
    ("aging", "message"),
    [
        (Aging(every=0), "above 0"),
        (Aging(every=timedelta(0)), "above 0"),
        (Aging(every="1m"), "seconds or a timedelta"),  # type: ignore[arg-type]
        (Aging(every=5, step=0), "step must be a whole number"),
        (Aging(every=5, cap=1.5), "cap must be a whole number"),  # type: ignore[arg-type]
        ({"every": 5}, "must be an Aging"),
    ],
)
def test_bad_aging_is_refused(app: App, aging: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        app.fair("q", aging=aging)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- a fleet


@contextmanager
def worker_processes(dsn: str, logs: Path, count: int = 4) -> Iterator[None]:
    """``count`` processes of ``conveyor worker fair_app:app``, each at concurrency 10."""
    env = {
        **os.environ,
        "CONVEYOR_DSN": dsn,
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    argv = [sys.executable, "-m", "conveyor", "worker", "fair_app:app", "--queues", "shared"]
    argv += ["--concurrency", "10", "--log-level", "WARNING"]
    procs: list[subprocess.Popen[bytes]] = []
    with ExitStack() as files:
        try:
            for n in range(count):
                log = files.enter_context(open(logs / f"worker-{n}.log", "wb"))
                procs.append(
                    subprocess.Popen(
                        argv, cwd=TESTS_DIR, env=env, stdin=subprocess.DEVNULL, stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )  # fmt: skip
            yield
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=60)


@pytest.mark.slow
def test_four_worker_processes_share_the_turns(dsn: str, tmp_path: Path) -> None:
    with fair_app.build(dsn) as app, ExitStack() as stack:
        app.migrate()
        app.fair("shared")
        backlog = [
            NewJob(task=fair_app.TASK, queue="shared", limit_key="A", args_json="[]",
                   kwargs_json="{}", run_at=utcnow())
            for _ in range(20_000)
        ]  # fmt: skip
        a_backlog = app.enqueue_many(backlog)
        stack.enter_context(worker_processes(dsn, tmp_path))
        # The workers are busy with A's backlog...
        deadline = time.monotonic() + 60
        while app.stats().count("succeeded", "shared") < 200:
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.05)
        late = app.enqueue_many(
            [
                NewJob(
                    task=fair_app.TASK,
                    queue="shared",
                    limit_key=key,
                    args_json="[]",
                    kwargs_json="{}",
                    run_at=utcnow(),
                )
                for key in ("B", "C")
                for _ in range(100)
            ]
        )
        deadline = time.monotonic() + 60
        while app.stats().count("succeeded", "shared") < 200 + len(late) or not all(
            j.state == JobState.SUCCEEDED for j in app.store.job_get_many([j.id for j in late])
        ):
            assert time.monotonic() < deadline, "B and C did not all run"
            time.sleep(0.05)
        # From the first start of B and C (their enqueue's commit, give or take
        # one claim: on SQLite the enqueue waits for the claims' write lock).
        starts = [j.started_at for j in app.store.job_get_many([j.id for j in late])]
        first, last = min(at for at in starts if at), max(at for at in starts if at)
        a_jobs = app.store.job_get_many([j.id for j in a_backlog])
        a_meanwhile = sum(1 for j in a_jobs if j.started_at and first <= j.started_at <= last)
        # Equal weights: A's share of the starts is a third (and the claims in
        # flight when the last of B and C started).
        assert a_meanwhile < 300, a_meanwhile


# --------------------------------------------------------------------------- the command line


def _cli(*args: str, code: int = 0) -> Result:
    env: dict[str, str | None] = {DSN_ENV: os.environ.get(DSN_ENV)}
    result = CliRunner().invoke(cli, list(args), env=env)
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    return result


def test_the_command_line_makes_a_queue_fair_and_shows_it(app: App, dsn: str) -> None:
    app.enqueue_many(_jobs("q", "gold", 30) + _jobs("q", "A", 30))
    said = _cli("--dsn", dsn, "queues", "fair", "q", "--weight", "gold=3", "--weight", "x=y=2")
    assert (
        "queue q is fair by fair_key (by default limit_key): default weight 1; gold=3, x=y=2"
        in said.stdout
    )
    time.sleep(1.1)  # what a store read of fair queues, it trusts for a second
    _claim(app, "q", 20)
    shown = json.loads(_cli("--dsn", dsn, "queues", "show", "q", "--json").stdout)
    assert shown["fair"]["weights"] == {"gold": 3.0, "x=y": 2.0}
    keys = {k["key"]: k for k in shown["fair"]["keys"]}
    assert keys["gold"]["starts"] + keys["A"]["starts"] == 20
    assert keys["gold"]["queued"] == 30 - keys["gold"]["starts"]
    assert 0.65 <= keys["gold"]["recent_share"] <= 0.85
    text = _cli("--dsn", dsn, "queues", "show", "q").stdout
    assert (
        "fair: by fair_key (by default limit_key), default weight 1, weights gold=3, x=y=2" in text
    )
    assert "gold" in text and "(no key)" not in text
    bad = _cli("--dsn", dsn, "queues", "fair", "q", "--weight", "gold=0", code=2)
    assert "must be above 0" in bad.stderr
    assert _cli("--dsn", dsn, "queues", "fair", "q", "--weight", "gold", code=2)
    _cli("--dsn", dsn, "queues", "fair", "q", "--off")
    assert "fair: no" in _cli("--dsn", dsn, "queues", "show", "q").stdout
    assert [e.action for e in app.store.audit_list(2)] == ["fair off", "fair"]  # type: ignore[attr-defined]
