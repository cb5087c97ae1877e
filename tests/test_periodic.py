"""Schedules (Cron, Every) and periodic tasks enqueued by the workers' maintenance."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from conveyor import App, ConfigurationError, JobState
from conveyor.schedule import Cron, Every, make_schedule
from conveyor.store.postgres import listener as pg_listener
from conveyor.worker.maintenance import Maintenance


@pytest.fixture(autouse=True)
def _prompt_listener_close(monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing an App waits for its LISTEN thread, which looks for a stop every ``_WAIT`` s."""
    monkeypatch.setattr(pg_listener, "_WAIT", 0.05)


@pytest.fixture
def sqlite_app(tmp_path: Path) -> Iterator[App]:
    with App(f"sqlite:///{tmp_path / 'jobs.db'}") as application:
        application.migrate()
        yield application


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


# --- Cron ------------------------------------------------------------------------------


def test_cron_fields() -> None:
    cron = Cron.parse("*/15 0-6,23 1,15 * 1-5")
    assert cron.minutes == {0, 15, 30, 45}
    assert cron.hours == {0, 1, 2, 3, 4, 5, 6, 23}
    assert cron.days == {1, 15}
    assert cron.months == set(range(1, 13))
    assert cron.weekdays == {1, 2, 3, 4, 5}
    assert Cron.parse("5/20 * * * *").minutes == {5, 25, 45}
    assert Cron.parse("0 0 * * 7").weekdays == {0}  # 7 is Sunday too
    assert Cron.parse("0 0 * * 0-7").weekdays == set(range(7))
    assert Cron.parse("  0   3 *  *   * ").hours == {3}


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("* * * *", "needs 5 fields"),
        ("* * * * * *", "needs 5 fields"),
        ("", "needs 5 fields"),
        ("60 * * * *", "minute field '60' is outside 0-59"),
        ("* 24 * * *", "hour field"),
        ("* * 0 * *", "day field"),
        ("* * 32 * *", "day field"),
        ("* * * 13 *", "month field"),
        ("* * * * 8", "weekday field"),
        ("5-1 * * * *", "minute field"),
        ("*/0 * * * *", "minute field"),
        ("a * * * *", "bad minute field 'a'"),
        ("1-2-3 * * * *", "bad minute field"),
        ("* * * jan *", "bad month field"),
        ("*/x * * * *", "bad minute field"),
        ("1,,2 * * * *", "bad minute field"),
    ],
)
def test_invalid_cron(expression: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("*", r"\*")):
        Cron.parse(expression)


@pytest.mark.parametrize(
    ("expression", "now", "last", "following"),
    [
        ("0 3 * * *", utc(2024, 5, 10, 12, 34, 56), utc(2024, 5, 10, 3, 0), utc(2024, 5, 11, 3, 0)),
        # exactly on a tick: that tick is the last one, the next is a day later
        ("0 3 * * *", utc(2024, 5, 10, 3, 0), utc(2024, 5, 10, 3, 0), utc(2024, 5, 11, 3, 0)),
        ("0 3 * * *", utc(2024, 5, 10, 2, 59, 59), utc(2024, 5, 9, 3, 0), utc(2024, 5, 10, 3, 0)),
        (
            "*/15 * * * *",
            utc(2024, 5, 10, 12, 44),
            utc(2024, 5, 10, 12, 30),
            utc(2024, 5, 10, 12, 45),
        ),
        # across a year and a leap day
        (
            "30 23 31 12 *",
            utc(2025, 1, 1, 0, 0),
            utc(2024, 12, 31, 23, 30),
            utc(2025, 12, 31, 23, 30),
        ),
        # weekdays only (2024-05-11 is a Saturday)
        ("0 9 * * 1-5", utc(2024, 5, 11, 12, 0), utc(2024, 5, 10, 9, 0), utc(2024, 5, 13, 9, 0)),
        # Sundays, written as 7
        ("0 0 * * 7", utc(2024, 5, 15), utc(2024, 5, 12), utc(2024, 5, 19)),
    ],
)
def test_cron_last_and_next_tick(
    expression: str, now: datetime, last: datetime, following: datetime
) -> None:
    cron = Cron.parse(expression)
    assert cron.last_tick(now) == last
    assert cron.next_tick(now) == following
    assert cron.matches(last) and cron.matches(following)


def test_cron_on_a_leap_day() -> None:
    """29 February comes round every four years (eight at most): it is a valid schedule.

    Today last_tick and next_tick search one year of minutes and raise "never
    matches" (a ConfigurationError) in three years out of four; in a worker's
    maintenance that aborts every round's periodic enqueues from that task on.
    """
    cron = Cron.parse("0 0 29 2 *")
    assert cron.last_tick(utc(2024, 3, 1)) == utc(2024, 2, 29)
    assert cron.last_tick(utc(2025, 6, 1)) == utc(2024, 2, 29)
    assert cron.next_tick(utc(2024, 3, 1)) == utc(2028, 2, 29)
    assert cron.next_tick(utc(2096, 3, 1)) == utc(2104, 2, 29)  # 2100 is no leap year


def test_yearly_cron_finds_ticks_a_year_apart() -> None:
    yearly = Cron.parse("0 0 1 1 *")
    assert yearly.last_tick(utc(2024, 12, 31, 23, 59)) == utc(2024, 1, 1)
    assert yearly.next_tick(utc(2024, 1, 1, 0, 1)) == utc(2025, 1, 1)
    assert yearly.last_tick(utc(2025, 1, 1)) == utc(2025, 1, 1)  # "at or before"


def test_cron_day_or_weekday() -> None:
    """With both day and weekday restricted, either one matching is enough (as in cron)."""
    cron = Cron.parse("0 0 13 * 5")  # the 13th, and every Friday
    assert cron.matches(utc(2024, 5, 13))  # a Monday, the 13th
    assert cron.matches(utc(2024, 5, 10))  # a Friday, the 10th
    assert cron.matches(utc(2024, 9, 13))  # a Friday the 13th
    assert not cron.matches(utc(2024, 5, 11))  # a Saturday, the 11th
    assert cron.next_tick(utc(2024, 5, 11)) == utc(2024, 5, 13)
    assert cron.next_tick(utc(2024, 5, 13)) == utc(2024, 5, 17)
    # With only one of them restricted, that one decides.
    fridays = Cron.parse("0 0 * * 5")
    assert not fridays.matches(utc(2024, 5, 13))
    assert fridays.matches(utc(2024, 5, 10))
    thirteenths = Cron.parse("0 0 13 * *")
    assert thirteenths.matches(utc(2024, 5, 13))
    assert not thirteenths.matches(utc(2024, 5, 10))


def test_cron_works_in_utc_whatever_the_zone_of_now() -> None:
    cron = Cron.parse("0 3 * * *")
    paris_summer = timezone(timedelta(hours=2))
    now = datetime(2024, 5, 10, 4, 30, tzinfo=paris_summer)  # 02:30 UTC
    assert cron.last_tick(now) == utc(2024, 5, 9, 3, 0)
    assert cron.next_tick(now) == utc(2024, 5, 10, 3, 0)


# --- Every ------------------------------------------------------------------------------


def test_every_ticks_on_multiples_of_the_interval() -> None:
    every = Every(timedelta(seconds=10))
    assert every.last_tick(utc(2024, 1, 1, 0, 0, 7)) == utc(2024, 1, 1, 0, 0, 0)
    assert every.next_tick(utc(2024, 1, 1, 0, 0, 7)) == utc(2024, 1, 1, 0, 0, 10)
    assert every.last_tick(utc(2024, 1, 1, 0, 0, 10)) == utc(2024, 1, 1, 0, 0, 10)
    hourly = Every(timedelta(hours=1))
    now = datetime(2024, 1, 1, 12, 30, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    assert hourly.last_tick(now) == utc(2024, 1, 1, 7, 0)  # 07:00 UTC
    # Every worker computes the same tick, whenever within the interval it looks.
    second = Every(timedelta(seconds=1))
    looks = [utc(2024, 1, 1, 0, 0, 5) + timedelta(milliseconds=ms) for ms in range(0, 1000, 100)]
    assert {second.last_tick(when) for when in looks} == {utc(2024, 1, 1, 0, 0, 5)}


def test_every_needs_at_least_a_second() -> None:
    with pytest.raises(ConfigurationError, match="at least one second"):
        Every(timedelta(milliseconds=500))
    assert make_schedule(5, None) == Every(timedelta(seconds=5))
    assert make_schedule(timedelta(minutes=1), None) == Every(timedelta(minutes=1))
    assert make_schedule(None, "0 3 * * *") == Cron.parse("0 3 * * *")
    with pytest.raises(ConfigurationError, match="either every"):
        make_schedule(None, None)
    with pytest.raises(ConfigurationError, match="either every"):
        make_schedule(5, "* * * * *")


def test_periodic_registration_checks_the_schedule(sqlite_app: App) -> None:
    app = sqlite_app
    with pytest.raises(ConfigurationError):
        app.periodic(cron="61 * * * *")
    with pytest.raises(ConfigurationError):
        app.periodic(every=0.5)

    @app.periodic(every=timedelta(minutes=5), queue="cron")
    def refresh() -> str:
        return "fresh"

    assert app.tasks["refresh"].queue == "cron"
    assert [p.task for p in app.periodic_tasks] == ["refresh"]
    assert refresh() == "fresh"


# --- enqueued by the maintenance ------------------------------------------------------------


def test_maintenance_enqueues_each_tick_once(app: App) -> None:
    @app.periodic(every=timedelta(minutes=1))
    def sweep() -> None: ...

    one = Maintenance(app.runtime, "one", lease=1)
    two = Maintenance(app.runtime, "two", lease=1)
    start = utc(2030, 1, 1, 0, 0, 30)
    one.run_once(start)
    one.run_once(start + timedelta(seconds=10))  # same tick
    # The leader is frozen past its lease; the next one finds the tick already enqueued.
    two.run_once(start + timedelta(seconds=10) + one.ttl * 3)
    two.run_once(start + timedelta(minutes=1))
    jobs = sorted(app.jobs(task="sweep"), key=lambda j: j.id)
    assert [j.key for j in jobs] == [
        "periodic:sweep:2030-01-01T00:00:00+00:00",
        "periodic:sweep:2030-01-01T00:01:00+00:00",
    ]
    assert [j.run_at for j in jobs] == [utc(2030, 1, 1, 0, 0), utc(2030, 1, 1, 0, 1)]


def test_two_workers_enqueue_each_tick_once(app: App) -> None:
    ran: list[int] = []

    @app.periodic(every=timedelta(seconds=1))
    def heartbeat() -> None:
        ran.append(1)

    first_second = int(time.time())
    with app.worker(lease=0.4, concurrency=2), app.worker(lease=0.4, concurrency=2):
        time.sleep(2.5)  # how long we watch, not a wait for something to happen
    last_second = int(time.time())
    jobs = app.jobs(task="heartbeat", limit=1000)
    ticks = sorted(j.run_at for j in jobs)
    keys = [j.key for j in jobs]
    # One job per tick: no tick was enqueued twice, by either worker.
    assert len(set(keys)) == len(keys) == len(set(ticks))
    assert all(
        key == f"periodic:heartbeat:{j.run_at.isoformat()}"
        for key, j in zip(keys, jobs, strict=True)
    )
    # Consecutive whole seconds, from when the workers started until they stopped.
    seconds = [int(t.timestamp()) for t in ticks]
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds)))
    assert first_second <= seconds[0] <= first_second + 1
    assert last_second - 1 <= seconds[-1] <= last_second
    assert len(seconds) >= 3
    # Every tick enqueued is run once (the last one may still be on its way).
    done = [j for j in jobs if app.get(j.id).state == JobState.SUCCEEDED]
    assert len(done) >= len(jobs) - 1
    assert len(ran) == len(done)
