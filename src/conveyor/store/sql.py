"""Named SQL statements and numbered migrations, read from a package's files.

A ``queries.sql`` holds blocks that start with a line ``-- name: job_claim``;
the text up to the next such line is the statement. Keeping SQL in files (not
assembled from strings in Python) lets the two backends be read side by side.

A block may include another as ``{{name}}``: the other block's text takes its
place when the file is read (without its leading and trailing comment lines,
which explain the block where it is written). That is how one rule is written once and used by
two statements. A block of another file is included as
``{{package/file.sql:name}}`` (``{{conveyor.store.postgres/queries.sql:job_insert_rules}}``):
a layer above the store writes its own statements in its own files and still
follows the store's rules, such as the rules of an enqueue, without a copy.
An include in such a block that its own file does not define is filled from
the including file.

A file may start from another's blocks with a line ``-- with: package/file.sql``
(``-- with: conveyor.store/shared.sql as pyformat``): that file's blocks are
read as if written in this one, so the statements and rules that read the same
in both SQL dialects are written once, in ``conveyor.store/shared.sql``, with
``:name`` placeholders (``as pyformat`` turns them into psycopg's
``%(name)s``), and each dialect supplies what differs, such as its ``{{now}}``.
A block both files define is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

_NAME_LINE = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
_MIGRATION_FILE = re.compile(r"^(\d{3})_(\w+)\.sql$")
# {{name}}, or {{package/file.sql:name}} for a block of another file.
_INCLUDE = re.compile(r"\{\{(?:([\w.]+)/([\w.-]+):)?(\w+)\}\}")
_WITH = re.compile(r"^--\s*with:\s*([\w.]+)/([\w.-]+)(\s+as\s+pyformat)?\s*$", re.MULTILINE)
# A :name placeholder, not part of a ::cast.
_NAMED = re.compile(r"(?<![:\w]):(\w+)")

#: Files being read, so that two files that include each other are refused, not recursed.
_reading: set[tuple[str, str]] = set()


def load_queries(
    package: str, file: str = "queries.sql", *, strict: bool = True, pyformat: bool = False
) -> dict[str, str]:
    """Parse ``package/file`` (``queries.sql`` unless named) into {name: statement}.

    Not ``strict``: an include the file does not define is left in place, for
    the file that includes the block to fill. ``pyformat``: the file's ``:name``
    placeholders are read as psycopg's ``%(name)s`` (a file both dialects read).
    """
    source = (package, file)
    if source in _reading:
        raise ValueError(f"{package}/{file} includes blocks of itself through another file")
    text = resources.files(package).joinpath(file).read_text(encoding="utf-8")
    if pyformat:
        text = _as_pyformat(text)
    start = _NAME_LINE.search(text)
    preamble, rest = (text[: start.start()], text[start.start() :]) if start else (text, "")
    for base_package, base_file, pyformat in _WITH.findall(preamble):
        base = resources.files(base_package).joinpath(base_file).read_text(encoding="utf-8")
        if pyformat:
            base = _as_pyformat(base)
        # The base's blocks after this file's preamble, before its own blocks.
        text = preamble + base + "\n" + rest
    _reading.add(source)
    try:
        return parse_queries(text, where=f"{package}/{file}", strict=strict)
    finally:
        _reading.discard(source)


def parse_queries(text: str, where: str = "SQL text", *, strict: bool = True) -> dict[str, str]:
    """Split text of ``-- name: x`` blocks into {name: statement} (see load_queries)."""
    parts = _NAME_LINE.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"{where} defines {name!r} twice")
        queries[name] = body.strip().rstrip(";")
    others: dict[tuple[str, str], dict[str, str]] = {}
    return {name: _expand(name, queries, where, (), others, strict) for name in queries}


def _expand(
    name: str,
    queries: dict[str, str],
    where: str,
    seen: tuple[str, ...],
    others: dict[tuple[str, str], dict[str, str]],
    strict: bool,
) -> str:
    """A block with every ``{{other}}`` replaced by that block's (expanded) text."""
    if name in seen:
        raise ValueError(f"{where}: {' -> '.join((*seen, name))} includes itself")

    def include(match: re.Match[str]) -> str:
        package, file, other = match.groups()
        if package is not None:
            # Another file's block, as that file reads it (its own includes expanded).
            if (package, file) not in others:
                others[package, file] = load_queries(package, file, strict=False)
            blocks = others[package, file]
            if other not in blocks:
                raise ValueError(
                    f"{where}: {name} includes {other!r} of {package}/{file}, "
                    "which that file does not define"
                )
            # What that file left open (such as {{now}}) is this file's to fill.
            return _INCLUDE.sub(include, _uncommented(blocks[other]))
        if other not in queries:
            if not strict:
                return match.group(0)
            raise ValueError(f"{where}: {name} includes {other!r}, which is not defined")
        return _uncommented(_expand(other, queries, where, (*seen, name), others, strict))

    return _INCLUDE.sub(include, queries[name])


def _as_pyformat(text: str) -> str:
    """SQL text with its ``:name`` placeholders as psycopg's ``%(name)s``."""
    return "\n".join(map(_pyformat, text.split("\n")))


def _pyformat(line: str) -> str:
    """A line with its ``:name`` placeholders as ``%(name)s`` (its comment left as it is)."""
    code, dashes, comment = line.partition("--")
    return _NAMED.sub(r"%(\1)s", code) + dashes + comment


def _uncommented(block: str) -> str:
    """A block without its leading and trailing comment lines: what an include puts in place.

    (Trailing ones are the heading of the next section of the file.)
    """
    lines = block.split("\n")
    while lines and lines[0].lstrip().startswith("--"):
        lines.pop(0)
    while lines and (not lines[-1].strip() or lines[-1].lstrip().startswith("--")):
        lines.pop()
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations(package: str, folder: str = "migrations") -> list[Migration]:
    """The ``package/folder/NNN_name.sql`` files in version order, numbered without gaps.

    ``folder`` is ``migrations`` unless named (``migrations/sqlite``): a package
    may keep a line of migrations per database, each in a folder of its own.
    """
    directory = resources.files(package)
    for part in folder.split("/"):
        directory = directory.joinpath(part)
    found: list[Migration] = []
    for entry in directory.iterdir():
        match = _MIGRATION_FILE.match(entry.name)
        if match:
            found.append(
                Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8"))
            )
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise ValueError(f"{package}/{folder}: migration {expected:03d} is missing")
    return found
