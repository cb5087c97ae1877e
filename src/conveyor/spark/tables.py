"""The tables a conveyor read gives Spark: their columns, Spark and Arrow types.

The batch reader, the event stream and the data source's schemas all read
these definitions, and none of them imports another for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: DataType
    nullable: bool = True
    #: Stored as epoch seconds (SQLite REAL) or timestamptz (PostgreSQL).
    timestamp: bool = False


def _ts(name: str, nullable: bool = True) -> Column:
    return Column(name, TimestampType(), nullable, timestamp=True)


# The columns a DataFrame of each table has, in order. Lease tokens are left
# out: they are a running worker's secret, of no use to analytics.
TABLES: dict[str, tuple[Column, ...]] = {
    "jobs": (
        Column("id", LongType(), False),
        Column("queue", StringType(), False),
        Column("task", StringType(), False),
        Column("state", StringType(), False),
        Column("args", StringType(), False),
        Column("kwargs", StringType(), False),
        Column("priority", IntegerType(), False),
        _ts("run_at", False),
        Column("attempts", IntegerType(), False),
        Column("max_attempts", IntegerType(), False),
        Column("key", StringType()),
        Column("group_key", StringType()),
        Column("batch", StringType()),
        Column("worker", StringType()),
        _ts("lease_expires_at"),
        Column("cancel_requested", BooleanType(), False),
        Column("result", StringType()),
        Column("error", StringType()),
        Column("progress", DoubleType()),
        Column("progress_message", StringType()),
        _ts("created_at", False),
        _ts("started_at"),
        _ts("finished_at"),
    ),
    "events": (
        Column("seq", LongType(), False),
        Column("job_id", LongType(), False),
        Column("queue", StringType(), False),
        Column("task", StringType(), False),
        Column("kind", StringType(), False),
        Column("attempt", IntegerType(), False),
        Column("worker", StringType()),
        _ts("at", False),
        Column("error", StringType()),
        # The start of the attempt the event ends (null for events that end none).
        _ts("started_at"),
        # How many jobs an enqueued event counts: PostgreSQL writes one per queue
        # and task of an enqueue, named after its first job (null: one job).
        Column("jobs", IntegerType()),
    ),
}


def struct_of(columns: tuple[Column, ...], metadata: dict[str, str] | None = None) -> StructType:
    return StructType(
        [
            StructField(c.name, c.type, c.nullable, metadata if i == 0 else None)
            for i, c in enumerate(columns)
        ]
    )


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


def sqlite_array(column: Column, values: Sequence[Any]) -> pa.Array:
    if column.timestamp:
        # REAL epoch seconds -> whole microseconds, rounded (a double holds them exactly
        # for dates this side of 2255).
        seconds = pa.array(values, pa.float64())
        micros = pc.cast(pc.round(pc.multiply(seconds, 1e6)), pa.int64())
        return pc.cast(micros, pa.timestamp("us", tz="UTC"))
    if isinstance(column.type, BooleanType):
        return pc.cast(pa.array(values, pa.int64()), pa.bool_())
    return pa.array(values, arrow_type(column))
