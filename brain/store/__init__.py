"""The durable store (layer: brain/store). One job: keep the record of every tree and task.

``open_store(url)`` picks a backend: a SQLite file (embedded default) or MongoDB.
Callers depend on the ``Store`` protocol only.
"""

from typing import TYPE_CHECKING, Any

from brain.store.base import ANY, Ended, Store
from brain.store.by_url import open_store
from brain.store.sqlite import SQLiteStore

if TYPE_CHECKING:
    from brain.store.mongo import MongoStore

__all__ = ["ANY", "Ended", "MongoStore", "SQLiteStore", "Store", "open_store"]


def __getattr__(name: str) -> Any:
    # MongoStore on first use only: importing it loads pymongo, half a second of every
    # process's start, and the embedded default (SQLite) never needs it.
    if name == "MongoStore":
        from brain.store.mongo import MongoStore

        return MongoStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
