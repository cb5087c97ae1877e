"""Job stores: the protocols (protocols.py), their records (records.py), a package per database."""

from conveyor.store.dsn import open_store
from conveyor.store.protocols import Store

__all__ = ["Store", "open_store"]
