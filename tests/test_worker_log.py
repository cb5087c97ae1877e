"""What the worker's log says of each finished job: the past as "took", the future as "in"."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from conveyor import App, FixedBackoff, JobFailed
from conveyor.worker import Context


def test_a_retry_says_when_it_runs_and_how_long_the_attempt_took(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with App(f"sqlite:///{tmp_path}/log.db") as app:
        app.migrate()

        @app.task(max_attempts=2, backoff=FixedBackoff(2.0))
        def flaky(ctx: Context) -> None:
            raise ValueError(f"boom on attempt {ctx.attempt}")

        @app.task()
        def fine() -> int:
            return 1

        with caplog.at_level(logging.INFO, logger="conveyor.worker"), app.worker(concurrency=1):
            ok = fine.enqueue()
            ok.wait(timeout=20)
            job = flaky.enqueue()
            with pytest.raises(JobFailed):
                job.wait(timeout=20)
    lines = [r.getMessage() for r in caplog.records if r.name == "conveyor.worker"]
    retried = next(line for line in lines if f"job {job.id} " in line and "retry" in line)
    # "retry in 2.0 s": a wait ahead; "took 1.2 ms": the attempt just ended.
    assert re.search(r"failed, retry in [12]\.\d s, took \d+\.\d ms \(attempt 1/2\)", retried)
    assert retried.endswith("ValueError: boom on attempt 1")
    assert "retried in" not in " ".join(lines)
    final = next(line for line in lines if f"job {job.id} " in line and "attempt 2/2" in line)
    assert re.search(r"failed, took \d+\.\d ms \(attempt 2/2\): ValueError", final)
    done = next(line for line in lines if f"job {ok.id} " in line)
    assert re.search(r"succeeded, took \d+\.\d ms \(attempt 1/\d+\)$", done)
