"""The PostgreSQL backend (install with ``conveyor[postgres]``)."""

from conveyor.store.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
