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
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from conveyor.errors import ConfigurationError
from conveyor.spark.db import backend_of, postgres_connect, queries, sqlite_connect
from conveyor.spark.reader import _sqlite_array, arrow_schema
from conveyor.spark.source import Column, int_option, option

FETCH_ROWS = 50_000


@dataclass(frozen=True, slots=True)
class EventRange:
    start: dict[str, int]
    end: dict[str, int]


class EventStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, dsn: str, columns: tuple[Column, ...], options: Mapping[str, str]) -> None:
        self.dsn = dsn
        self.backend = backend_of(dsn)
        self.columns = columns
        self.max_events = int_option(options, "maxEventsPerTrigger", None)
        #: Under Trigger.AvailableNow: the offset of the last event there was at the start.
        self.target: dict[str, int] | None = None
        self.starting = (option(options, "startingOffsets", "earliest") or "earliest").lower()
        if self.starting not in ("earliest", "latest"):
            raise ConfigurationError(
                f'option startingOffsets must be "earliest" or "latest", got {self.starting!r}'
            )

    def _origin(self) -> dict[str, int]:
        return {"seq": 0} if self.backend == "sqlite" else {"xid": 0, "seq": 0}

    def initialOffset(self) -> dict[str, int]:
        if self.starting == "earliest":
            return self._origin()
        return self._latest(self._origin(), None)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_events is None else ReadMaxRows(self.max_events)

    def prepareForTriggerAvailableNow(self) -> None:
        # Everything up to here and nothing after, in as many batches of
        # maxEventsPerTrigger as it takes. On PostgreSQL no event can appear
        # below this offset later (its transactions have all ended), so the
        # target is exact.
        self.target = self._latest(self._origin(), None)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        latest = self._latest(start, rows)
        if self.target is not None:
            latest = min(latest, max(self.target, start, key=self._order), key=self._order)
        return latest

    def _order(self, offset: dict[str, int]) -> tuple[int, int]:
        return (offset.get("xid", 0), offset["seq"])

    def _latest(self, start: dict[str, int], limit: int | None) -> dict[str, int]:
        q = queries(self.backend)
        if self.backend == "sqlite":
            conn = sqlite_connect(self.dsn)
            try:
                if limit is None:
                    seq = conn.execute(q["stream_latest"]).fetchone()[0]
                else:
                    bounds = {"after": start["seq"], "limit": limit}
                    seq = conn.execute(q["stream_latest_limited"], bounds).fetchone()[0]
            finally:
                conn.close()
            return {"seq": max(seq or 0, start["seq"])}
        params: dict[str, int | None] = {"xid": start["xid"], "seq": start["seq"], "limit": limit}
        statement = q["stream_latest" if limit is None else "stream_latest_limited"]
        with postgres_connect(self.dsn) as pg:
            row = pg.execute(statement, params).fetchone()
        if row is None:
            return start
        return {"xid": int(row[0]), "seq": int(row[1])}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return [InputPartition(EventRange(start, end))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        span: EventRange = partition.value
        if span.start == span.end:
            return
        columns = ", ".join(c.name for c in self.columns) or "1"
        sql = queries(self.backend)["stream_read"].format(columns=columns)
        schema = arrow_schema(self.columns)
        params: dict[str, Any]
        if self.backend == "sqlite":
            params = {"after": span.start["seq"], "until": span.end["seq"]}
            conn = sqlite_connect(self.dsn)
            try:
                cursor = conn.execute(sql, params)
                while rows := cursor.fetchmany(FETCH_ROWS):
                    yield _batch(self.columns, schema, rows, sqlite=True)
            finally:
                conn.close()
            return
        params = {
            "after_xid": span.start["xid"],
            "after_seq": span.start["seq"],
            "until_xid": span.end["xid"],
            "until_seq": span.end["seq"],
        }
        with postgres_connect(self.dsn) as pg:
            pg_cursor = pg.execute(sql, params)
            while rows := pg_cursor.fetchmany(FETCH_ROWS):
                yield _batch(self.columns, schema, rows, sqlite=False)

    def commit(self, end: dict[str, int]) -> None:
        # Nothing to release: the offsets live in Spark's checkpoint.
        return None


def _batch(
    columns: tuple[Column, ...], schema: pa.Schema, rows: list[Any], *, sqlite: bool
) -> pa.RecordBatch:
    if not columns:
        return pa.RecordBatch.from_arrays([], schema=schema, num_rows=len(rows))
    values = list(zip(*rows, strict=True))
    if sqlite:
        arrays = [_sqlite_array(c, v) for c, v in zip(columns, values, strict=True)]
    else:
        # Micro-batches are small: psycopg's datetimes are fine here.
        arrays = [
            pa.array(v, schema.field(c.name).type) for c, v in zip(columns, values, strict=True)
        ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
