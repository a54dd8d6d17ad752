"""Which store a URL names, opened (layer: brain/store).

Apart from ``base`` so that the backends import the protocol and the protocol imports no
backend; each backend is imported only when its URL is opened (pymongo is not loaded for SQLite).
"""

from __future__ import annotations

from typing import Final
from urllib.parse import urlsplit

from brain.errors import StoreError
from brain.store.base import DEFAULT_MONGO_DATABASE, Store
from workers.urls import redact_url

_ACCEPTED_URLS: Final = (
    "sqlite:///relative/path.db, sqlite:////absolute/path.db, a file path ending in .db, "
    "mongodb://host[:port]/database or mongodb+srv://host/database"
)


def open_store(url: str, *, read_only: bool = False) -> Store:
    """Open the store named by ``url`` (see ``_ACCEPTED_URLS``; ``Settings.store`` builds one).

    ``read_only``: SQLite connections that cannot write (the MCP gateway's); on MongoDB no index
    is created, and the store is as read-only as the URL's user (compose.yaml gives the gateway
    a user with the ``read`` role).

    ``sqlite:///`` follows the SQLAlchemy convention: three slashes then a relative
    path, four slashes for an absolute one (``sqlite:///`` + ``/abs/path.db``).
    """
    if url.startswith("sqlite:"):
        rest = url.removeprefix("sqlite:")
        path = rest.removeprefix("///") if rest.startswith("///") else ""
        if not path or path in (":memory:", "/:memory:"):
            raise StoreError(
                f"store URL {redact_url(url)!r} names no database file "
                f"(an in-memory database cannot be shared by processes); accepted forms: {_ACCEPTED_URLS}"
            )
        from brain.store.sqlite import SQLiteStore

        return SQLiteStore(path, read_only=read_only)
    if url.startswith(("mongodb://", "mongodb+srv://")):
        database = urlsplit(url).path.lstrip("/") or DEFAULT_MONGO_DATABASE
        from brain.store.mongo import MongoStore

        return MongoStore(url, database=database, read_only=read_only)
    if "://" not in url and url.endswith(".db"):
        from brain.store.sqlite import SQLiteStore

        return SQLiteStore(url, read_only=read_only)
    raise StoreError(f"unsupported store URL {redact_url(url)!r}; accepted forms: {_ACCEPTED_URLS}")
