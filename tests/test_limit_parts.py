"""A limit call changes only what it names; dropping a part is explicit (API and CLI)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner, Result

from conveyor import App
from conveyor.cli import cli
from conveyor.errors import ConfigurationError
from conveyor.limits import Limit, Rate


def run(*args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    return result


def stored(app: App, queue: str = "api") -> tuple[Limit | None, Limit | None]:
    limits = app.store.limit_get(queue)
    return (None, None) if limits is None else (limits.limit, limits.key_limit)


def test_app_limit_keeps_the_part_it_is_not_given(app: App) -> None:
    app.limit("api", concurrency=3)
    app.limit("api", rate="5/s")
    assert stored(app) == (Limit(Rate(5, 1.0), 3), None)
    app.limit("api", concurrency=4)
    assert stored(app) == (Limit(Rate(5, 1.0), 4), None)
    # The other scope is untouched, and parts of it are kept the same way.
    app.limit("api", rate="1/m", per_key=True)
    app.limit("api", concurrency=2, per_key=True)
    assert stored(app) == (Limit(Rate(5, 1.0), 4), Limit(Rate(1, 60.0), 2))
    # None drops one part, explicitly.
    app.limit("api", None)
    assert stored(app) == (Limit(None, 4), Limit(Rate(1, 60.0), 2))
    app.limit("api", concurrency=None, per_key=True)
    assert stored(app) == (Limit(None, 4), Limit(Rate(1, 60.0), None))
    app.limit("api", clear=True, per_key=True)
    assert stored(app) == (Limit(None, 4), None)
    assert app.limit("api", concurrency=None) is None  # nothing left: the queue has no limit


def test_app_limit_refuses_clear_with_parts_and_an_empty_call(app: App) -> None:
    with pytest.raises(ConfigurationError, match="clear=True\\) drops the whole limit"):
        app.limit("api", "5/s", clear=True)
    with pytest.raises(ConfigurationError, match="None drops that part"):
        app.limit("api")
    assert stored(app) == (None, None)


def test_cli_limit_rate_keeps_the_concurrency(app: App, dsn: str) -> None:
    assert run("limit", "api", "--concurrency", "3", "--dsn", dsn).stdout.strip() == (
        "queue api: 3 at once"
    )
    out = run("limit", "api", "--rate", "5/s", "--dsn", dsn).stdout
    assert out.strip() == "queue api: 5/s, 3 at once"
    out = run("limit", "api", "--no-concurrency", "--dsn", dsn).stdout
    assert out.strip() == "queue api: 5/s"
    run("limit", "api", "--concurrency", "2", "--dsn", dsn)
    out = run("limit", "api", "--no-rate", "--dsn", dsn).stdout
    assert out.strip() == "queue api: 2 at once"
    out = run("limit", "api", "--clear", "--dsn", dsn).stdout
    assert out.strip() == "queue api: none"
    assert stored(app) == (None, None)


def test_cli_limit_refuses_contradictions(app: App, dsn: str) -> None:
    err = run("limit", "api", "--rate", "5/s", "--no-rate", "--dsn", dsn, code=2).stderr
    assert "--no-rate to drop it, not both" in err
    err = run("limit", "api", "--concurrency", "2", "--no-concurrency", "--dsn", dsn, code=2).stderr
    assert "--no-concurrency to drop it, not both" in err
    err = run("limit", "api", "--clear", "--no-rate", "--dsn", dsn, code=2).stderr
    assert "--clear drops the whole limit" in err
    assert stored(app) == (None, None)
