"""Job headers: metadata stored with a job at enqueue and read back on the worker side.

On every store: what is inserted comes back from every read (get, list,
claim, a key that answers with the job that holds it); a job without headers
reads as ``{}``; bad headers are refused with a clear error; and a database
made before headers existed (migration 012) migrates forward with its jobs.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from conveyor import App, Context, InvalidJobError
from conveyor.job import MAX_HEADERS_BYTES, NewJob
from conveyor.store.dsn import open_store
from conveyor.store.protocols import Store
from conveyor.store.sql import load_migrations, load_queries
from conveyor.testing import drain
from outcomes import listed

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)
TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def new(headers: dict[str, str] | None = None, *, key: str | None = None) -> NewJob:
    return NewJob("q", "t", "[]", "{}", run_at=NOW, headers=headers, key=key)


def test_headers_come_back_from_every_read(store: Store) -> None:
    with_headers, without = store.job_insert_many([new({**TRACE, "é": "ü"}), new()], NOW)
    assert with_headers.headers == {**TRACE, "é": "ü"}
    assert without.headers == {} and without.headers_json is None
    assert store.job_get(with_headers.id).headers == {**TRACE, "é": "ü"}  # type: ignore[union-attr]
    assert store.job_get(without.id).headers == {}  # type: ignore[union-attr]
    shown = {job.id: job.headers for job in listed(store, queue="q")}
    assert shown == {with_headers.id: {**TRACE, "é": "ü"}, without.id: {}}
    claimed = store.job_claim(["q"], 2, "w", LEASE, NOW)
    assert {job.id: job.headers for job in claimed} == shown


def test_a_key_answers_with_the_headers_of_the_job_that_holds_it(store: Store) -> None:
    (first,) = store.job_insert_many([new({"request_id": "r1"}, key="k")], NOW)
    (again,) = store.job_insert_many([new({"request_id": "r2"}, key="k")], NOW)
    assert again.id == first.id and again.headers == {"request_id": "r1"}


def test_enqueue_options_carry_headers_to_the_handler(app: App) -> None:
    seen: list[dict[str, str]] = []

    @app.task(queue="q")
    def handler(ctx: Context) -> None:
        seen.append(ctx.job.headers)

    job = handler.options(headers={"request_id": "r-7"}).enqueue()
    assert job.headers == {"request_id": "r-7"}
    assert app.enqueue("handler", headers={"tenant": "acme"}).headers == {"tenant": "acme"}
    assert app.get(job.id).headers == {"request_id": "r-7"}
    drain(app)
    assert sorted(seen, key=str) == [{"request_id": "r-7"}, {"tenant": "acme"}]


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ({"n": 1}, "header 'n' must be a string, got int (encode numbers and ids as text)"),
        ({"": "x"}, "header names must be non-empty strings, got ''"),
        ({"n": "a\x00b"}, "header 'n' contains a NUL character or a lone surrogate"),
        (["a"], "headers must be a dict of strings, got list"),
        ({"big": "x" * MAX_HEADERS_BYTES}, f"the limit is {MAX_HEADERS_BYTES} bytes"),
    ],
)
def test_bad_headers_are_refused_with_what_is_wrong(
    sqlite_path: Path, headers: object, says: str
) -> None:
    with App(f"sqlite:///{sqlite_path}") as app:
        app.migrate()
        with pytest.raises(InvalidJobError, match=says.replace("(", r"\(").replace(")", r"\)")):
            app.enqueue("t", headers=headers)
        with pytest.raises(InvalidJobError, match="header"):
            app.enqueue_many([new(headers)])  # type: ignore[arg-type]
        assert app.count_jobs(queue="q") == {} and app.count_jobs(queue="default") == {}


# --- existing databases migrate forward -----------------------------------------------------


def test_a_sqlite_database_before_headers_migrates_with_its_jobs(sqlite_path: Path) -> None:
    conn = sqlite3.connect(sqlite_path)
    conn.execute(load_queries("conveyor.store.sqlite")["migrations_table"])
    for migration in load_migrations("conveyor.store.sqlite"):
        if migration.version < 12:
            conn.executescript(migration.sql)
            conn.execute(
                "INSERT INTO schema_migrations VALUES (?, ?, 0)",
                (migration.version, migration.name),
            )
    conn.execute(
        "INSERT INTO jobs (id, queue, task, state, run_at, created_at) "
        "VALUES (1, 'q', 't', 'queued', 0, 0)"
    )
    conn.execute("UPDATE counters SET value = 1 WHERE name = 'jobs'")
    conn.commit()
    conn.close()
    check_migrated_forward(open_store(f"sqlite:///{sqlite_path}"))


def test_a_postgres_database_before_headers_migrates_with_its_jobs(pg_clean_dsn: str) -> None:
    queries = load_queries("conveyor.store.postgres")
    with psycopg.connect(pg_clean_dsn) as conn:
        conn.execute(queries["migrations_table"])
        for migration in load_migrations("conveyor.store.postgres"):
            if migration.version < 12:
                conn.execute(migration.sql.encode())
                conn.execute(
                    "INSERT INTO schema_migrations VALUES (%s, %s, now())",
                    (migration.version, migration.name),
                )
        conn.execute(
            "INSERT INTO jobs (queue, task, state, run_at, created_at) "
            "VALUES ('q', 't', 'queued', now(), now())"
        )
    check_migrated_forward(open_store(pg_clean_dsn))


def check_migrated_forward(store: Store) -> None:
    try:
        assert store.migrate() == store.schema_latest() >= 12
        (old,) = listed(store, queue="q")
        assert old.headers == {} and old.headers_json is None
        (fresh,) = store.job_insert_many([new(TRACE)], NOW)
        assert store.job_get(fresh.id).headers == TRACE  # type: ignore[union-attr]
    finally:
        store.close()


# --- where an operator sees them ---------------------------------------------------------------


def test_conveyor_jobs_show_and_the_job_page_show_headers(app: App, dsn: str) -> None:
    from click.testing import CliRunner
    from starlette.testclient import TestClient

    from conveyor.cli import cli
    from conveyor.web import create_app

    job = app.enqueue("t", queue="q", headers={"request_id": "req-42"})
    plain = app.enqueue("t", queue="q")
    shown = CliRunner().invoke(cli, ["jobs", "show", str(job.id), "--dsn", dsn, "--json"])
    assert shown.exit_code == 0, shown.stderr
    assert json.loads(shown.stdout)["headers"] == {"request_id": "req-42"}
    text = CliRunner().invoke(cli, ["jobs", "show", str(job.id), "--dsn", dsn]).stdout
    assert 'headers: {"request_id": "req-42"}' in text
    assert (
        "headers:"
        not in CliRunner().invoke(cli, ["jobs", "show", str(plain.id), "--dsn", dsn]).stdout
    )
    with TestClient(create_app(app), base_url="http://127.0.0.1") as client:
        page = client.get(f"/jobs/{job.id}").text
        assert "<dt>Headers</dt>" in page and "request_id" in page
        assert "<dt>Headers</dt>" not in client.get(f"/jobs/{plain.id}").text
