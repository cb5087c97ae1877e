"""Connections and named statements for the Spark data source, per backend.

Spark pickles readers and writers to its Python workers, and connections do
not pickle: everything here is opened inside a task and closed with it.
"""

from __future__ import annotations

import sqlite3
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

from conveyor.errors import ConfigurationError
from conveyor.store.dsn import check_postgres_dsn, sqlite_path
from conveyor.store.sql import parse_queries

if TYPE_CHECKING:
    import psycopg

Backend = Literal["sqlite", "postgres"]

# The store's own settings: WAL so readers never block the writer.
_SQLITE_PRAGMAS = ("PRAGMA journal_mode = WAL", "PRAGMA synchronous = NORMAL")
BUSY_TIMEOUT_SECONDS = 60.0


def backend_of(dsn: str) -> Backend:
    scheme = dsn.split(":", 1)[0].lower() if ":" in dsn else ""
    if scheme == "sqlite":
        sqlite_path(dsn)  # raises on a malformed DSN, with the accepted forms
        return "sqlite"
    if scheme in ("postgresql", "postgres"):
        check_postgres_dsn(dsn)
        return "postgres"
    raise ConfigurationError(
        "the conveyor data source needs option dsn = sqlite:///path.db or "
        "postgresql://user@host:port/dbname"
    )


@cache
def queries(backend: Backend) -> dict[str, str]:
    text = resources.files("conveyor.spark").joinpath(f"sql/{backend}.sql").read_text("utf-8")
    return parse_queries(text, where=f"conveyor/spark/sql/{backend}.sql")


def sqlite_connect(dsn: str) -> sqlite3.Connection:
    conn = sqlite3.connect(
        sqlite_path(dsn),
        timeout=BUSY_TIMEOUT_SECONDS,
        isolation_level=None,  # transactions are explicit: BEGIN IMMEDIATE for writes
        check_same_thread=False,
    )
    for pragma in _SQLITE_PRAGMAS:
        conn.execute(pragma)
    return conn


def postgres_connect(dsn: str) -> psycopg.Connection[Any]:
    import psycopg

    return psycopg.connect(dsn, autocommit=True)


def quote_ident(name: str) -> str:
    """Quote an identifier this package made (checked, never user text)."""
    if not name.replace("_", "").isalnum() or not name.isascii():
        raise ValueError(f"not a plain identifier: {name!r}")
    return f'"{name}"'
