"""brain.runtime.reload's watching: a change of a source, or a reload request, reaches check()
promptly; a source whose folder does not exist yet is no crash; the thread stops on stop."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from brain.config import Settings
from brain.runtime import reload as reload_mod
from brain.runtime.reload import Reloader


class FakeRedis:
    def __init__(self) -> None:
        self.requested = False

    def getdel(self, key: str) -> Any:
        was, self.requested = self.requested, False
        return b"1" if was else None


@pytest.fixture
def watching(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(reload_mod, "WATCH_EVERY_S", 0.3)
    registry = tmp_path / "registry.yaml"
    registry.write_text("a")
    settings = Settings(registry=registry, mcp_config=tmp_path / "not-yet" / "mcp.json")
    redis = FakeRedis()
    reloader = Reloader(settings, SimpleNamespace(r=redis), SimpleNamespace(registry=None))  # type: ignore[arg-type]
    reloads = threading.Semaphore(0)
    monkeypatch.setattr(reloader, "reload", lambda: reloads.release() or [])
    stop = threading.Event()
    thread = reloader.run(stop)
    yield SimpleNamespace(tmp=tmp_path, registry=registry, redis=redis, reloads=reloads)
    started = time.monotonic()
    stop.set()
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - started < 2


def test_an_edit_a_rename_and_a_delete_and_recreate_are_each_seen(watching: Any) -> None:
    assert not watching.reloads.acquire(timeout=0.8)
    watching.registry.write_text("bb")
    assert watching.reloads.acquire(timeout=60)
    (watching.tmp / "new").write_text("ccc")
    os.replace(watching.tmp / "new", watching.registry)
    assert watching.reloads.acquire(timeout=60)
    watching.registry.unlink()
    assert watching.reloads.acquire(timeout=60)
    watching.registry.write_text("dddd")
    assert watching.reloads.acquire(timeout=60)


def test_a_folder_that_appears_later_is_watched_and_a_request_still_works(watching: Any) -> None:
    folder = watching.tmp / "not-yet"
    folder.mkdir()
    (folder / "mcp.json").write_text("{}")
    assert watching.reloads.acquire(timeout=60)
    watching.redis.requested = True
    assert watching.reloads.acquire(timeout=60)
