"""The audit kept in every store, and the CLI's side: its actions recorded, ``conveyor audit``."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest
from click.testing import CliRunner, Result

from conveyor import App
from conveyor.audit import ACTOR_ENV, entries
from conveyor.cli import cli
from conveyor.errors import ConfigurationError
from conveyor.job import utcnow
from conveyor.store.audit import FIELD_CHARS, AuditAction, AuditStore
from conveyor.store.dsn import DSN_ENV
from conveyor.store.protocols import Store


def run(*args: str, code: int = 0, actor: str = "ops-alice", columns: int = 200) -> Result:
    env: dict[str, str | None] = {
        DSN_ENV: os.environ.get(DSN_ENV),
        ACTOR_ENV: actor,
        "COLUMNS": str(columns),
    }
    result = CliRunner().invoke(cli, list(args), env=env)
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    return result


def test_entries_come_back_newest_first_a_page_at_a_time(store: Store) -> None:
    assert isinstance(store, AuditStore)
    assert store.audit_list(10) == []
    start = utcnow().replace(microsecond=0)
    for n in range(7):
        store.audit_record(
            AuditAction(f"user{n}", "cli", "retry", f"job {n}", n), start + timedelta(seconds=n)
        )
    # A name is data: quotes, newlines, a key's braces, and a length past the kept one.
    odd = "q'; DROP TABLE audit_log; --\n{x}" + "z" * (FIELD_CHARS * 2)
    store.audit_record(AuditAction(odd, "dashboard", "pause", odd), start + timedelta(seconds=9))
    newest = store.audit_list(3)
    assert [e.actor[:5] for e in newest] == ["q'; D", "user6", "user5"]
    assert newest[0].jobs is None and newest[1].jobs == 6
    assert len(newest[0].target) == FIELD_CHARS and newest[0].target.startswith(odd[:40])
    assert newest[1].at == start + timedelta(seconds=6)
    assert newest[1].source == "cli" and newest[1].action == "retry"
    older = store.audit_list(3, before=newest[-1].id)
    assert [e.actor for e in older] == ["user4", "user3", "user2"]
    rest = store.audit_list(10, before=older[-1].id)
    assert [e.target for e in rest] == ["job 1", "job 0"]
    assert store.audit_list(10, before=rest[-1].id) == []
    assert [e.id for e in store.audit_list(100)] == sorted(
        (e.id for e in store.audit_list(100)), reverse=True
    )


def test_redis_keeps_only_the_newest_entries(
    redis_clean_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import conveyor.store.redis.audit as redis_audit

    monkeypatch.setattr(redis_audit, "REDIS_KEPT", 5)
    with App(redis_clean_dsn) as app:
        store = app.store
        assert isinstance(store, AuditStore)
        for n in range(12):
            store.audit_record(AuditAction("ops", "cli", "pause", f"queue q{n}"), utcnow())
        kept = store.audit_list(100)
        assert [e.target for e in kept] == [f"queue q{n}" for n in range(11, 6, -1)]
        assert [e.target for e in store.audit_list(2, before=kept[1].id)] == [
            "queue q9",
            "queue q8",
        ]
        assert store.audit_list(10, before=kept[-1].id) == []
        assert store._client.llen(store.prefix + "audit") == 5


def test_cli_actions_are_recorded_and_listed(dsn: str) -> None:
    with App(dsn) as app:
        app.migrate()
        jobs = [app.enqueue("send", queue="mail") for _ in range(3)]
    run("--dsn", dsn, "pause", "mail")
    run("--dsn", dsn, "resume", "mail", actor="ops-bob")
    run("--dsn", dsn, "jobs", "cancel", str(jobs[0].id))
    run("--dsn", dsn, "jobs", "cancel", "--queue", "mail", "--yes")
    run("--dsn", dsn, "limit", "mail", "--rate", "5/s")
    run("--dsn", dsn, "purge", "--older-than", "0s", "--yes")
    listed = json.loads(run("--dsn", dsn, "audit", "--json").stdout)
    purged = listed.pop(0)
    assert (purged["actor"], purged["action"], purged["jobs"]) == ("ops-alice", "purge", 3)
    assert purged["target"] == "finished succeeded/failed/cancelled job(s) of any age"
    assert [(e["actor"], e["source"], e["action"], e["target"], e["jobs"]) for e in listed] == [
        ("ops-alice", "cli", "limit set", "queue mail: 5/s", None),
        ("ops-alice", "cli", "cancel", "jobs matching queue=mail", 2),
        ("ops-alice", "cli", "cancel", f"job {jobs[0].id}", 1),
        ("ops-bob", "cli", "resume", "queue mail", None),
        ("ops-alice", "cli", "pause", "queue mail", None),
    ]
    table = run("--dsn", dsn, "audit", "--limit", "2", columns=100).stdout
    assert "limit set" in table and "ops-alice" in table and "resume" not in table
    older = json.loads(
        run("--dsn", dsn, "audit", "--json", "--before", str(listed[2]["id"])).stdout
    )
    assert [e["action"] for e in older] == ["resume", "pause"]
    with App(dsn) as app:
        assert [e.action for e in entries(app, 1)] == ["purge"]
        with pytest.raises(ConfigurationError, match="limit must be from 1"):
            entries(app, 0)
