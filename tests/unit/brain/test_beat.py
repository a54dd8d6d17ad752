"""brain.beat: the beat scheduler's entries come from the settings, and what it catches up at
start follows each schedule's catch_up and the last fires in the store."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from brain.beat import ScheduleBeat, fire_token, first_last_run
from brain.core.schedules import Schedule
from brain.store import open_store
from workers.app import make_app

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class RecordingBeat(ScheduleBeat):
    sent: list[tuple[str, float, bool]]

    def send_fire(self, name: str, fired_at: float, *, catch_up: bool = False, producer: Any = None) -> None:
        self.sent.append((name, fired_at, catch_up))


def test_beat_catches_up_per_schedule_from_the_last_fires_in_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tmp_path / "t.yaml"
    tree.write_text("id: t\ntasks:\n  - {id: a, tool: echo, args: {value: 1}}\n")
    specs = [
        {"name": name, "tree": str(tree), "every_s": 600, "catch_up": catch_up}
        for name, catch_up in (("all", "all"), ("latest", "latest"), ("none", "none"), ("new", "all"))
    ] + [{"name": "off", "tree": str(tree), "every_s": 600, "catch_up": "all", "enabled": False}]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VANCETOPE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("VANCETOPE_SCHEDULES", json.dumps(specs))
    store = open_store(f"sqlite:///{tmp_path / 'data' / 'vancetope.db'}")
    hour_ago = time.time() - 3600 - 1
    for name in ("all", "latest", "none", "off"):
        store.record_fire(name, hour_ago)
    RecordingBeat.sent = []
    beat = RecordingBeat(app=make_app("redis://127.0.0.1:1/0"))
    try:
        assert sorted(beat.schedule) == ["all", "latest", "new", "none"]  # a disabled one has no entry
        sent = RecordingBeat.sent
        assert [n for n, _, _ in sent].count("all") == 6 and all(c for _, _, c in sent)
        assert [n for n, _, _ in sent].count("latest") == 1
        assert {n for n, _, _ in sent} == {"all", "latest"}
        fires = store.last_fires()
        assert fires["all"] > hour_ago + 3000 and fires["none"] == hour_ago
    finally:
        beat.close()
        store.close()


def test_a_restart_keeps_the_cadence_when_nothing_was_missed() -> None:
    spec = Schedule(name="s", tree=Path("/t.yaml"), every_s=600)
    recent = NOW - timedelta(seconds=100)
    assert first_last_run(spec, recent, NOW) == recent
    assert first_last_run(spec, NOW - timedelta(seconds=900), NOW) == NOW
    assert first_last_run(spec, None, NOW) == NOW


def test_a_fires_token_is_the_same_for_the_same_schedule_and_time() -> None:
    assert fire_token("s", 1.5) == fire_token("s", 1.5) != fire_token("s", 2.5)
    assert fire_token("s", 1.5) != fire_token("t", 1.5)
