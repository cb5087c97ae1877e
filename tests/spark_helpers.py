"""Helpers of the Spark tests: the jobs a store holds, what a write left behind, a writer."""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg
from pyspark.sql import DataFrame, SparkSession

from conveyor.store.dsn import sqlite_path
from conveyor.store.protocols import Store
from outcomes import listed


def all_jobs(store: Store) -> list[Any]:
    return listed(store, limit=100_000)


def leftovers(dsn: str) -> tuple[list[str], int]:
    """Staging tables still present, and writes still open.

    A database no Spark write reached has no ``spark_writes``: no write is open.
    """
    if dsn.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(dsn))
        try:
            tables = conn.execute(
                "SELECT name FROM sqlite_master WHERE name LIKE 'spark_stage_%'"
            ).fetchall()
            made = conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'spark_writes'"
            ).fetchone()[0]
            open_writes = (
                conn.execute("SELECT count(*) FROM spark_writes").fetchone()[0] if made else 0
            )
        finally:
            conn.close()
    else:
        with psycopg.connect(dsn) as pg:
            tables = pg.execute(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE 'spark_stage_%'"
            ).fetchall()
            made = pg.execute("SELECT to_regclass('spark_writes') IS NOT NULL").fetchone()
            open_writes = (
                pg.execute("SELECT count(*) FROM spark_writes").fetchone()[0]  # type: ignore[index]
                if made and made[0]
                else 0
            )
    return [t[0] for t in tables], open_writes


def spark_tables(dsn: str) -> list[str]:
    """Tables named spark_... in the database, sorted."""
    if dsn.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(dsn))
        try:
            rows = conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'spark%' "
                "ORDER BY name"
            ).fetchall()
        finally:
            conn.close()
    else:
        with psycopg.connect(dsn) as pg:
            rows = pg.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                "AND tablename LIKE 'spark%' ORDER BY tablename"
            ).fetchall()
    return [row[0] for row in rows]


def writer(frame: DataFrame, dsn: str, **options: str) -> Any:
    out = frame.write.format("conveyor").option("dsn", dsn).mode("append")
    for name, value in options.items():
        out = out.option(name, value)
    return out


def items(spark: SparkSession, count: int, partitions: int = 2) -> DataFrame:
    return spark.range(0, count, numPartitions=partitions).selectExpr(
        "id", "concat('img-', id) AS path", "cast(id % 5 AS int) AS size"
    )


def count_rows(dsn: str, sql: str) -> int:
    """The single number a query returns, on either database."""
    if dsn.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(dsn))
        try:
            value: int = conn.execute(sql).fetchone()[0]
        finally:
            conn.close()
        return value
    with psycopg.connect(dsn) as pg:
        row = pg.execute(sql).fetchone()
        return int(row[0]) if row else 0
