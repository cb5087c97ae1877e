"""Job stores: one protocol (base.py), one implementation per database."""

from conveyor.store.base import Store
from conveyor.store.dsn import open_store

__all__ = ["Store", "open_store"]
