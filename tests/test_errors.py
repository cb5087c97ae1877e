"""Errors translated at the boundary: what a user meets is conveyor's error, saying what to do."""

from __future__ import annotations

import pytest

from conveyor import App, ConfigurationError, ExponentialBackoff, SchemaMissingError
from store_fixtures import sql_only


@sql_only  # Redis has no tables to miss: its keys are made by the scripts that use them
def test_an_unmigrated_database_is_schema_missing_from_every_entry_point(dsn: str) -> None:
    # migrate=False: SQLite would otherwise create its tables on first open.
    with App(dsn, migrate=False) as app:

        @app.task
        def hello() -> None:
            return None

        for call in (
            lambda: app.get(1),
            lambda: app.jobs(),
            lambda: app.stats(),
            lambda: hello.enqueue(),
            lambda: app.cancel(1),
            lambda: app.store.job_claim(["default"], 1, "w", __import__("datetime").timedelta(1)),
        ):
            with pytest.raises(SchemaMissingError, match="conveyor migrate"):
                call()
        # And once migrated, the same calls work.
        app.migrate()
        assert app.get(hello.enqueue().id).task == "hello"


@pytest.mark.parametrize(
    "options",
    [{"concurrency": 0}, {"prefetch": -1}, {"lease": 0.05}, {"poll_interval": 0}],
)
def test_bad_worker_options_are_configuration_errors(app: App, options: dict[str, float]) -> None:
    @app.task
    def noop() -> None:
        return None

    with pytest.raises(ConfigurationError):
        app.worker(**options)


def test_bad_consume_and_backoff_options_are_configuration_errors(app: App) -> None:
    with pytest.raises(ConfigurationError, match="at least one queue"):
        app.consume([])
    with pytest.raises(ConfigurationError):
        ExponentialBackoff(base=-1)
