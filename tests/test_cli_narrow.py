"""The command line at 80 columns: every name whole (wrapped or stacked, never cut with …),
and a failed job's row shows its error's message, not the exception's module path."""

from __future__ import annotations

from datetime import timedelta

from click.testing import CliRunner

from conveyor import App
from conveyor.cli import cli
from conveyor.job import utcnow
from outcomes import Failure

LONG_QUEUE = "partner-payments-for-the-european-union-customers"
LONG_TASK = "billing.partners.charge_the_card_of_a_customer_again"
WORKER = "build-host-eu-west-1a.example.internal:4242:0a1b2c3d"
ERROR = (
    "Traceback (most recent call last):\n  ...\n"
    "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='api.partner.example', "
    "port=443): Max retries exceeded"
)


def run(*args: str, columns: int = 80) -> str:
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def fill(app: App) -> int:
    failing = app.enqueue(LONG_TASK, [2], queue=LONG_QUEUE, max_attempts=1)
    app.enqueue(LONG_TASK, [1], queue=LONG_QUEUE, limit_key="customer-42")
    now = utcnow()
    (held,) = app.store.job_claim([LONG_QUEUE], 1, WORKER, timedelta(seconds=30), now)
    assert held.id == failing.id  # the oldest goes first
    app.store.job_finish([Failure(held.id, held.lease_token or "", ERROR, now)], now)
    app.limit(LONG_QUEUE, rate="1/m", concurrency=2)
    app.limit(LONG_QUEUE, rate="5/s", per_key=True)
    app.throttle(LONG_QUEUE, 60, limit_key="customer-42")
    app.store.worker_register(WORKER, "build-host", 4242, [LONG_QUEUE], 8, utcnow())
    return held.id


def whole(name: str, output: str) -> bool:
    """Whether ``name`` shows on one line, or folded across lines with nothing between."""
    lines = output.splitlines()
    if any(name in line for line in lines):
        return True
    return name in "".join("".join(output.split()))


def test_every_name_whole_at_80_columns(app: App, dsn: str) -> None:
    fill(app)
    for command in (["limits"], ["limit", LONG_QUEUE], ["stats"], ["jobs", "list"]):
        output = run(*command, "--dsn", dsn)
        assert all(len(line) <= 80 for line in output.splitlines()), (command, output)
        assert "…" not in output, (command, output)
        assert whole(LONG_QUEUE, output), (command, output)
    stats = run("stats", "--dsn", dsn)
    assert any(line.strip() == WORKER for line in stats.splitlines()), stats
    assert any(line.strip() == LONG_QUEUE for line in run("limits", "--dsn", dsn).splitlines())
    assert whole(LONG_TASK, run("jobs", "list", "--dsn", dsn))


def test_a_failed_jobs_row_shows_the_errors_message(app: App, dsn: str) -> None:
    failed = fill(app)
    narrow = run("jobs", "list", "--state", "failed", "--dsn", dsn)
    # The whole message, wrapped onto the next lines at 80 columns.
    assert "ConnectionError:HTTPSConnectionPool(host='api.partner.example',port=443):" in "".join(
        narrow.split()
    ), narrow
    # On a line per job, what the names leave of the error column starts with the message.
    wide = run("jobs", "list", "--state", "failed", "--dsn", dsn, columns=200)
    assert "ConnectionError: HTTPS" in wide, wide
    for listing in (narrow, wide):
        assert "requests.exceptions" not in listing and str(failed) in listing
    shown = run("jobs", "show", str(failed), "--dsn", dsn)
    # The full traceback stays on the job's page, module path and all.
    assert "requests.exceptions.ConnectionError: HTTPSConnectionPool" in shown
