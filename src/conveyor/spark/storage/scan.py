"""Scans: a table's rows by id range with filters, as one statement for either database.

The reader splits ``jobs`` or ``events`` into id ranges and pushes Spark's
filters down; each range is one statement built here. The two databases differ
in how a parameter is written (``?`` for sqlite3, ``%s`` for psycopg), how a
time is passed (SQLite keeps epoch seconds) and how a column is read (the
PostgreSQL scan is a ``COPY`` to CSV, so times and JSON are read as text there):
those are the builder's arguments, not a second builder.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from conveyor.errors import ConfigurationError
from conveyor.store.columns import EVENT_COLUMNS, JOB_COLUMNS

#: The tables ``scan`` reads and the column each is ordered and split by.
SCAN_ID_COLUMN = {"jobs": "id", "events": "seq"}
#: The columns a scan may name, by table (the same on both SQL stores).
SCAN_COLUMNS: dict[str, tuple[str, ...]] = {"jobs": JOB_COLUMNS, "events": EVENT_COLUMNS}
#: Columns stored as times (REAL epoch seconds on SQLite, timestamptz on PostgreSQL).
TIME_COLUMNS = frozenset(
    {"run_at", "lease_expires_at", "created_at", "started_at", "finished_at", "at"}
)
#: Comparisons ``scan`` puts in its WHERE clause.
ScanOp = Literal["=", "in", "<", "<=", ">", ">=", "is null", "is not null"]
Placeholder = Literal["?", "%s"]


@dataclass(frozen=True, slots=True)
class ScanFilter:
    """One condition of a scan: ``column op values`` (a list for "in", none for nulls)."""

    column: str
    op: ScanOp
    values: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class ScanRange:
    """What a scan reads: ``columns`` of the rows of ``table`` with ``low <= id <
    high`` that match every filter."""

    table: str
    columns: Sequence[str]
    low: int
    high: int
    filters: Sequence[ScanFilter] = ()


@dataclass(slots=True)
class Scan:
    """A running scan: its statement and parameters (for traces) and its chunks of rows.

    SQLite chunks are lists of row tuples (times as epoch seconds, booleans as
    0/1); PostgreSQL chunks are the bytes of ``COPY ... (FORMAT csv)`` (times as
    integer microseconds since the epoch, ``t``/``f`` booleans, JSON as text).
    """

    sql: str
    params: list[Any]
    chunks: Generator[Any, None, None]


def check_columns(table: str, columns: Sequence[str], known: Sequence[str]) -> None:
    """Refuse a table or column name the store does not have (names go into SQL text)."""
    if table not in SCAN_ID_COLUMN:
        raise ConfigurationError(f"cannot scan table {table!r}: choose jobs or events")
    unknown = [c for c in columns if c not in known]
    if unknown:
        raise ConfigurationError(f"{table} has no column(s) {', '.join(unknown)}")


def _as_is(column: str) -> str:
    return column


def scan_query(
    template: str,
    scan: ScanRange,
    *,
    known: Sequence[str],
    placeholder: Placeholder,
    epoch_times: bool = False,
    select: Callable[[str], str] = _as_is,
) -> tuple[str, list[Any]]:
    """The statement and parameters of a scan (see ``ScanRange``).

    ``template`` is the database's ``scan_range`` block. Names are checked
    against ``known`` (they go into the SQL text); values are parameters, in
    ``placeholder`` style, times as epoch seconds when ``epoch_times``.
    ``select`` says how each column is read.
    """
    table, columns = scan.table, scan.columns
    check_columns(table, [*columns, *(f.column for f in scan.filters)], known)
    id_column = SCAN_ID_COLUMN[table]
    where = [f"{id_column} >= {placeholder}", f"{id_column} < {placeholder}"]
    params: list[Any] = [scan.low, scan.high]
    for item in scan.filters:
        values = list(item.values)
        if epoch_times and item.column in TIME_COLUMNS:
            values = [v.timestamp() if isinstance(v, datetime) else v for v in values]
        fragment, values = _condition(item.column, item.op, values, placeholder)
        where.append(fragment)
        params.extend(values)
    sql = template.format(
        columns=", ".join(select(c) for c in columns) or "1",
        table=table,
        where=" AND ".join(where),
        id=id_column,
    )
    return sql, params


def _condition(
    column: str, op: ScanOp, values: list[Any], placeholder: Placeholder
) -> tuple[str, list[Any]]:
    """A filter as SQL: the column name is checked, the values are parameters."""
    if op == "is null":
        return f"{column} IS NULL", []
    if op == "is not null":
        return f"{column} IS NOT NULL", []
    if op == "in":
        if not values:  # "IN ()" is not SQL on PostgreSQL; it matches nothing anywhere
            return "1 = 0", []
        return f"{column} IN ({', '.join([placeholder] * len(values))})", values
    if op in ("=", "<", "<=", ">", ">="):
        return f"{column} {op} {placeholder}", values[:1]
    raise ValueError(f"unknown scan operator {op!r}")
