"""The SQLite backend."""

from conveyor.store.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore"]
