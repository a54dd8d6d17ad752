"""The durable store (layer: brain/store). One job: keep the record of every tree and task.

``open_store(url)`` picks a backend: a SQLite file (embedded default) or MongoDB.
Callers depend on the ``Store`` protocol only.
"""

from brain.store.base import ANY, Ended, Store
from brain.store.by_url import open_store
from brain.store.mongo import MongoStore
from brain.store.sqlite import SQLiteStore

__all__ = ["ANY", "Ended", "MongoStore", "SQLiteStore", "Store", "open_store"]
