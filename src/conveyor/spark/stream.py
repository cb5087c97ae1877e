"""``spark.readStream.format("conveyor")``: the event log as a stream, ``seq`` the offset.

On SQLite one writer commits at a time, so events commit in ``seq`` order and
the offset is the last ``seq`` handed out.

On PostgreSQL a transaction can commit a lower ``seq`` after a higher one was
read: a stream that trusted ``max(seq)`` would skip it for ever. Each event
records its writing transaction (``xid``); the stream hands out only events of
transactions below the oldest one still running (the snapshot's ``xmin``), all
of which have ended, and walks them in ``(xid, seq)`` order. The offset is that
pair: every event at or before it has been handed out, and no event can appear
there later. A long-running transaction holds the stream back until it ends;
that is the price of never losing an event.

Where a new query starts (a query restarted from its checkpoint continues from
there instead): ``startingOffsets`` is ``earliest`` (the default), ``latest``
(only events recorded from now on) or a seq (that event and the ones after
it); ``startingTimestamp`` (milliseconds since the epoch, or ISO 8601 with a
zone) starts at the first event recorded at that time or later. On PostgreSQL
a start at a seq is kept in the offset as a floor (``from``): events below it
are never handed out, even one that commits late.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from conveyor.errors import ConfigurationError
from conveyor.spark.options import Options
from conveyor.spark.storage import SparkStorage, backend_of, open_storage
from conveyor.spark.tables import Column, arrow_schema, sqlite_array
from conveyor.store.records import EventOffset

Offset = dict[str, int]


@dataclass(frozen=True, slots=True)
class EventRange:
    start: Offset
    end: Offset


class EventStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, dsn: str, columns: tuple[Column, ...], options: Options) -> None:
        self.dsn = dsn
        self.backend = backend_of(dsn)
        self.columns = columns
        self.max_events = options.integer("maxEventsPerTrigger", None)
        #: Under Trigger.AvailableNow: the offset of the last event there was at the start.
        self.target: Offset | None = None
        self.starting = (options.text("startingOffsets") or "earliest").strip().lower()
        self.starting_at = options.timestamp("startingTimestamp")
        if self.starting_at is not None and "startingOffsets" in options:
            raise ConfigurationError("give startingOffsets or startingTimestamp, not both")
        if self.starting not in ("earliest", "latest"):
            try:
                self.starting_seq: int | None = options.integer("startingOffsets", None, 0)
            except ConfigurationError:
                raise ConfigurationError(
                    'option startingOffsets must be "earliest", "latest" or a seq (an event '
                    f"number, 0 or more), got {options.text('startingOffsets')!r}"
                ) from None
        else:
            self.starting_seq = None

    def _store(self) -> SparkStorage:
        return open_storage(self.dsn)

    def _origin(self, floor: int = 0) -> Offset:
        if self.backend == "sqlite":
            return {"seq": max(0, floor - 1)}
        return {"xid": 0, "seq": 0, "from": floor} if floor else {"xid": 0, "seq": 0}

    def initialOffset(self) -> Offset:
        if self.starting_at is not None:
            store = self._store()
            try:
                seq = store.event_first_seq_since(self.starting_at)
            finally:
                store.close()
            if seq is None:  # nothing recorded since then yet: start at the end
                return self._latest(self._origin(), None)
            return self._origin(seq)
        if self.starting_seq is not None:
            return self._origin(self.starting_seq)
        if self.starting == "latest":
            return self._latest(self._origin(), None)
        return self._origin()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_events is None else ReadMaxRows(self.max_events)

    def prepareForTriggerAvailableNow(self) -> None:
        # Everything up to here and nothing after, in as many batches of
        # maxEventsPerTrigger as it takes. On PostgreSQL no event can appear
        # below this offset later (its transactions have all ended), so the
        # target is exact.
        self.target = self._latest(self._origin(), None)

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        latest = self._latest(start, rows)
        if self.target is not None:
            target = {**self.target, **({"from": start["from"]} if "from" in start else {})}
            latest = min(latest, max(target, start, key=_order), key=_order)
        return latest

    def _latest(self, start: Offset, limit: int | None) -> Offset:
        store = self._store()
        try:
            xid, seq = store.event_stream_end(_pair(start), limit, start.get("from", 0))
        finally:
            store.close()
        if self.backend == "sqlite":
            return {"seq": seq}
        return {"xid": xid, "seq": seq, **({"from": start["from"]} if "from" in start else {})}

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        return [InputPartition(EventRange(start, end))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        span: EventRange = partition.value
        if _pair(span.start) == _pair(span.end):
            return
        schema = arrow_schema(self.columns)
        store = self._store()
        try:
            chunks = store.event_stream_read(
                _pair(span.start),
                _pair(span.end),
                [c.name for c in self.columns],
                span.start.get("from", 0),
            )
            with contextlib.closing(chunks):
                for rows in chunks:
                    yield _batch(self.columns, schema, rows, sqlite=self.backend == "sqlite")
        finally:
            store.close()

    def commit(self, end: Offset) -> None:
        # Nothing to release: the offsets live in Spark's checkpoint.
        return None


def _pair(offset: Offset) -> EventOffset:
    return (offset.get("xid", 0), offset["seq"])


def _order(offset: Offset) -> tuple[int, int]:
    return _pair(offset)


def _batch(
    columns: tuple[Column, ...], schema: pa.Schema, rows: list[tuple[object, ...]], *, sqlite: bool
) -> pa.RecordBatch:
    if not columns:
        return pa.RecordBatch.from_arrays([], schema=schema, num_rows=len(rows))
    values = list(zip(*rows, strict=True))
    if sqlite:
        arrays = [sqlite_array(c, v) for c, v in zip(columns, values, strict=True)]
    else:
        # Micro-batches are small: psycopg's datetimes are fine here.
        arrays = [
            pa.array(v, schema.field(c.name).type) for c, v in zip(columns, values, strict=True)
        ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
