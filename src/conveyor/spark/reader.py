"""``spark.read.format("conveyor")``: jobs or events as a typed DataFrame.

The table is split into id ranges read in parallel; filters Spark pushes down
on names, states, ids and times become conditions of the store's scan. Rows
come back as Arrow record batches: on SQLite built a column at a time from
the store's rows, on PostgreSQL parsed by Arrow's CSV reader straight from the
store's ``COPY ... TO STDOUT`` (psycopg building a Python object per value was
the bottleneck).

A batch read of the events table also takes ``startingOffsets`` (``earliest``
or a seq, the first one read) and ``endingOffsets`` (``latest`` or a seq, the
first one not read), as Spark's Kafka source does.
"""

from __future__ import annotations

import contextlib
import gc
import io
import itertools
import json
import math
from collections.abc import Iterable, Iterator, Sequence
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
from pyspark.sql.types import IntegerType, LongType, StringType

from conveyor.errors import ConfigurationError
from conveyor.spark.options import Options
from conveyor.spark.storage import Scan, ScanFilter, ScanOp, ScanRange, backend_of, open_storage
from conveyor.spark.tables import TABLES, Column, arrow_schema, arrow_type, sqlite_array

ROWS_PER_PARTITION = 250_000
MAX_PARTITIONS = 32
FETCH_ROWS = 50_000
_RANGE: dict[type, ScanOp] = {
    GreaterThan: ">",
    GreaterThanOrEqual: ">=",
    LessThan: "<",
    LessThanOrEqual: "<=",
}


def to_filter(column: Column, filter: Filter) -> ScanFilter | None:
    """The store condition of a filter on ``column``, or None when Spark must apply it itself."""
    name = column.name
    kind = column.type
    if isinstance(filter, IsNull | IsNotNull):
        return ScanFilter(name, "is not null" if isinstance(filter, IsNotNull) else "is null")
    numeric = isinstance(kind, LongType | IntegerType) or column.timestamp
    op: ScanOp
    if isinstance(filter, EqualTo | EqualNullSafe):
        values: tuple[Any, ...] = (filter.value,)
        op = "="
    elif isinstance(filter, In):
        values = tuple(filter.value)
        op = "in"
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
    return ScanFilter(name, op, tuple(converted))


def _sql_value(column: Column, value: Any) -> Any:
    """A filter literal as the store takes it, or None if it is of the wrong type."""
    if column.timestamp:
        if not isinstance(value, datetime):
            return None
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    kind = column.type
    if isinstance(kind, LongType | IntegerType):
        if isinstance(value, bool) or not isinstance(value, int):
            return None
        return value
    if isinstance(kind, StringType) and isinstance(value, str):
        return value
    return None


@dataclass(frozen=True, slots=True)
class IdRange:
    low: int | None  # None: nothing to read
    high: int


class ConveyorReader(DataSourceReader):
    def __init__(self, dsn: str, table: str, columns: tuple[Column, ...], options: Options) -> None:
        self.dsn = dsn
        self.backend = backend_of(dsn)
        self.table = table
        self.columns = columns
        self.filters: list[ScanFilter] = []
        self.partition_count = options.integer("numPartitions", None)
        self.trace_file = options.text("traceFile")
        self.first, self.stop = _seq_bounds(table, options)

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        by_name = {c.name: c for c in TABLES[self.table]}
        for item in filters:
            path: tuple[str, ...] = getattr(item, "attribute", ())
            column = by_name.get(path[0]) if len(path) == 1 else None
            condition = None if column is None else to_filter(column, item)
            if condition is None:
                yield item
            else:
                self.filters.append(condition)

    def partitions(self) -> Sequence[InputPartition]:
        store = open_storage(self.dsn)
        try:
            low, high = store.scan_id_bounds(self.table)
        finally:
            store.close()
        if low is not None and high is not None:
            low = max(low, self.first)
            if self.stop is not None:
                high = min(high, self.stop - 1)
        if low is None or high is None or low > high:
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
        store = open_storage(self.dsn)
        try:
            columns = [c.name for c in self.columns]
            what = ScanRange(self.table, columns, bounds.low, bounds.high, self.filters)
            scan = store.scan(what, FETCH_ROWS)
            # The chunks are closed before the store: a read Spark stops early
            # (a limit) must not leave a cursor on a closed connection.
            with contextlib.closing(scan.chunks):
                if self.backend == "sqlite":
                    yield from self._from_rows(scan)
                else:
                    yield from self._from_csv(scan)
        finally:
            store.close()

    def _trace(self, sql: str, params: Sequence[Any], rows: int) -> None:
        """With option traceFile: append each statement and how many rows it returned."""
        if self.trace_file is None:
            return
        entry = {"table": self.table, "sql": sql, "params": [str(p) for p in params], "rows": rows}
        with open(self.trace_file, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")

    def _from_rows(self, scan: Scan) -> Iterator[pa.RecordBatch]:
        schema = arrow_schema(self.columns)
        total = 0
        try:
            while True:
                # The fetch and the conversion in one pause of the collector: had it
                # come back on between them, its first run would walk every row.
                with collector_paused():
                    rows = next(scan.chunks, None)
                    if rows is None:
                        break
                    total += len(rows)
                    batch = (
                        pa.RecordBatch.from_arrays(
                            [
                                sqlite_array(c, v)
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
            self._trace(scan.sql, scan.params, total)

    def _from_csv(self, scan: Scan) -> Iterator[pa.RecordBatch]:
        import pyarrow.csv as pacsv

        read_types = {c.name: _pg_csv_type(c) for c in self.columns}
        names = [c.name for c in self.columns] or ["one"]
        schema = arrow_schema(self.columns)
        total = 0
        first = next(scan.chunks, None)
        if first is None:
            # An empty range: Arrow's CSV reader refuses an empty input.
            self._trace(scan.sql, scan.params, 0)
            return
        reader = pacsv.open_csv(
            _CopyStream(itertools.chain([first], scan.chunks)),
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
        self._trace(scan.sql, scan.params, total)


def _seq_bounds(table: str, options: Options) -> tuple[int, int | None]:
    """(first seq read, first seq not read or None) from startingOffsets and endingOffsets."""
    starting = (options.text("startingOffsets") or "earliest").strip().lower()
    ending = (options.text("endingOffsets") or "latest").strip().lower()
    if table != "events" and ("startingOffsets" in options or "endingOffsets" in options):
        raise ConfigurationError(
            "options startingOffsets and endingOffsets apply to the events table; filter jobs "
            "with .where() on id"
        )
    if starting == "latest":
        raise ConfigurationError(
            'a batch read cannot start at "latest" (it would read nothing): use "earliest" or a seq'
        )
    first = 0 if starting == "earliest" else _seq(options, "startingOffsets", "earliest")
    stop = None if ending == "latest" else _seq(options, "endingOffsets", "latest")
    return first, stop


def _seq(options: Options, name: str, word: str) -> int:
    try:
        return options.integer(name, None, minimum=0) or 0
    except ConfigurationError:
        raise ConfigurationError(
            f'option {name} must be "{word}" or a seq (an event number, 0 or more), got '
            f"{options.text(name)!r}"
        ) from None


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
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


def _pg_csv_type(column: Column) -> pa.DataType:
    return pa.int64() if column.timestamp else arrow_type(column)


def _timestamps(micros: pa.Array | pa.ChunkedArray) -> pa.Array:
    return pc.cast(micros, pa.timestamp("us", tz="UTC"))


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
