"""The ``conveyor`` Python data source: batch and streaming reads and writes, SQL tables.

Every option is checked against the documented set of its use before anything
is read or written (see ``conveyor.spark.options``).
"""

from __future__ import annotations

import json
from dataclasses import replace

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import (
    StructField,
    StructType,
)

from conveyor.errors import ConfigurationError
from conveyor.spark.options import (
    METADATA_KEY,
    Options,
    ddl_with_options,
    definition_options,
    from_table_schema,
    is_table_definition,
)
from conveyor.spark.rows import WritePlan
from conveyor.spark.storage import backend_of
from conveyor.spark.tables import TABLES, Column, struct_of

NAME = "conveyor"


def table_option(options: Options) -> str:
    # The default is the events table because schema() cannot tell a stream
    # (which reads only events) from a batch read: a batch read names its table.
    return options.choice("table", TABLES, "events")


def selected_columns(table: str, options: Options) -> tuple[Column, ...]:
    """The table's columns, narrowed by the ``columns`` option.

    Spark's Python data source API has no column pruning of its own, so the
    reader reads the columns its schema names: fewer columns, less to read.
    """
    columns = TABLES[table]
    names = options.names("columns")
    if not names:
        return columns
    by_name = {c.name: c for c in columns}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise ConfigurationError(
            f"option columns names {', '.join(unknown)}, not columns of {table}: "
            f"choose from {', '.join(by_name)}"
        )
    return tuple(by_name[name] for name in dict.fromkeys(names))


def columns_for_schema(table: str, schema: StructType) -> tuple[Column, ...]:
    """The table columns a (possibly user-given) schema asks for, checked by name and type.

    Nullability follows the schema: a user's schema says nullable by default,
    and the batches must say what the schema says.
    """
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
        if column.nullable and not field.nullable:
            raise ConfigurationError(
                f"column {field.name} of {table} can be null: declare it nullable in the schema"
            )
        chosen.append(replace(column, nullable=field.nullable))
    return tuple(chosen)


_NO_DSN = (
    "the store (sqlite:///path.db or postgresql://user@host/db). Spark SQL hands a Python data "
    "source a table's OPTIONS only when CREATE TABLE t USING conveyor OPTIONS (...) has no "
    "column list and no AS SELECT: conveyor then keeps them in the table's schema. Create a "
    "table that enqueues that way, naming its columns in OPTIONS (schema '...'), and INSERT "
    "INTO it. A table made by df.write.saveAsTable(...) or df.writeTo(...).create() keeps "
    "none of the write's options, so insertInto, writeTo(...).append() and INSERT INTO it "
    "end here: write it again with saveAsTable and the options, or create it as above"
)


def _dsn(options: Options) -> str:
    dsn = options.required("dsn", _NO_DSN)
    backend_of(dsn)  # a malformed DSN fails here, saying what to write
    return dsn


def _enqueues(options: Options) -> bool:
    return "task" in options or "taskColumn" in options


class ConveyorDataSource(DataSource):
    """``format("conveyor")``: jobs and events of a conveyor store as DataFrames."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType | str:
        # Reads call this (a write takes the DataFrame's own schema), and so does
        # CREATE TABLE ... USING conveyor, the one time Spark shows a SQL table's
        # options to a Python data source: they are kept in the schema.
        if is_table_definition(self.options):
            own = definition_options(self.options)
            options = Options(own, "table")
            _dsn(options)
            if _enqueues(options):
                ddl = options.required(
                    "schema",
                    "the columns of a table that enqueues, e.g. 'image_id BIGINT, size INT'",
                )
                return ddl_with_options(ddl, own)
            table = table_option(options)
            return struct_of(selected_columns(table, options), {METADATA_KEY: json.dumps(own)})
        options = Options(self.options, ("read", "stream read"))
        _dsn(options)
        return struct_of(selected_columns(table_option(options), options))

    def reader(self, schema: StructType) -> DataSourceReader:
        from conveyor.spark.reader import ConveyorReader

        found = from_table_schema(self.options, schema)
        options = Options(found.options, "table" if found.from_table else "read")
        if _enqueues(options):
            raise ConfigurationError(
                "this conveyor table enqueues jobs (it has option task or taskColumn): INSERT "
                "INTO it. To read jobs or events, define a table with OPTIONS (dsn '...', "
                "table 'jobs')"
            )
        dsn = _dsn(options)
        table = table_option(options)
        return ConveyorReader(dsn, table, columns_for_schema(table, schema), options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from conveyor.spark.stream import EventStreamReader

        options = Options(self.options, "stream read")
        dsn = _dsn(options)
        if table_option(options) != "events":
            raise ConfigurationError("a conveyor stream reads the events table only")
        return EventStreamReader(dsn, columns_for_schema("events", schema), options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from conveyor.spark.writer import ConveyorWriter

        found = from_table_schema(self.options, schema)
        options = Options(found.options, "table" if found.from_table else "write")
        if overwrite:
            raise ConfigurationError(
                'writing to conveyor enqueues jobs: use mode("append") (INSERT INTO, not '
                "INSERT OVERWRITE); overwrite would mean deleting the queue"
            )
        if found.from_table and not _enqueues(options):
            raise ConfigurationError(
                "this conveyor table reads jobs or events; to enqueue from SQL define a table "
                "with OPTIONS (dsn '...', task '...', schema '<its columns>')"
            )
        dsn = _dsn(options)
        if found.columns is None:
            return ConveyorWriter(dsn, _plan(schema, options, dsn, stream=False))
        # A SQL table's columns, named in disguise (see conveyor.spark.options): by the
        # names its option schema gave them, in the plan and in every batch.
        named = StructType(
            [replace_name(f, name) for f, name in zip(schema.fields, found.columns, strict=True)]
        )
        plan = replace(_plan(named, options, dsn, stream=False), renamed=found.columns)
        return ConveyorWriter(dsn, plan)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from conveyor.spark.writer import ConveyorStreamWriter

        options = Options(self.options, "stream write")
        if overwrite:
            raise ConfigurationError(
                'a conveyor streaming sink enqueues jobs: use outputMode("append")'
            )
        dsn = _dsn(options)
        return ConveyorStreamWriter(dsn, _plan(schema, options, dsn, stream=True))


def replace_name(field: StructField, name: str) -> StructField:
    return StructField(name, field.dataType, field.nullable, field.metadata)


def _plan(schema: StructType, options: Options, dsn: str, *, stream: bool) -> WritePlan:
    from conveyor.spark.declarations import load_declarations

    app = options.text("app")
    tasks = load_declarations(app, dsn) if app else {}
    return WritePlan.from_options(schema, options, tasks, stream=stream)
