"""Named SQL statements and numbered migrations, read from a backend's package files.

A ``queries.sql`` holds blocks that start with a line ``-- name: job_claim``;
the text up to the next such line is the statement. Keeping SQL in files (not
assembled from strings in Python) lets the two backends be read side by side.

A block may include another as ``{{name}}``: the other block's text takes its
place when the file is read. That is how one rule is written once and used by
two statements (the rules of an enqueue, used by ``job_insert`` and by the bulk
move of staged rows).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

_NAME_LINE = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
_MIGRATION_FILE = re.compile(r"^(\d{3})_(\w+)\.sql$")
_INCLUDE = re.compile(r"\{\{(\w+)\}\}")


def load_queries(package: str) -> dict[str, str]:
    """Parse ``package/queries.sql`` into {name: statement}."""
    text = resources.files(package).joinpath("queries.sql").read_text(encoding="utf-8")
    return parse_queries(text, where=f"{package}/queries.sql")


def parse_queries(text: str, where: str = "SQL text") -> dict[str, str]:
    """Split text of ``-- name: x`` blocks into {name: statement}."""
    parts = _NAME_LINE.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"{where} defines {name!r} twice")
        queries[name] = body.strip().rstrip(";")
    return {name: _expand(name, queries, where, ()) for name in queries}


def _expand(name: str, queries: dict[str, str], where: str, seen: tuple[str, ...]) -> str:
    """A block with every ``{{other}}`` replaced by that block's (expanded) text."""
    if name in seen:
        raise ValueError(f"{where}: {' -> '.join((*seen, name))} includes itself")

    def include(match: re.Match[str]) -> str:
        other = match.group(1)
        if other not in queries:
            raise ValueError(f"{where}: {name} includes {other!r}, which is not defined")
        return _expand(other, queries, where, (*seen, name))

    return _INCLUDE.sub(include, queries[name])


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations(package: str) -> list[Migration]:
    """The ``package/migrations/NNN_name.sql`` files in version order, numbered without gaps."""
    folder = resources.files(package).joinpath("migrations")
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _MIGRATION_FILE.match(entry.name)
        if match:
            found.append(
                Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8"))
            )
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise ValueError(f"{package}: migration {expected:03d} is missing")
    return found
