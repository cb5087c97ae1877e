"""``conveyor encryption``: make a key, and re-encrypt stored jobs under the newest key."""

from __future__ import annotations

import click

from conveyor.cli.options import dsn_option, json_option, open_app
from conveyor.cli.output import print_json
from conveyor.encryption import ROTATE_BATCH, RotationProgress


@click.group()
def encryption() -> None:
    """Arguments and results encrypted at rest: keys and rotation.

    The keys are read from CONVEYOR_ENCRYPTION_KEYS (comma-separated, newest
    first), never from the command line, where other users could read them.
    """


@encryption.command("new-key")
def new_key() -> None:
    """Print a new random key, to put first in CONVEYOR_ENCRYPTION_KEYS."""
    try:
        from cryptography.fernet import Fernet
    except ImportError:
        raise click.ClickException(
            "encryption needs the cryptography package: pip install 'conveyor[encryption]'"
        ) from None
    click.echo(Fernet.generate_key().decode())


@encryption.command("rotate")
@click.option(
    "--batch-size",
    type=click.IntRange(1, 100_000),
    default=ROTATE_BATCH,
    show_default=True,
    help="Jobs read and rewritten per round trip.",
)
@click.option(
    "--after-id",
    type=click.IntRange(0, 2**63 - 1),
    default=0,
    show_default=True,
    help="Start after this job id (the last id a run that stopped printed).",
)
@dsn_option
@json_option
def rotate(batch_size: int, after_id: int, dsn: str | None, as_json: bool) -> None:
    """Re-encrypt every stored job's arguments and results under the newest key.

    Values sealed by an older listed key are sealed again with the first; clear
    ones (stored before encryption was turned on) are sealed. Safe to run while
    workers run, and to run again: what is under the newest key is skipped.
    Once it has run, the older keys may be removed from CONVEYOR_ENCRYPTION_KEYS.
    """

    def report(progress: RotationProgress) -> None:
        if not as_json:
            click.echo(
                f"up to job {progress.last_id}: {progress.jobs:,} jobs read, "
                f"{progress.rewritten:,} values rewritten",
                err=True,
            )

    with open_app(dsn) as app:
        progress = app.reencrypt(after_id=after_id, batch_size=batch_size, on_batch=report)
    if as_json:
        print_json(
            {
                "jobs": progress.jobs,
                "rewritten": progress.rewritten,
                "unreadable": progress.unreadable,
                "last_id": progress.last_id,
            }
        )
        return
    click.echo(
        f"done: {progress.jobs:,} jobs read, {progress.rewritten:,} values written under "
        "the newest key"
    )
    if progress.unreadable:
        click.echo(
            f"{progress.unreadable:,} values no listed key opens were left as they are "
            "(sealed by a key that is no longer listed)"
        )
