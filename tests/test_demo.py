"""``conveyor demo`` end to end: two real worker processes, one killed with SIGKILL."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from conveyor import App, JobState
from conveyor.cli import cli
from conveyor.cli.demo import Workload
from conveyor.job import utcnow

#: Whole processes started and killed: left out of the fast inner loop.
pytestmark = pytest.mark.slow

JOBS = 400


def test_demo_finishes_everything_and_rescues_the_killed_workers_jobs(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'demo.db'}"
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "conveyor",
            "demo",
            "--dsn",
            dsn,
            "--jobs",
            str(JOBS),
            "--no-report",
        ],
        cwd=tmp_path,
        env={**os.environ, "CONVEYOR_DSN": "sqlite:///not-this-one.db"},
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    assert elapsed < 100
    out = result.stdout
    assert "killed worker 1" in out and "with SIGKILL" in out
    assert "rescued all" in out
    assert f"conveyor dashboard --dsn {dsn}" in out
    assert f"conveyor jobs list --state retrying --dsn {dsn}" in out
    assert "scheduled 5 (reminders deferred by an hour), retrying 3" in out
    assert not (tmp_path / "not-this-one.db").exists()

    work = Workload(JOBS)
    with App(dsn) as app:
        stats = app.stats()
        assert stats.count("running") == 0
        assert sum(stats.count(s) for s in JobState) == JOBS
        # Only the reminders are left, deferred by an hour (scheduled), and the rate
        # fetches, whose first attempt failed and whose next is 15 minutes away (retrying).
        scheduled = app.jobs(state="scheduled", limit=1000)
        assert {j.task for j in scheduled} == {"send_reminder"}
        assert len(scheduled) == work.reminders
        assert all(j.run_at > utcnow() + timedelta(minutes=30) for j in scheduled)
        retrying = app.jobs(state="retrying", limit=1000)
        assert {j.task for j in retrying} == {"fetch_rates"}
        assert len(retrying) == work.rate_fetches
        assert all(j.attempts == 1 and "ConnectionError" in (j.error or "") for j in retrying)
        assert stats.count("queued") == work.reminders + work.rate_fetches
        # The declined charges failed for good, after both attempts, with a traceback.
        failed = app.jobs(state="failed", limit=1000)
        assert {j.task for j in failed} == {"charge_card"}
        assert len(failed) == work.declined_charges
        assert all(
            j.attempts == 2 and "ValueError: card of customer" in (j.error or "") for j in failed
        )
        # Flaky partner calls succeeded on a later attempt.
        partner = app.jobs(task="call_partner", limit=1000)
        assert len(partner) == work.partner_calls
        assert all(j.state == JobState.SUCCEEDED and j.attempts >= 2 for j in partner)
        assert stats.count("succeeded") == (
            JOBS - work.reminders - work.declined_charges - work.rate_fetches
        )

        # The killed worker's jobs: rescued, then finished by the other worker.
        events = app.store.event_since(0, 100_000)
        rescued_ids = {e.job_id for e in events if e.kind == "rescued"}
        assert rescued_ids
        for job_id in rescued_ids:
            job = app.get(job_id)
            assert job.terminal
            history = app.events(job_id)
            # In history order (a claim carries the seq of the event that ended it).
            at = next(i for i, e in enumerate(history) if e.kind == "rescued")
            lost_worker = [e for e in history[:at] if e.kind == "claimed"][-1].worker
            later = [e for e in history[at:] if e.kind == "claimed"]
            assert later and later[-1].worker != lost_worker
        assert any(app.get(i).state == JobState.SUCCEEDED for i in rescued_ids)

        # The device's updates ran one at a time, in the order they were enqueued.
        group = sorted(app.jobs(task="sync_device", limit=1000), key=lambda j: j.id)
        assert len(group) == work.device_updates
        # The stored log has one event per attempt's end (its start on it): the
        # first attempt of each update ended in the order they were enqueued.
        first_ends = {}
        for e in events:
            if e.kind not in ("enqueued", "claimed") and e.task == "sync_device":
                first_ends.setdefault(e.job_id, e.seq)
        assert [first_ends[j.id] for j in group] == sorted(first_ends.values())
        # Event order is commit order: an update ended only after the one before it.
        # (Timestamps are read before a transaction waits for the lock: not comparable here.)
        succeeded = {e.job_id: e.seq for e in events if e.kind == "succeeded"}
        for before, after in itertools.pairwise(group):
            assert succeeded[before.id] < first_ends[after.id]


def test_demo_refuses_a_database_that_holds_jobs(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'busy.db'}"
    with App(dsn) as app:
        app.enqueue("precious", [1])
    result = CliRunner().invoke(cli, ["demo", "--dsn", dsn, "--jobs", "200", "--no-report"])
    assert result.exit_code == 1
    assert "already holds 1 jobs" in result.stderr and "Traceback" not in result.stderr
    with App(dsn) as app:
        assert [j.task for j in app.jobs()] == ["precious"]
