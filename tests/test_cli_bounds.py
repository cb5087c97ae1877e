"""Every number the command line takes is bounded, in the API's own words, before anything runs.

A number out of range is a usage error (exit 2) that says what the bound is:
never an OverflowError or a MemoryError, and nothing is opened or allocated
first (these commands run against a DSN that does not exist: a bound checked
after opening the database would answer "no database" instead).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from conveyor.cli import cli
from conveyor.cli.jobs import MAX_COUNT
from conveyor.cli.options import Bounded, Duration, JobId
from conveyor.spark.commands import _duration as spark_duration

EXCEPTION_NAMES = ("OverflowError", "MemoryError", "ValueError", "TypeError", "Traceback")


def commands(group: click.Group, ctx: click.Context) -> Iterator[tuple[str, click.Command]]:
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            for sub, inner in commands(command, ctx):
                yield f"{name} {sub}", inner
        else:
            yield name, command


def test_every_numeric_option_of_every_command_is_bounded() -> None:
    ctx = click.Context(cli)
    bounded = set()
    for name, command in commands(cli, ctx):
        for param in command.params:
            kind = param.type
            if isinstance(kind, Bounded | Duration | JobId) or param.callback is spark_duration:
                bounded.add(f"{name} {param.name}")
            elif isinstance(kind, click.IntRange | click.FloatRange):
                assert kind.min is not None and kind.max is not None, (name, param.name)
                bounded.add(f"{name} {param.name}")
            else:
                # A plain int or float (click.INT, click.FLOAT) takes any size: refused here.
                plain = click.types.IntParamType | click.types.FloatParamType
                assert not isinstance(kind, plain), (name, param.name)
    assert bounded >= {
        "enqueue delay", "enqueue priority", "enqueue max_attempts", "enqueue count",
        "limit concurrency", "limit throttle", "purge older_than", "stats interval",
        "stats times", "worker concurrency", "worker lease", "worker prefetch",
        "worker stop_timeout", "worker poll_interval", "demo total", "demo lease",
        "demo concurrency", "dashboard port", "jobs list limit", "jobs list before_id",
        "jobs show job_id", "report since", "archive older_than",
    }  # fmt: skip


CASES = [
    (["enqueue", "t", "--delay", "99999999999d"], "delay of 8639999999913600.0 seconds"),
    (["enqueue", "t", "--delay", "1e400"], "is not a duration"),
    (["enqueue", "t", "--delay", "nan"], "is not a duration"),
    (["enqueue", "t", "--count", "100000000000"], f"--count must be from 1 to {MAX_COUNT:,}"),
    (["enqueue", "t", "--count", "0"], "--count must be from 1"),
    (["enqueue", "t", "--priority", "99999999999"], "priority must be a 32-bit integer"),
    (["enqueue", "t", "--max-attempts", "0"], "max_attempts must be an integer from 1"),
    (["enqueue", "t", "--max-attempts", "99999999999"], "max_attempts must be an integer"),
    (["limit", "q", "--throttle", "99999999999d"], "a throttle lasts 0 and at most 604800"),
    (["limit", "q", "--throttle", "8d"], "a throttle lasts 0 and at most 604800"),
    (["limit", "q", "--concurrency", "99999999999"], "concurrency must be from 1 to"),
    (["limit", "q", "--concurrency", "0"], "concurrency must be from 1 to"),
    (["limit", "q", "--rate", "99999999999/s"], "a rate lets 1 to 1,000,000 jobs start"),
    (["purge", "--older-than", "99999999999d"], "older_than must be from 0 to 365,000 days"),
    (["stats", "--interval", "1e308"], "--interval must be from 0.1 to 3,600 seconds"),
    (["stats", "--interval", "nan"], "is not a finite number"),
    (["worker", "x:app", "--concurrency", "99999999999"], "--concurrency must be from 1"),
    (["worker", "x:app", "--lease", "inf"], "is not a finite number"),
    (["worker", "x:app", "--lease", "0.1"], "must be more than 0.1 and at most 86,400"),
    (["worker", "x:app", "--stop-timeout", "1e20"], "--stop-timeout must be from 0"),
    (["worker", "x:app", "--poll-interval", "0"], "--poll-interval must be more than 0"),
    (["worker", "x:app", "--prefetch", "-1"], "--prefetch must be from 0"),
    (["demo", "--jobs", "100000000000"], "--jobs must be from 200 to 1,000,000"),
    (["demo", "--lease", "nan"], "is not a finite number"),
    (["jobs", "list", "--limit", "100000000000"], "100000000000 is not in the range"),
    (["jobs", "show", "99999999999999999999999"], "is not a job id"),
    (["dashboard", "--port", "99999999"], "is not in the range"),
    (["report", "--since", "99999999999d"], "older_than must be from 0 to 365,000 days"),
    (["archive", "--older-than", "99999999999d", "--to", "x"], "older_than must be from 0"),
]


@pytest.mark.parametrize(("args", "said"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_number_out_of_range_is_refused_with_its_bound(
    args: list[str], said: str, tmp_path: Path
) -> None:
    missing = f"sqlite:///{tmp_path / 'nowhere.db'}"
    result = CliRunner().invoke(cli, [*args, "--dsn", missing] if args[0] != "demo" else args)
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    assert said in " ".join(result.stderr.split()), result.stderr
    for name in EXCEPTION_NAMES:
        assert name not in result.stderr, result.stderr
    assert not (tmp_path / "nowhere.db").exists()
