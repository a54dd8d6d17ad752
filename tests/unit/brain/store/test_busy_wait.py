"""A writer that finds the SQLite file locked waits in short steps, then writes (brain/store/sqlite.py).

SQLite's own busy handler sleeps 1, 2, 5, 10, 15 ... ms between tries; a write of the store
holds the lock for a tenth of that, so a pool process waited far longer than the lock was held.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from brain.errors import StoreError
from brain.store import sqlite as sqlite_store
from brain.store.sqlite import SQLiteStore


def _hold_lock(path: Path, held: threading.Event, release: threading.Event) -> None:
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    held.set()
    release.wait(30)
    other.execute("COMMIT")
    other.close()


def test_a_write_waits_for_the_lock_in_growing_short_pauses_then_goes_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    held, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_lock, args=(tmp_path / "s.db", held, release))
    holder.start()
    assert held.wait(60)
    pauses: list[float] = []
    real_sleep = sqlite_store.time.sleep

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 8:
            release.set()  # the other writer commits after the eighth pause
            holder.join(10)
        real_sleep(seconds)

    monkeypatch.setattr(sqlite_store.time, "sleep", sleep)
    store.record_fire("nightly", 1.0)  # a write: needs the lock the thread holds
    assert pauses[:8] == [0.00005, 0.0001, 0.0002, 0.0004, 0.0008, 0.0016, 0.002, 0.002]
    assert len(pauses) == 8, "it wrote as soon as the lock was free"
    assert store.last_fires() == {"nightly": 1.0}


def test_a_write_that_never_gets_the_lock_fails_after_the_busy_timeout_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_S", 0.2)
    held, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_lock, args=(tmp_path / "s.db", held, release))
    holder.start()
    try:
        assert held.wait(60)
        with pytest.raises(StoreError, match="database is locked"):
            store.record_fire("nightly", 1.0)
    finally:
        release.set()
        holder.join(10)
    store.record_fire("nightly", 2.0)  # and works once the lock is free
    assert store.last_fires() == {"nightly": 2.0}


def test_an_error_that_is_not_a_busy_lock_is_not_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    pauses: list[float] = []
    monkeypatch.setattr(sqlite_store.time, "sleep", pauses.append)
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        store._conn().execute("SELECT * FROM no_such_table")
    assert pauses == []
