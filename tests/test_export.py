"""conveyor export and the dashboard's export: a selection's jobs with their events, as
JSON lines, CSV or Parquet, on every store; nothing is deleted."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from conveyor import App, Context
from conveyor import export as exporting
from conveyor.cli import cli
from conveyor.testing import drain
from conveyor.web import create_app

BASE = "http://127.0.0.1"


def some_jobs(app: App) -> list[int]:
    @app.task(queue="mail")
    def send(ctx: Context, to: str) -> str:
        if to == "bad":
            raise ValueError("no such mailbox")
        return f"sent to {to}"

    @app.task(queue="other")
    def other() -> None: ...

    ids = [send.enqueue(to).id for to in ("ann", "bo", "bad", "cy")]
    other.enqueue()
    drain(app, ["mail"])
    return ids


def run(*args: str) -> Any:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result


def test_jsonl_holds_each_job_of_the_selection_with_its_history(app: App, dsn: str) -> None:
    ids = some_jobs(app)
    before = app.count_jobs(queue="mail")
    result = run("export", "--queue", "mail", "--dsn", dsn)
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["id"] for r in records] == sorted(ids, reverse=True)  # newest first
    assert {r["queue"] for r in records} == {"mail"}
    failed = next(r for r in records if r["args"] == ["bad"])
    assert failed["detailed_state"] == "retrying" and "no such mailbox" in failed["error"]
    ok = next(r for r in records if r["args"] == ["ann"])
    assert ok["result"] == "sent to ann"
    assert [e["kind"] for e in ok["events"]] == ["enqueued", "claimed", "succeeded"]
    assert "exported 4 job(s)" in result.stderr
    assert app.count_jobs(queue="mail") == before  # nothing deleted


def test_csv_and_a_limit_across_pages(
    app: App, dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = some_jobs(app)
    monkeypatch.setattr(exporting, "EXPORT_PAGE", 2)
    out = tmp_path / "jobs.csv"
    run("export", "--queue", "mail", "--format", "csv", "-o", str(out), "--limit", "3",
        "--dsn", dsn)  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [int(r["id"]) for r in rows] == sorted(ids, reverse=True)[:3]
    assert json.loads(rows[0]["args"]) == ["cy"] and json.loads(rows[0]["events"])[0]["kind"]
    none = run("export", "--queue", "mail", "--state", "succeeded", "--no-events",
               "--format", "csv", "--dsn", dsn)  # fmt: skip
    succeeded = list(csv.DictReader(io.StringIO(none.stdout)))
    assert len(succeeded) == 3 and "events" not in succeeded[0]


@pytest.mark.parametrize("dsn", ["sqlite"], indirect=True)
def test_parquet_needs_a_file_and_reads_back(app: App, dsn: str, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    ids = some_jobs(app)
    refused = CliRunner().invoke(cli, ["export", "--format", "parquet", "--dsn", dsn])
    assert refused.exit_code != 0 and "needs a file" in refused.output
    out = tmp_path / "jobs.parquet"
    run("export", "--format", "parquet", "-o", str(out), "--dsn", dsn)
    table = pq.read_table(out).to_pylist()
    assert sorted(row["id"] for row in table) == sorted([*ids, ids[-1] + 1])
    assert {row["queue"] for row in table} == {"mail", "other"}
    assert all(json.loads(row["events"]) for row in table)


def test_the_dashboard_exports_its_filter(app: App) -> None:
    ids = some_jobs(app)
    with TestClient(create_app(app), base_url=BASE) as client:
        page = client.get("/jobs?queue=mail")
        assert "/jobs/export?queue=mail&amp;format=jsonl" in page.text
        lines = client.get("/jobs/export?queue=mail&format=jsonl")
        assert lines.status_code == 200
        assert lines.headers["content-type"].startswith("application/x-ndjson")
        assert "conveyor-jobs.jsonl" in lines.headers["content-disposition"]
        records = [json.loads(line) for line in lines.text.splitlines()]
        assert [r["id"] for r in records] == sorted(ids, reverse=True)
        table = client.get("/jobs/export?queue=mail&state=succeeded&format=csv")
        assert table.status_code == 200 and table.text.startswith("id,")
        assert client.get("/jobs/export?format=xml").status_code == 400
