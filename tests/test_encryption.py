"""Arguments and results encrypted at rest (conveyor.encryption), on every store.

The stored bytes are read raw (the row, the hash) to check that no clear value
is written; rotation, a worker without the key, and what the CLI and the
dashboard show are checked through the real surfaces.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import psycopg
import pytest
import redis
from click.testing import CliRunner
from cryptography.fernet import Fernet
from starlette.testclient import TestClient

from conveyor import App, Context, chain
from conveyor.cli import cli
from conveyor.encryption import KEYS_ENV, SEALED_LABEL, PayloadCodec, payload_codec
from conveyor.errors import ConfigurationError, EncryptedPayloadError
from conveyor.job import SEALED_PREFIX, is_sealed
from conveyor.testing import drain
from conveyor.web import create_app

SECRET = "hunter2-secret@example.com"
OLD, NEW = Fernet.generate_key().decode(), Fernet.generate_key().decode()


@pytest.fixture(autouse=True)
def no_keys_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEYS_ENV, raising=False)


@pytest.fixture
def sealed_app(dsn: str) -> Iterator[App]:
    with App(dsn, encryption_keys=[OLD]) as application:
        application.migrate()
        yield application


def raw_text(app: App, dsn: str, job_id: int) -> str:
    """Everything stored of a job and its steps, as the database holds it."""
    if dsn.startswith("sqlite"):
        with closing(sqlite3.connect(dsn.removeprefix("sqlite:///"))) as conn:
            rows = conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchall()
            rows += conn.execute("SELECT * FROM job_steps WHERE job_id = ?", (job_id,)).fetchall()
        return repr(rows)
    if dsn.startswith("redis"):
        client = redis.Redis.from_url(dsn, decode_responses=True)
        prefix = app.store.prefix  # type: ignore[union-attr]
        try:
            job = client.hgetall(f"{prefix}job:{job_id}")
            steps = client.hgetall(f"{prefix}steps:{job_id}")
        finally:
            client.close()
        assert job, "the job's hash was read"
        return repr((job, steps))
    with psycopg.connect(dsn) as conn:
        rows: list[Any] = conn.execute(
            "SELECT j::text FROM jobs AS j WHERE id = %s", (job_id,)
        ).fetchall()
        rows += conn.execute(
            "SELECT result::text FROM job_steps WHERE job_id = %s", (job_id,)
        ).fetchall()
    return repr(rows)


def register(app: App, calls: list[Any] | None = None) -> Any:
    @app.task(name="mail")
    def mail(ctx: Context, to: str, *, body: str) -> dict[str, str]:
        if calls is not None:
            calls.append((to, body))
        ctx.step("render", lambda: f"rendered for {to}")
        return {"sent_to": to}

    return mail


def test_arguments_results_and_steps_are_stored_encrypted(sealed_app: App, dsn: str) -> None:
    mail = register(sealed_app)
    job = mail.enqueue(SECRET, body="the body")
    assert (job.args, job.kwargs) == ([SECRET], {"body": "the body"})
    stored = raw_text(sealed_app, dsn, job.id)
    assert SECRET not in stored and "the body" not in stored
    assert "fernet:gAAAA" in stored  # the arguments are there, sealed

    drain(sealed_app)
    done = sealed_app.get(job.id)
    assert done.state == "succeeded", done.error
    assert (done.args, done.kwargs, done.result) == (
        [SECRET],
        {"body": "the body"},
        {"sent_to": SECRET},
    )
    [step] = sealed_app.steps(job.id)
    assert step.result == f"rendered for {SECRET}"
    stored = raw_text(sealed_app, dsn, job.id)
    assert SECRET not in stored and "rendered" not in stored and "sent_to" not in stored
    # Queue, task and state stay clear, so they can be searched and counted.
    assert "mail" in stored and "succeeded" in stored
    assert [j.id for j in sealed_app.jobs(task="mail", state="succeeded")] == [job.id]


def test_rotation_reseals_under_the_newest_key(sealed_app: App, dsn: str) -> None:
    mail = register(sealed_app)
    done = mail.enqueue(SECRET, body="b1")
    drain(sealed_app)
    waiting = mail.enqueue("second@example.com", body="b2")  # queued: no result yet
    before = raw_text(sealed_app, dsn, done.id)

    with App(dsn, encryption_keys=[NEW, OLD]) as both:
        # Every listed key reads; the newest writes.
        assert both.get(done.id).result == {"sent_to": SECRET}
        progress = both.reencrypt(batch_size=1)
        assert progress.done and progress.jobs == 2 and progress.unreadable == 0
        # args, kwargs, result and the step of one; args and kwargs of the other.
        assert progress.rewritten == 6
        assert both.reencrypt().rewritten == 0  # a rerun has nothing left to do
    assert raw_text(sealed_app, dsn, done.id) != before

    with App(dsn, encryption_keys=[NEW]) as new_only:
        read = new_only.get(done.id)
        assert (read.args, read.kwargs, read.result) == (
            [SECRET],
            {"body": "b1"},
            {"sent_to": SECRET},
        )
        assert [s.result for s in new_only.steps(done.id)] == [f"rendered for {SECRET}"]
        assert new_only.get(waiting.id).args == ["second@example.com"]
    with App(dsn, encryption_keys=[OLD]) as old_only, pytest.raises(EncryptedPayloadError):
        old_only.get(done.id).args  # noqa: B018


def test_rotation_seals_jobs_stored_in_clear(app: App, dsn: str) -> None:
    register(app)
    clear = app.enqueue("mail", args=[SECRET], kwargs={"body": "b"})
    assert SECRET in raw_text(app, dsn, clear.id)
    with App(dsn, encryption_keys=[NEW]) as sealing:
        assert sealing.reencrypt().rewritten == 2
        assert sealing.get(clear.id).args == [SECRET]
    assert SECRET not in raw_text(app, dsn, clear.id)


def test_a_worker_without_the_key_fails_the_job_and_never_runs_it(
    sealed_app: App, dsn: str
) -> None:
    register(sealed_app)
    jobs = [sealed_app.enqueue("mail", args=[SECRET], kwargs={"body": "b"}) for _ in range(2)]
    for keys in (None, [NEW]):  # no key at all; a key that does not open them
        calls: list[Any] = []
        with App(dsn, encryption_keys=keys) as keyless:
            register(keyless, calls)
            drain(keyless, limit=1)
        assert calls == []
    for job in jobs:
        failed = sealed_app.get(job.id)
        assert failed.state == "failed"
        assert failed.error is not None
        assert failed.error.startswith("EncryptedPayloadError:")
        assert "arguments are encrypted" in failed.error and "opens them" in failed.error
        assert SECRET not in failed.error and SEALED_PREFIX not in failed.error
        assert failed.attempts == 1


def test_cli_and_dashboard_say_encrypted_without_the_key(
    sealed_app: App, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    mail = register(sealed_app)
    job = mail.enqueue(SECRET, body="b")
    drain(sealed_app)
    show = ["jobs", "show", str(job.id), "--dsn", dsn]

    shown = json.loads(CliRunner().invoke(cli, [*show, "--json"]).stdout)
    assert shown["args"] == shown["kwargs"] == shown["result"] == SEALED_LABEL
    assert shown["encrypted"] == ["args", "kwargs", "result"]
    assert [s["result"] for s in shown["steps"]] == [SEALED_LABEL]
    text = CliRunner().invoke(cli, show).stdout
    assert SEALED_LABEL in text and "fernet" not in text and "gAAAA" not in text
    with App(dsn) as keyless, TestClient(create_app(keyless), base_url="http://127.0.0.1") as web:
        page = web.get(f"/jobs/{job.id}").text
    assert SEALED_LABEL in page and "gAAAA" not in page and SECRET not in page

    monkeypatch.setenv(KEYS_ENV, f"{NEW},{OLD}")
    shown = json.loads(CliRunner().invoke(cli, [*show, "--json"]).stdout)
    assert (shown["args"], shown["result"]) == ([SECRET], {"sent_to": SECRET})
    assert "encrypted" not in shown
    assert [s["result"] for s in shown["steps"]] == [f"rendered for {SECRET}"]
    with App(dsn) as keyed, TestClient(create_app(keyed), base_url="http://127.0.0.1") as web:
        page = web.get(f"/jobs/{job.id}").text
    assert SEALED_LABEL not in page and SECRET in page


def test_the_cli_rotates(sealed_app: App, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    job = register(sealed_app).enqueue(SECRET, body="b")
    rotate = ["encryption", "rotate", "--dsn", dsn, "--json"]
    refused = CliRunner().invoke(cli, rotate)
    assert refused.exit_code != 0 and KEYS_ENV in refused.output
    monkeypatch.setenv(KEYS_ENV, f"{NEW},{OLD}")
    result = CliRunner().invoke(cli, rotate)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rewritten"] == 2
    with App(dsn, encryption_keys=[NEW]) as new_only:
        assert new_only.get(job.id).args == [SECRET]


def test_argument_search_never_looks_inside_ciphertext(sealed_app: App, dsn: str) -> None:
    register(sealed_app)
    sealed = sealed_app.enqueue("mail", args=[SECRET], kwargs={"body": "b"})
    with App(dsn) as clear_app:
        clear = clear_app.enqueue("mail", args=["findme"], kwargs={"body": "b"})
        for app in (sealed_app, clear_app):
            # Every ciphertext holds these: none of them may be found by them.
            for text in ("gAAAA", "fernet", "a", SECRET):
                assert sealed.id not in [j.id for j in app.jobs(args=text)]
            assert [j.id for j in app.jobs(args="findme")] == [clear.id]
            assert app.count_matching(args="gAAAA") == 0


def test_keys_are_checked_and_never_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="key 2 of 2 is not a Fernet key") as caught:
        PayloadCodec([NEW.encode(), b"not-a-key-at-all"])
    assert "not-a-key-at-all" not in str(caught.value)
    assert payload_codec(None) is None  # no keys anywhere: stored clear
    monkeypatch.setenv(KEYS_ENV, f" {NEW} , {OLD} ")
    codec = payload_codec(None)
    assert codec is not None and codec.key_count == 2
    sealed = codec.seal('{"a":1}')
    assert is_sealed(sealed) and json.loads(sealed).startswith("/fernet:")  # a JSON string
    assert codec.open(sealed) == '{"a":1}'
    # A clear value that is a string never looks sealed: our JSON never escapes "/".
    assert not is_sealed(json.dumps("\\/fernet:x"))
    assert not is_sealed(json.dumps("/fernet:x"))


def test_consume_and_workflows_seal_and_open(sealed_app: App, dsn: str) -> None:
    mail = register(sealed_app)
    sealed_app.enqueue("mail", args=[SECRET], kwargs={"body": "b"}, queue="pull")
    for held in sealed_app.consume(["pull"], idle_timeout=0.5):
        assert (held.args, held.kwargs) == ([SECRET], {"body": "b"})
        held.complete({"echo": held.args[0]})
        pulled = held.job.id
    assert sealed_app.get(pulled).result == {"echo": SECRET}
    assert SECRET not in raw_text(sealed_app, dsn, pulled)

    run = sealed_app.enqueue_workflow(chain(mail.step("a@x.org", body="1")))
    [node] = run.jobs
    assert node.args == ["a@x.org"]
    assert "a@x.org" not in raw_text(sealed_app, dsn, node.id)


def test_an_enqueue_that_meets_a_held_key_opens_the_job_it_found(sealed_app: App) -> None:
    register(sealed_app)
    first = sealed_app.enqueue("mail", args=[SECRET], kwargs={"body": "1"}, key="k")
    again = sealed_app.enqueue("mail", args=["other@example.com"], kwargs={"body": "2"}, key="k")
    assert again.existing and again.id == first.id
    assert (again.args, again.kwargs) == ([SECRET], {"body": "1"})
