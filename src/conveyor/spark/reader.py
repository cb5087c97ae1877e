"""``spark.read.format("conveyor")``: jobs or events as a typed DataFrame.

The table is split into id ranges read in parallel; filters Spark pushes down
on names, states, ids and times become the SQL's WHERE clause. Rows come back
as Arrow record batches: on SQLite built a column at a time from the cursor,
on PostgreSQL parsed by Arrow's CSV reader straight from ``COPY ... TO STDOUT``
(psycopg building a Python object per value was the bottleneck).
"""

from __future__ import annotations

import contextlib
import gc
import io
import itertools
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import BooleanType, IntegerType, LongType, StringType

from conveyor.spark.db import Backend, backend_of, postgres_connect, queries, sqlite_connect
from conveyor.spark.source import ID_COLUMN, TABLES, Column, int_option, option

ROWS_PER_PARTITION = 250_000
MAX_PARTITIONS = 32
FETCH_ROWS = 50_000
_RANGE = {GreaterThan: ">", GreaterThanOrEqual: ">=", LessThan: "<", LessThanOrEqual: "<="}


@dataclass(frozen=True, slots=True)
class Condition:
    """One pushed filter as SQL: a fragment with its parameters, per backend."""

    sqlite: str
    postgres: str
    sqlite_params: tuple[Any, ...] = ()
    postgres_params: tuple[Any, ...] = ()


def _placeholder(backend: Backend) -> str:
    return "?" if backend == "sqlite" else "%s"


def arrow_type(column: Column) -> pa.DataType:
    if column.timestamp:
        return pa.timestamp("us", tz="UTC")
    kind = column.type
    if isinstance(kind, LongType):
        return pa.int64()
    if isinstance(kind, IntegerType):
        return pa.int32()
    if isinstance(kind, BooleanType):
        return pa.bool_()
    if isinstance(kind, StringType):
        return pa.string()
    return pa.float64()


def arrow_schema(columns: Sequence[Column]) -> pa.Schema:
    return pa.schema([pa.field(c.name, arrow_type(c), c.nullable) for c in columns])


def to_condition(column: Column, filter: Filter) -> Condition | None:
    """The SQL of a filter on ``column``, or None when Spark must apply it itself."""
    name = column.name
    kind = column.type
    if isinstance(filter, IsNull | IsNotNull):
        sql = f"{name} IS {'NOT ' if isinstance(filter, IsNotNull) else ''}NULL"
        return Condition(sql, sql)
    numeric = isinstance(kind, LongType | IntegerType) or column.timestamp
    if isinstance(filter, EqualTo | EqualNullSafe):
        values: tuple[Any, ...] = (filter.value,)
        op = "="
    elif isinstance(filter, In):
        values = tuple(filter.value)
        op = "IN"
    elif type(filter) in _RANGE and numeric:
        # Range filters on text would compare by the database's collation,
        # which need not be Spark's byte order: only numbers and times.
        values = (filter.value,)  # type: ignore[attr-defined]
        op = _RANGE[type(filter)]
    else:
        return None
    if not values or any(v is None for v in values):
        return None
    converted = [c for v in values if (c := _sql_value(column, v)) is not None]
    if len(converted) != len(values):
        return None
    lite = [c[0] for c in converted]
    pg = [c[1] for c in converted]
    if op == "IN":
        marks = ", ".join("?" * len(values))
        return Condition(f"{name} IN ({marks})", f"{name} = ANY(%s)", tuple(lite), (pg,))
    return Condition(f"{name} {op} ?", f"{name} {op} %s", (lite[0],), (pg[0],))


def _sql_value(column: Column, value: Any) -> tuple[Any, Any] | None:
    """(SQLite value, PostgreSQL value) of a filter literal, or None if of the wrong type."""
    if column.timestamp:
        if not isinstance(value, datetime):
            return None
        aware = value if value.tzinfo else value.replace(tzinfo=UTC)
        return aware.timestamp(), aware
    kind = column.type
    if isinstance(kind, LongType | IntegerType):
        if isinstance(value, bool) or not isinstance(value, int):
            return None
        return value, value
    if isinstance(kind, StringType) and isinstance(value, str):
        return value, value
    return None


@dataclass(frozen=True, slots=True)
class IdRange:
    low: int | None  # None: the table was empty when planned
    high: int


class ConveyorReader(DataSourceReader):
    def __init__(
        self, dsn: str, table: str, columns: tuple[Column, ...], options: Mapping[str, str]
    ) -> None:
        self.dsn = dsn
        self.backend = backend_of(dsn)
        self.table = table
        self.columns = columns
        self.conditions: list[Condition] = []
        self.partition_count = int_option(options, "numPartitions", None)
        self.trace_file = option(options, "traceFile")

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        by_name = {c.name: c for c in TABLES[self.table]}
        for item in filters:
            path: tuple[str, ...] = getattr(item, "attribute", ())
            column = by_name.get(path[0]) if len(path) == 1 else None
            condition = None if column is None else to_condition(column, item)
            if condition is None:
                yield item
            else:
                self.conditions.append(condition)

    def partitions(self) -> Sequence[InputPartition]:
        q = queries(self.backend)
        id_column = ID_COLUMN[self.table]
        sql = q["id_bounds"].format(id=id_column, table=self.table)
        if self.backend == "sqlite":
            conn = sqlite_connect(self.dsn)
            try:
                low, high = conn.execute(sql).fetchone()
            finally:
                conn.close()
        else:
            with postgres_connect(self.dsn) as pg:
                low, high = pg.execute(sql).fetchone() or (None, None)
        if low is None:
            return [InputPartition(IdRange(None, 0))]
        span = high - low + 1
        count = self.partition_count or math.ceil(span / ROWS_PER_PARTITION)
        count = max(1, min(count, MAX_PARTITIONS, span))
        step = math.ceil(span / count)
        return [
            InputPartition(IdRange(start, min(start + step, high + 1)))
            for start in range(low, high + 1, step)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        bounds: IdRange = partition.value
        if bounds.low is None:
            return
        id_column = ID_COLUMN[self.table]
        ph = _placeholder(self.backend)
        where = [f"{id_column} >= {ph}", f"{id_column} < {ph}"]
        params: list[Any] = [bounds.low, bounds.high]
        for condition in self.conditions:
            if self.backend == "sqlite":
                where.append(condition.sqlite)
                params.extend(condition.sqlite_params)
            else:
                where.append(condition.postgres)
                params.extend(condition.postgres_params)
        if self.backend == "sqlite":
            yield from self._read_sqlite(" AND ".join(where), params)
        else:
            yield from self._read_postgres(" AND ".join(where), params)

    def _trace(self, sql: str, params: Sequence[Any], rows: int) -> None:
        """With option traceFile: append each statement and how many rows it returned."""
        if self.trace_file is None:
            return
        entry = {"table": self.table, "sql": sql, "params": [str(p) for p in params], "rows": rows}
        with open(self.trace_file, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")

    def _read_sqlite(self, where: str, params: list[Any]) -> Iterator[pa.RecordBatch]:
        sql = queries("sqlite")["read_range"].format(
            columns=", ".join(c.name for c in self.columns) or "1",
            table=self.table,
            where=where,
            id=ID_COLUMN[self.table],
        )
        schema = arrow_schema(self.columns)
        conn = sqlite_connect(self.dsn)
        total = 0
        try:
            cursor = conn.execute(sql, params)
            while True:
                with _collector_paused():
                    rows = cursor.fetchmany(FETCH_ROWS)
                    if not rows:
                        break
                    total += len(rows)
                    batch = (
                        pa.RecordBatch.from_arrays(
                            [
                                _sqlite_array(c, v)
                                for c, v in zip(self.columns, zip(*rows, strict=True), strict=True)
                            ],
                            schema=schema,
                        )
                        if self.columns
                        else pa.RecordBatch.from_arrays([], schema=schema, num_rows=len(rows))
                    )
                    del rows  # freed before Spark takes the batch
                yield batch
        finally:
            conn.close()
            self._trace(sql, params, total)

    def _read_postgres(self, where: str, params: list[Any]) -> Iterator[pa.RecordBatch]:
        import pyarrow.csv as pacsv

        exprs = [_pg_select(c) for c in self.columns] or ["1"]
        sql = queries("postgres")["read_range"].format(
            columns=", ".join(exprs), table=self.table, where=where, id=ID_COLUMN[self.table]
        )
        read_types = {c.name: _pg_csv_type(c) for c in self.columns}
        names = [c.name for c in self.columns] or ["one"]
        schema = arrow_schema(self.columns)
        total = 0
        with postgres_connect(self.dsn) as pg:
            cursor = pg.cursor()
            with cursor.copy(sql, params) as copy:
                chunks = iter(copy)
                first = next(chunks, None)
                if first is None:
                    # An empty range: Arrow's CSV reader refuses an empty input.
                    self._trace(sql, params, 0)
                    return
                reader = pacsv.open_csv(
                    _CopyStream(itertools.chain([first], chunks)),
                    read_options=pacsv.ReadOptions(
                        column_names=names, block_size=8 << 20, use_threads=False
                    ),
                    parse_options=pacsv.ParseOptions(newlines_in_values=True),
                    convert_options=pacsv.ConvertOptions(
                        column_types=read_types,
                        null_values=[""],
                        strings_can_be_null=True,
                        quoted_strings_can_be_null=False,
                        true_values=["t"],
                        false_values=["f"],
                    ),
                )
                for batch in reader:
                    total += batch.num_rows
                    if not self.columns:
                        yield pa.RecordBatch.from_arrays([], schema=schema, num_rows=batch.num_rows)
                        continue
                    yield pa.RecordBatch.from_arrays(
                        [
                            _timestamps(batch.column(i)) if c.timestamp else batch.column(i)
                            for i, c in enumerate(self.columns)
                        ],
                        schema=schema,
                    )
        self._trace(sql, params, total)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off while a batch is fetched and converted.

    A fetch makes a tuple per row and an object per value, none of them in a
    cycle, yet each 700 allocations start a collection that walks them all:
    a fifth of a partition's read time. Back on before the batch is yielded.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _pg_select(column: Column) -> str:
    if column.timestamp:
        # Microseconds since the epoch: Arrow's CSV reader parses an integer far
        # faster than a timestamptz with its zone suffix.
        return f"(extract(epoch from {column.name}) * 1000000)::int8"
    if column.name in ("args", "kwargs", "result"):
        return f"{column.name}::text"
    return column.name


def _pg_csv_type(column: Column) -> pa.DataType:
    return pa.int64() if column.timestamp else arrow_type(column)


def _timestamps(micros: pa.Array | pa.ChunkedArray) -> pa.Array:
    return pc.cast(micros, pa.timestamp("us", tz="UTC"))


def _sqlite_array(column: Column, values: Sequence[Any]) -> pa.Array:
    if column.timestamp:
        # REAL epoch seconds -> whole microseconds, rounded (a double holds them exactly
        # for dates this side of 2255).
        seconds = pa.array(values, pa.float64())
        micros = pc.cast(pc.round(pc.multiply(seconds, 1e6)), pa.int64())
        return pc.cast(micros, pa.timestamp("us", tz="UTC"))
    if isinstance(column.type, BooleanType):
        return pc.cast(pa.array(values, pa.int64()), pa.bool_())
    return pa.array(values, arrow_type(column))


class _CopyStream(io.RawIOBase):
    """A file over the chunks of a COPY, for Arrow's streaming CSV reader."""

    def __init__(self, chunks: Iterator[Any]) -> None:
        self._chunks = chunks
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        # COPY sends a message per row; Arrow makes a record batch per read, so
        # each read fills the whole buffer it is given (one-row batches were
        # thirty times slower).
        view = memoryview(target).cast("B")
        size = len(view)
        filled = 0
        while filled < size:
            chunk = self._buffer or next(self._chunks, None)
            if chunk is None:
                break
            take = min(size - filled, len(chunk))
            view[filled : filled + take] = chunk[:take]
            self._buffer = chunk[take:] if take < len(chunk) else b""
            filled += take
        return filled
