"""Bad input meets conveyor's own error, saying what is allowed, and loses nothing; and a
job an operator took back is not handed out by a batch claimed before."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conveyor import App, ConfigurationError, InvalidJobError, JobState
from conveyor.store.dsn import open_store
from conveyor.store.postgres.choices import check_choices


def test_an_after_id_no_job_can_have_is_refused_before_anything_is_written(app: App) -> None:
    parent = app.enqueue("t", [])
    for bad in (2**63, -1, 0, True, 1.0):
        with pytest.raises(InvalidJobError, match="integers from 1 to 9223372036854775807"):
            app.enqueue("t", [], after=[parent, bad])
    # The largest id is an id: refused only as a job that does not exist.
    with pytest.raises(InvalidJobError, match="9223372036854775807"):
        app.enqueue("t", [], after=[2**63 - 1])
    assert [j.id for j in app.jobs(queue="default")] == [parent.id]


def test_every_32_bit_priority_is_taken_and_none_beyond(app: App) -> None:
    low = app.enqueue("t", [], priority=-(2**31))
    high = app.enqueue("t", [], priority=2**31 - 1)
    assert (app.get(low.id).priority, app.get(high.id).priority) == (-(2**31), 2**31 - 1)
    for bad in (-(2**31) - 1, 2**31):
        with pytest.raises(InvalidJobError, match=r"-2147483648 to 2147483647"):
            app.enqueue("t", [], priority=bad)
    claimed = app.store.job_claim(["default"], 2, "w", __import__("datetime").timedelta(60))
    assert [j.id for j in claimed] == [high.id, low.id]


def test_trim_refuses_a_keep_that_is_no_count_of_jobs(app: App, tmp_path: Path) -> None:
    for bad in (1.5, -1, "3", None, {"default": 1}, 10**12):
        with pytest.raises(ConfigurationError, match="keep must be a whole number of jobs"):
            app.trim("default", keep=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="keep_finished must be a whole number"):
        App(f"sqlite:///{tmp_path / 'other.db'}", keep_finished=2.5)  # type: ignore[arg-type]
    assert not (tmp_path / "other.db").exists()  # refused before the store was opened


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("sslmode=bogus", "sslmode= in the PostgreSQL DSN is 'bogus'; it must be one of disable"),
        ("target_session_attrs=primry", "target_session_attrs= .* 'primry'"),
        ("gssencmode=REQUIRE", "gssencmode= .* 'REQUIRE'"),
    ],
)
def test_a_dsn_setting_libpq_refuses_is_configuration_not_an_outage(
    pg_dsn: str, query: str, says: str
) -> None:
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match=says):
        open_store(f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}{query}", connect_timeout=10)
    assert time.monotonic() - started < 5  # refused at once, not retried as an outage


def test_a_setting_from_the_environment_is_checked_too() -> None:
    with pytest.raises(ConfigurationError, match=r"\$PGSSLMODE is 'nope'"):
        check_choices({}, {"PGSSLMODE": "nope"})
    check_choices({"sslmode": "verify-full"}, {"PGSSLMODE": "nope"})  # the DSN's own wins
    check_choices({}, {})


def test_a_batched_job_taken_back_is_not_handed_out(app: App) -> None:
    jobs = [app.enqueue("line", [n], queue="lines") for n in range(3)]
    consumer = app.consume(["lines"], lease=60, poll_interval=0.1, batch_size=3, idle_timeout=0.5)
    seen: list[int] = []
    for held in consumer:
        if not seen:
            # The rest of the batch waits under this consumer; an operator takes one back
            # long before the next renewal (a third of the lease).
            waiting = sorted(
                j.id for j in app.jobs(state="running", queue="lines") if j.id != held.id
            )
            taken = waiting[0]
            assert app.take_back([taken]) == 1
        seen.append(held.id)
        held.complete()
        if len(seen) == 3:
            break
    consumer.close()
    # Handed out again only by a later claim, under a fresh lease, never from the old batch.
    assert sorted(seen) == sorted(j.id for j in jobs)
    events = [e.kind for e in app.events(taken)]
    assert events.count("succeeded") == 1
    assert app.get(taken).attempts == 2
    for job in jobs:
        assert app.get(job.id).state == JobState.SUCCEEDED
