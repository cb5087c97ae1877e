"""From a DSN string to an open Store, with errors that say what to write instead."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from conveyor.errors import ConfigurationError
from conveyor.store.protocols import Store

DEFAULT_DSN = "sqlite:///conveyor.db"
DSN_ENV = "CONVEYOR_DSN"
_HELP = (
    "use sqlite:///relative/path.db, sqlite:////absolute/path.db, "
    "postgresql://user:password@host:port/dbname, "
    "or redis://[user:password@]host:port/db (rediss:// for TLS, unix:///path/redis.sock)"
)


def default_dsn() -> str:
    return os.environ.get(DSN_ENV) or DEFAULT_DSN


def sqlite_path(dsn: str) -> Path:
    """The file a ``sqlite:///...`` DSN names (three slashes: relative, four: absolute)."""
    if not dsn.startswith("sqlite:///"):
        raise ConfigurationError(f"malformed SQLite DSN {dsn!r}: {_HELP}")
    path = unquote(dsn[len("sqlite:///") :].split("?", 1)[0])
    if not path or path.endswith("/"):
        raise ConfigurationError(f"SQLite DSN {dsn!r} names no file: {_HELP}")
    if path == ":memory:":
        raise ConfigurationError(
            "an in-memory SQLite database cannot be shared by workers and producers; "
            "use a file (a temporary one in tests)"
        )
    return Path(path)


def require_existing(dsn: str) -> None:
    """Refuse a SQLite DSN whose file does not exist, naming the path looked at.

    Commands that only read or operate must not create an empty database where
    a typo points (and then report "no jobs"). PostgreSQL databases are never
    created by conveyor, so there is nothing to check for them here.
    """
    if not dsn.startswith("sqlite:"):
        return
    path = sqlite_path(dsn)
    if not path.exists():
        raise ConfigurationError(
            f"no database at {path.absolute()}: the SQLite file does not exist. Check --dsn "
            f"(or ${DSN_ENV}); `conveyor migrate --dsn {dsn}` creates it"
        )


def check_postgres_dsn(dsn: str) -> None:
    """Reject a PostgreSQL URL that cannot be right before trying to connect."""
    parts = urlsplit(dsn)
    try:
        port = parts.port
    except ValueError:
        raise ConfigurationError(
            f"malformed PostgreSQL DSN: the port is not a number between 0 and 65535: {_HELP}"
        ) from None
    if port == 0:
        raise ConfigurationError(f"malformed PostgreSQL DSN: port 0 is not valid: {_HELP}")
    if not parts.path.strip("/") and "dbname=" not in parts.query:
        raise ConfigurationError(f"PostgreSQL DSN names no database: {_HELP}")


def open_store(dsn: str | None = None, **options: Any) -> Store:
    """Open the store a DSN names; ``options`` go to the backend (e.g. pool sizes)."""
    if dsn is None:
        dsn = default_dsn()
    if not isinstance(dsn, str):
        raise ConfigurationError(f"DSN must be a string, got {type(dsn).__name__}")
    if not dsn.strip():
        # Never a silent fallback: an empty value is a mistake (an unset variable
        # in a script), and ./conveyor.db would be a database nobody meant.
        raise ConfigurationError(f"the DSN is empty: {_HELP}")
    scheme = dsn.split(":", 1)[0].lower() if ":" in dsn else ""
    if scheme == "sqlite":
        from conveyor.store.sqlite import SQLiteStore

        return SQLiteStore(sqlite_path(dsn), **options)
    if scheme in ("postgresql", "postgres"):
        check_postgres_dsn(dsn)
        with _extra("PostgreSQL support needs psycopg 3", "postgres"):
            from conveyor.store.postgres import PostgresStore
        return PostgresStore(dsn, **options)
    if scheme in ("redis", "rediss", "unix"):
        with _extra("Redis support needs redis-py", "redis"):
            from conveyor.store.redis import RedisStore
        return RedisStore(dsn, **options)
    raise ConfigurationError(f"unsupported DSN {redacted(dsn)!r}: {_HELP}")


@contextmanager
def _extra(what: str, extra: str) -> Iterator[None]:
    """A store's import: a missing dependency is a ConfigurationError naming its extra."""
    try:
        yield
    except ImportError as exc:
        raise ConfigurationError(f"{what}: pip install 'conveyor[{extra}]' ({exc})") from None


def redacted(dsn: str) -> str:
    """A DSN fit for a message or a page: any password replaced by ***."""
    parts = urlsplit(dsn)
    if parts.password:
        dsn = dsn.replace(f":{parts.password}@", ":***@")
    # key=value DSNs (PostgreSQL's "host=db password=secret") and ?password= too.
    return re.sub(r"(password=)[^\s&]*", r"\1***", dsn)
