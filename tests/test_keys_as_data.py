"""A key is data, never syntax: limit keys, groups, idempotency keys and queue names made
of any text (JSON path, LIKE, glob and format characters, quotes, newlines) go through
enqueue, a limited claim, stats and the dashboard on every store, and NUL, which no store
keeps, is refused before anything is written (docs/architecture.md, "Flow control in the
claim")."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from markupsafe import escape
from starlette.testclient import TestClient

from conveyor import App
from conveyor.cli import cli
from conveyor.errors import InvalidJobError
from conveyor.web import create_app
from conveyor.web.metrics import escape_label

BASE = "http://127.0.0.1"

#: The characters some syntax gives a meaning to, often enough to meet each other.
SYNTAX = [*"$\".[]*%_\\{}\n\r\t:?^#/'`&<>", "$.", '$."', "[0]", "%s", "{0}", "%%"]

KEYS = (
    st.lists(
        st.one_of(
            st.sampled_from(SYNTAX),
            # Any character a database can store: no NUL, no lone surrogate.
            st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
        ),
        min_size=1,
        max_size=8,
    )
    .map("".join)
    .filter(lambda text: text.strip() != "" and len(text) <= 200)
)

_examples = itertools.count()


def test_limit_keys_groups_keys_and_queues_are_data(app: App) -> None:
    with TestClient(create_app(app), base_url=BASE) as client:

        @settings(
            max_examples=25,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @given(key=KEYS, name=KEYS)
        # A key SQLite's ->> read as a JSON path, a quote, and a name with a newline.
        @example(key="$", name="q")
        @example(key='$."a"[0]', name='"')
        @example(key="t\\%_*", name="tenant\n")
        def check(key: str, name: str) -> None:
            # A fresh queue per example, its name arbitrary text too; groups span
            # queues, so each example's group is its own.
            n = next(_examples)
            queue, group = f"{n}{name}"[:200], f"{n}{key}"[:200]
            app.limit(queue, concurrency=1, per_key=True)
            by_key = [app.enqueue("t", [n], queue=queue, limit_key=key) for n in range(2)]
            by_group = [app.enqueue("t", [n], queue=queue, group=group) for n in range(2)]
            keyed = app.enqueue("t", [0], queue=queue, key=key)
            assert app.enqueue("t", [1], queue=queue, key=key).id == keyed.id

            lease = timedelta(seconds=60)
            first = {j.id for j in app.store.job_claim([queue], 10, "w", lease)}
            # One job per limit key at once, one per group at once: the oldest of each.
            assert first == {by_key[0].id, by_group[0].id, keyed.id}
            assert app.store.job_claim([queue], 10, "w", lease) == []
            assert app.get(by_key[0].id).limit_key == key
            assert app.get(by_group[0].id).group == group

            stats = app.stats()
            assert stats.count("running", queue) == 3
            assert stats.count("queued", queue) == 2
            assert stats.limits[queue].running == 3

            app.throttle(queue, 600, limit_key=key)
            assert app.limits()[queue].keys_throttled == 1

            overview = client.get("/")
            assert overview.status_code == 200, overview.text
            assert str(escape(queue)) in overview.text  # as the templates escape it
            metrics = client.get("/metrics")
            assert metrics.status_code == 200, metrics.text
            assert f'queue="{escape_label(queue)}"' in metrics.text
            page = client.get("/limits/" + quote(queue, safe=""))
            assert page.status_code == 200, page.text
            assert "1 key throttled" in page.text

        check()


@pytest.mark.parametrize("field", ["key", "group", "limit_key", "queue"])
def test_nul_in_a_name_is_refused_and_nothing_is_written(app: App, field: str) -> None:
    options = {field: "tenant\x00one"}
    with pytest.raises(InvalidJobError, match="NUL"):
        app.enqueue("t", [1], **options)
    assert app.stats().count("queued") == 0


def test_the_command_line_shows_names_as_written_never_as_markup(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'jobs.db'}"
    names = ["a[/]b", "[red]alert[/red]", "[bold]"]
    with App(dsn) as app:
        app.migrate()
        for name in names:
            app.enqueue("t", [], queue=name, limit_key=name)
            app.limit(name, concurrency=1, per_key=True)
    for command in (["stats"], ["limits"], ["jobs", "list"]):
        result = CliRunner().invoke(cli, [*command, "--dsn", dsn], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        for name in names:
            assert name in result.output, (command, result.output)


def test_the_spark_report_prints_names_and_errors_as_written() -> None:
    from io import StringIO
    from types import SimpleNamespace

    from rich.console import Console

    from conveyor.spark.commands import _print_report

    at = datetime(2026, 1, 1, tzinfo=UTC)
    name, error = "a[/]b", "KeyError: [/] [red]x[/red]"
    counts = {"peak_per_minute": 1, "succeeded": 1, "failed": 1, "cancelled": 0}
    row = {"queue": name, "task": name, "throughput_per_minute": 1.0, **counts, "retried": 0}
    row |= {"rescued": 0, "success_rate": 0.5, "failure_rate": 0.5, "retry_rate": 0.0}
    row |= {f"{k}_{p}": 0.1 for k in ("wait", "run") for p in ("p50", "p95", "p99")}
    row["rescue_rate"] = 0.0
    seen = {"count": 1, "jobs": 1, "queue": name, "task": name, "error": error, "last_seen": at}
    out = StringIO()
    report = SimpleNamespace(start=at, end=at)
    _print_report(Console(file=out, width=300), report, [row], [seen])  # type: ignore[arg-type]
    assert name in out.getvalue() and error in out.getvalue()
