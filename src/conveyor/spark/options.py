"""The options of the ``conveyor`` data source: the documented set of each use, checked.

Spark hands options over as a case-insensitive dict (``dict()`` of it has
lowercased keys), so names are compared lowercased and shown as documented.
An option outside the set of the read or write at hand fails before anything
is read or written, naming the closest valid option and listing the rest: a
misspelt ``keyColum`` must never quietly become a task argument.

Spark SQL tables: ``CREATE TABLE t USING conveyor OPTIONS (...)`` hands the
options to ``schema()`` once, when the table is created, and (Spark 4.3) never
again to the reads and writes of the table. ``schema()`` therefore keeps them
in the table's schema, as metadata of its first column, and reads and writes
take them back from there (see ``from_table_schema``).

Spark passes a write the table's schema (with that metadata) only when it
rewrites the inserted columns to the table's: when names or types differ.
``INSERT INTO t SELECT a, b FROM s`` whose columns already match the table's
reaches the writer with the query's own schema, bare of metadata, and the
options would be lost. A write table's column names are therefore kept in an
unusual letter case (``iMaGe_Id``): Spark compares names exactly there, so it
always rewrites the columns, carrying the metadata, while ``BY NAME`` and
column lists match names case-insensitively as ever. The names as given in
option ``schema`` are kept beside the options, and the writer puts them back.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from conveyor.errors import ConfigurationError

Use = Literal["read", "stream read", "write", "stream write", "table"]

#: Every option, as documented, by the uses it belongs to.
_OPTIONS: dict[str, tuple[Use, ...]] = {
    "dsn": ("read", "stream read", "write", "stream write", "table"),
    # reads
    "table": ("read", "stream read", "table"),
    "columns": ("read", "stream read", "table"),
    "numPartitions": ("read", "table"),
    "traceFile": ("read", "table"),
    "startingOffsets": ("read", "stream read", "table"),
    "endingOffsets": ("read", "table"),
    "startingTimestamp": ("stream read",),
    "maxEventsPerTrigger": ("stream read",),
    # writes
    "app": ("write", "stream write", "table"),
    "task": ("write", "stream write", "table"),
    "taskColumn": ("write", "stream write", "table"),
    "queue": ("write", "stream write", "table"),
    "queueColumn": ("write", "stream write", "table"),
    "keyColumn": ("write", "stream write", "table"),
    "unique": ("write", "stream write", "table"),
    "nullKeys": ("write", "stream write", "table"),
    "createTables": ("write", "stream write", "table"),
    "groupColumn": ("write", "stream write", "table"),
    "batch": ("write", "stream write", "table"),
    "batchColumn": ("write", "stream write", "table"),
    "priority": ("write", "stream write", "table"),
    "priorityColumn": ("write", "stream write", "table"),
    "runAtColumn": ("write", "stream write", "table"),
    "maxAttempts": ("write", "stream write", "table"),
    "argsColumn": ("write", "stream write", "table"),
    "kwargsColumn": ("write", "stream write", "table"),
    "excludeColumns": ("write", "stream write", "table"),
    "batchSize": ("write", "stream write", "table"),
    "commitPieces": ("write", "stream write", "table"),
    "abandonedAfterHours": ("write", "stream write", "table"),
    "atomic": ("write", "table"),
    "writeId": ("write", "table"),
    # Spark's own option of a streaming sink.
    "checkpointLocation": ("stream write",),
    # A SQL table that enqueues: its columns (see the module).
    "schema": ("table",),
}
#: Names people reach for that mean one of ours: the Python API's, Kafka's, JDBC's.
_ALIASES = {
    "key": "keyColumn",
    "group": "groupColumn",
    "run_at": "runAtColumn",
    "runat": "runAtColumn",
    "max_attempts": "maxAttempts",
    "args": "argsColumn",
    "kwargs": "kwargsColumn",
    "exclude": "excludeColumns",
    "batch_size": "batchSize",
    "maxoffsetspertrigger": "maxEventsPerTrigger",
    "maxrecordspertrigger": "maxEventsPerTrigger",
    "maxrowspertrigger": "maxEventsPerTrigger",
    "dbtable": "table",
    "url": "dsn",
    "partitions": "numPartitions",
}
_WHAT = {
    "read": "a conveyor read",
    "stream read": "a conveyor stream read",
    "write": "a conveyor write",
    "stream write": "a conveyor streaming sink",
    "table": "a conveyor table definition",
}
#: Keys Spark adds to the options of a table it creates.
_CATALOG_KEYS = frozenset({"owner", "provider"})
#: Metadata key of the first column of a SQL table's schema that keeps its options.
METADATA_KEY = "conveyor.options"
#: How a write table's first column comment starts when it keeps the options.
COMMENT_PREFIX = "conveyor:"
#: The key, beside the options in that comment, of the columns' names as given.
COLUMNS_KEY = "@columns"


def names_for(use: Use) -> list[str]:
    return [name for name, uses in _OPTIONS.items() if use in uses]


def _closest(typed: str, allowed: list[str]) -> str | None:
    lowered = {name.lower(): name for name in allowed}
    alias = _ALIASES.get(typed)
    if alias is not None and alias in allowed:
        return alias
    starting = [name for low, name in lowered.items() if low.startswith(typed) and typed]
    if len(starting) == 1:
        return starting[0]
    match = difflib.get_close_matches(typed, list(lowered), n=1, cutoff=0.6)
    return lowered[match[0]] if match else None


class Options:
    """The options of one use, checked against its documented set, with typed getters."""

    def __init__(self, raw: Mapping[str, str], use: Use | tuple[Use, ...]) -> None:
        uses = use if isinstance(use, tuple) else (use,)
        self.what = " or ".join(_WHAT[u] for u in uses)
        allowed = sorted({name for u in uses for name in names_for(u)}, key=str.lower)
        canonical = {name.lower(): name for name in allowed}
        self.values: dict[str, str] = {}
        for key, value in raw.items():
            typed = str(key).lower()
            if typed in _CATALOG_KEYS or typed.startswith("option."):
                continue
            name = canonical.get(typed)
            if name is None:
                raise ConfigurationError(self._unknown(typed, allowed, str(key)))
            self.values[name] = str(value)

    def _unknown(self, typed: str, allowed: list[str], shown: str) -> str:
        """Why an option is refused, quoting it as given (``shown``; ``typed`` is lowercased).

        PySpark lowercases the names of ``.option()`` before a data source sees
        them; ``conveyor.spark.enqueue`` checks its options as typed beforehand.
        """
        known_elsewhere = {n.lower(): n for n in _OPTIONS}.get(typed)
        if known_elsewhere is not None:
            uses = ", ".join(_WHAT[u] for u in _OPTIONS[known_elsewhere])
            return (
                f'option "{known_elsewhere}" does not apply to {self.what} (it is an option of '
                f"{uses}). The options of {self.what} are: {', '.join(allowed)}"
            )
        closest = _closest(typed, allowed)
        hint = f' Did you mean "{closest}"?' if closest else ""
        return (
            f'unknown option "{shown}" for {self.what}.{hint} '
            f"The options of {self.what} are: {', '.join(allowed)}"
        )

    def __contains__(self, name: str) -> bool:
        return name in self.values

    def text(self, name: str, default: str | None = None) -> str | None:
        return self.values.get(name, default)

    def required(self, name: str, what: str) -> str:
        value = self.values.get(name)
        if value is None or not value.strip():
            raise ConfigurationError(f'{self.what} needs .option("{name}", ...): {what}')
        return value

    def integer(
        self, name: str, default: int | None, minimum: int | None = 1, maximum: int | None = None
    ) -> int | None:
        value = self.values.get(name)
        if value is None:
            return default
        try:
            number = int(value.strip())
        except ValueError:
            raise ConfigurationError(f"option {name} must be an integer, got {value!r}") from None
        if minimum is not None and number < minimum:
            raise ConfigurationError(f"option {name} must be at least {minimum}, got {number}")
        if maximum is not None and number > maximum:
            raise ConfigurationError(f"option {name} must be at most {maximum}, got {number}")
        return number

    def boolean(self, name: str, default: bool) -> bool:
        value = self.values.get(name)
        if value is None:
            return default
        lowered = value.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise ConfigurationError(f"option {name} must be true or false, got {value!r}")

    def choice(self, name: str, choices: Iterable[str], default: str) -> str:
        value = (self.values.get(name) or default).strip().lower()
        options = list(choices)
        if value not in options:
            listed = " or ".join(f'"{c}"' for c in options)
            raise ConfigurationError(
                f"option {name} must be {listed}, got {self.values.get(name)!r}"
            )
        return value

    def names(self, name: str) -> list[str]:
        """A comma-separated list of names (columns), blanks dropped."""
        value = self.values.get(name)
        if value is None:
            return []
        return [part.strip() for part in value.split(",") if part.strip()]

    def timestamp(self, name: str) -> datetime | None:
        """Milliseconds since the epoch (as Kafka's startingTimestamp), or ISO 8601 with a zone."""
        value = self.values.get(name)
        if value is None:
            return None
        text = value.strip()
        try:
            return datetime.fromtimestamp(int(text) / 1000, UTC)
        except ValueError:
            pass
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            moment = None
        if moment is None or moment.tzinfo is None:
            raise ConfigurationError(
                f"option {name} must be milliseconds since the epoch or an ISO 8601 time with "
                f"a zone (2026-11-23T08:00:00Z), got {value!r}"
            )
        return moment.astimezone(UTC)


def is_table_definition(raw: Mapping[str, str]) -> bool:
    """Whether Spark is creating a catalog table (it adds these keys to the options)."""
    return "provider" in {str(k).lower() for k in raw}


def definition_options(raw: Mapping[str, str]) -> dict[str, str]:
    """A table definition's own options, without the keys Spark adds (lowercased names)."""
    return {
        str(k).lower(): str(v)
        for k, v in raw.items()
        if str(k).lower() not in _CATALOG_KEYS and not str(k).lower().startswith("option.")
    }


@dataclass(frozen=True, slots=True)
class Found:
    """The options of a read or write, and what a SQL table's schema said besides."""

    options: Mapping[str, str]
    #: They came from a table definition.
    from_table: bool = False
    #: A write table's column names as given in its option schema, by position.
    columns: tuple[str, ...] | None = None


def from_table_schema(raw: Mapping[str, str], schema: object) -> Found:
    """The options of a read or write: its own, or (a SQL table) those its schema keeps."""
    if any(str(k).lower() == "dsn" for k in raw):
        return Found(raw)
    fields = getattr(schema, "fields", None) or []
    if not fields:
        return Found(raw)
    metadata = getattr(fields[0], "metadata", None) or {}
    kept = metadata.get(METADATA_KEY)
    comment = metadata.get("comment")
    if kept is None and isinstance(comment, str) and comment.startswith(COMMENT_PREFIX):
        kept = comment[len(COMMENT_PREFIX) :]
    if kept is None:
        return Found(raw)
    options = json.loads(kept) if isinstance(kept, str) else dict(kept)
    names = options.pop(COLUMNS_KEY, None)
    columns = tuple(str(n) for n in names) if isinstance(names, list) else None
    if columns is not None and len(columns) != len(fields):
        columns = None  # not this table's columns: leave the names as Spark gave them
    merged = {**options, **{str(k).lower(): str(v) for k, v in raw.items()}}
    return Found(merged, True, columns)


def ddl_with_options(ddl: str, options: Mapping[str, str]) -> str:
    """A DDL column list with the options kept as the first column's comment.

    The comment is a Spark SQL string literal: backslashes and quotes escaped.
    """
    columns = _split_columns(ddl)
    if " comment " in f" {columns[0].lower()} ":
        raise ConfigurationError(
            "option schema: the first column of a conveyor table cannot have a COMMENT "
            "(conveyor keeps the table's options there)"
        )
    named = [_column_name(column) for column in columns]
    kept = {**options, COLUMNS_KEY: [name for name, _ in named]}
    text = COMMENT_PREFIX + json.dumps(kept, sort_keys=True)
    literal = text.replace("\\", "\\\\").replace("'", "\\'")
    defined = [f"{_quoted(disguise(name))}{rest}" for name, rest in named]
    defined[0] = f"{defined[0]} COMMENT '{literal}'"
    return ", ".join(defined)


def disguise(name: str) -> str:
    """``image_id`` -> ``iMaGe_Id``: the name in a letter case no query's columns have.

    Never the name as given (``n`` -> ``N``), the case a source's columns have most.
    """
    out = []
    upper = False
    for char in name:
        if char.isalpha():
            out.append(char.upper() if upper else char.lower())
            upper = not upper
        else:
            out.append(char)
    disguised = "".join(out)
    return disguised.swapcase() if disguised == name else disguised


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _column_name(column: str) -> tuple[str, str]:
    """``"`a b` INT NOT NULL"`` -> ``("a b", " INT NOT NULL")``."""
    if column.startswith("`"):
        index = 1
        name = []
        while index < len(column):
            if column[index] == "`":
                if column[index + 1 : index + 2] == "`":
                    name.append("`")
                    index += 2
                    continue
                return "".join(name), column[index + 1 :]
            name.append(column[index])
            index += 1
        raise ConfigurationError(f"option schema: unclosed ` in column {column!r}")
    head = re.match(r"[^\s:]+", column)
    if head is None:
        raise ConfigurationError(f"option schema: no column name in {column!r}")
    return head[0], column[head.end() :]


def _split_columns(ddl: str) -> list[str]:
    """``"a int, b map<string,int>"`` -> ``["a int", "b map<string,int>"]``."""
    depth = 0
    quote: str | None = None
    columns = []
    start = 0
    for index, char in enumerate(ddl):
        if quote:
            if char == quote:
                quote = None
        elif char in "`'\"":
            quote = char
        elif char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        elif char == "," and depth == 0:
            columns.append(ddl[start:index].strip())
            start = index + 1
    columns.append(ddl[start:].strip())
    if not any(columns):
        raise ConfigurationError(
            "option schema is empty: name the table's columns, e.g. 'id BIGINT'"
        )
    if not all(columns):
        raise ConfigurationError(f"option schema has an empty column: {ddl!r}")
    return columns
