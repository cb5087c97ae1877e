"""A handler receives conveyor's Context only when its first parameter really is that Context."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
import pytest

from conveyor import App, ConfigurationError, Context

if TYPE_CHECKING:  # only for the type checker: not resolvable at run time
    import conveyor.context as hidden


class models:
    class Context:  # a user's own class that happens to share the name
        pass


@pytest.fixture
def inline(tmp_path: Path) -> App:
    application = App(f"sqlite:///{tmp_path / 'jobs.db'}", inline=True)
    application.migrate()
    return application


def test_conveyors_context_is_passed_when_annotated_with_it(inline: App) -> None:
    @inline.task
    def with_ctx(ctx: Context, n: int) -> int:
        return ctx.job_id * 1000 + n

    job = with_ctx.enqueue(7)
    assert inline.get(job.id).result == job.id * 1000 + 7
    assert with_ctx.takes_context


def test_a_class_named_context_of_someone_else_is_an_ordinary_argument(inline: App) -> None:
    @inline.task
    def own(ctx: models.Context, n: int) -> str:
        return f"{type(ctx).__name__}:{n}"

    @inline.task
    def clicky(ctx: click.Context) -> str:
        return repr(ctx)

    assert not own.takes_context and not clicky.takes_context
    # Its arguments come from the job, not from conveyor.
    job = inline.enqueue("own", kwargs={"ctx": None, "n": 2})
    assert inline.get(job.id).result == "NoneType:2"


def test_an_annotation_that_cannot_be_resolved_is_refused_at_registration(inline: App) -> None:
    with pytest.raises(ConfigurationError, match="import Context at run time"):

        @inline.task
        def hidden_ctx(ctx: hidden.Context) -> None:
            return None
