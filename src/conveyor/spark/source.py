"""The ``conveyor`` Python data source: batch reads, streaming reads and writes.

Options arrive as a case-insensitive dict whose ``dict()`` has lowercased keys,
so every option is looked up by its lowercase name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
)
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

from conveyor.errors import ConfigurationError
from conveyor.spark.db import Backend, backend_of

NAME = "conveyor"


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
    ),
}
#: The column each table is partitioned and ordered by.
ID_COLUMN = {"jobs": "id", "events": "seq"}


def option(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    """An option by name, whatever case the caller wrote it in."""
    value = options.get(name.lower(), options.get(name))
    return default if value is None else str(value)


def required(options: Mapping[str, str], name: str, what: str) -> str:
    value = option(options, name)
    if value is None or not value.strip():
        raise ConfigurationError(f'the conveyor data source needs .option("{name}", ...): {what}')
    return value


def bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = option(options, name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ConfigurationError(f"option {name} must be true or false, got {value!r}")


def int_option(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    value = option(options, name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ConfigurationError(f"option {name} must be an integer, got {value!r}") from None
    if number < 1:
        raise ConfigurationError(f"option {name} must be at least 1, got {number}")
    return number


def table_option(options: Mapping[str, str]) -> str:
    # The default is the events table because schema() cannot tell a stream
    # (which reads only events) from a batch read: a batch read names its table.
    table = (option(options, "table", "events") or "events").strip().lower()
    if table not in TABLES:
        raise ConfigurationError(f'option table must be "jobs" or "events", got {table!r}')
    return table


def selected_columns(table: str, options: Mapping[str, str]) -> tuple[Column, ...]:
    """The table's columns, narrowed by the ``columns`` option.

    Spark's Python data source API has no column pruning of its own, so the
    reader reads the columns its schema names: fewer columns, less to read.
    """
    columns = TABLES[table]
    wanted = option(options, "columns")
    if wanted is None:
        return columns
    names = [name.strip() for name in wanted.split(",") if name.strip()]
    by_name = {c.name: c for c in columns}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise ConfigurationError(
            f"option columns names {', '.join(unknown)}, not columns of {table}: "
            f"choose from {', '.join(by_name)}"
        )
    return tuple(by_name[name] for name in dict.fromkeys(names))


def struct_of(columns: tuple[Column, ...]) -> StructType:
    return StructType([StructField(c.name, c.type, c.nullable) for c in columns])


def columns_for_schema(table: str, schema: StructType) -> tuple[Column, ...]:
    """The table columns a (possibly user-given) schema asks for, checked by name and type."""
    by_name = {c.name: c for c in TABLES[table]}
    chosen = []
    for field in schema.fields:
        column = by_name.get(field.name)
        if column is None:
            raise ConfigurationError(
                f"schema names {field.name!r}, not a column of {table}: "
                f"choose from {', '.join(by_name)}"
            )
        if column.type != field.dataType:
            raise ConfigurationError(
                f"column {field.name} of {table} is {column.type.simpleString()}, "
                f"not {field.dataType.simpleString()}"
            )
        chosen.append(column)
    return tuple(chosen)


class ConveyorDataSource(DataSource):
    """``format("conveyor")``: jobs and events of a conveyor store as DataFrames."""

    @classmethod
    def name(cls) -> str:
        return NAME

    @property
    def dsn(self) -> str:
        return required(self.options, "dsn", "the store to read or write")

    @property
    def backend(self) -> Backend:
        return backend_of(self.dsn)

    def schema(self) -> StructType:
        # Only reads call this; a write takes the DataFrame's own schema.
        table = table_option(self.options)
        return struct_of(selected_columns(table, self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        from conveyor.spark.reader import ConveyorReader

        table = table_option(self.options)
        return ConveyorReader(self.dsn, table, columns_for_schema(table, schema), self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from conveyor.spark.stream import EventStreamReader

        if table_option(self.options) != "events":
            raise ConfigurationError("a conveyor stream reads the events table only")
        return EventStreamReader(self.dsn, columns_for_schema("events", schema), self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from conveyor.spark.rows import WritePlan
        from conveyor.spark.writer import ConveyorWriter

        if overwrite:
            raise ConfigurationError(
                'writing to conveyor enqueues jobs: use mode("append"); overwrite would mean '
                "deleting the queue"
            )
        return ConveyorWriter(self.dsn, WritePlan.from_options(schema, self.options))
