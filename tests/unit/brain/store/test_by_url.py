"""brain.store.by_url: which store a URL opens, and what is said of a URL that opens none
(never its password)."""

from __future__ import annotations

from pathlib import Path

import pytest

from brain.errors import StoreError
from brain.store.by_url import open_store
from brain.store.mongo import MongoStore
from brain.store.sqlite import SQLiteStore

ACCEPTED = (
    "accepted forms: sqlite:///relative/path.db, sqlite:////absolute/path.db, a file path ending in .db, "
    "mongodb://host[:port]/database or mongodb+srv://host/database"
)


@pytest.mark.parametrize(
    ("url", "where"),
    [
        ("sqlite:///rel/store.db", "rel/store.db"),  # three slashes: relative to the working directory
        ("sqlite:///{tmp}/abs.db", "{tmp}/abs.db"),  # four: absolute
        ("plain.db", "plain.db"),  # a bare file path ending in .db
        ("{tmp}/bare-abs.db", "{tmp}/bare-abs.db"),
    ],
)
def test_sqlite_urls_open_that_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, where: str
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store(url.format(tmp=tmp_path))
    try:
        assert isinstance(store, SQLiteStore)
        assert store.path.resolve() == (tmp_path / where.format(tmp=tmp_path)).resolve()
        assert store.path.resolve().exists()
        assert store.read_only is False
    finally:
        store.close()


def test_read_only_reaches_the_sqlite_store(tmp_path: Path) -> None:
    open_store(str(tmp_path / "s.db")).close()  # a writer makes the schema first
    store = open_store(f"sqlite:///{tmp_path}/s.db", read_only=True)
    try:
        assert isinstance(store, SQLiteStore) and store.read_only
    finally:
        store.close()


@pytest.mark.parametrize(
    ("url", "database"),
    [
        ("mongodb://127.0.0.1:1/runs", "runs"),
        ("mongodb://127.0.0.1:1", "vancetope"),  # no database in the URL: the default
        ("mongodb://127.0.0.1:1/", "vancetope"),
        ("mongodb://user:pw@127.0.0.1:1/prod?authSource=admin", "prod"),
    ],
)
def test_mongodb_urls_name_the_database(url: str, database: str) -> None:
    # read_only creates no index, so nothing is sent to the (absent) server.
    store = open_store(url, read_only=True)
    try:
        assert isinstance(store, MongoStore) and store.database == database
    finally:
        store.close()


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("sqlite:", "store URL 'sqlite:' names no database file"),
        ("sqlite:///", "store URL 'sqlite:///' names no database file"),
        ("sqlite:///:memory:", "store URL 'sqlite:///:memory:' names no database file"),
        ("sqlite:////:memory:", "store URL 'sqlite:////:memory:' names no database file"),
        ("sqlite://x.db", "store URL 'sqlite://x.db' names no database file"),
        ("postgres://u:hunter2@db/x", "unsupported store URL 'postgres://u:***@db/x'"),
        ("store.sqlite", "unsupported store URL 'store.sqlite'"),
        ("redis://127.0.0.1/0", "unsupported store URL 'redis://127.0.0.1/0'"),
    ],
)
def test_a_url_that_opens_no_store_says_so_and_what_would(url: str, said: str) -> None:
    with pytest.raises(StoreError) as caught:
        open_store(url)
    message = str(caught.value)
    assert message.startswith(said)
    assert message.endswith(ACCEPTED)
    assert "hunter2" not in message
