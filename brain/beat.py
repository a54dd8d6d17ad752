"""Celery beat for the ``[[schedules]]`` of vancetope.toml (layer: brain, Celery glue).

``celery -A brain.beat beat -S brain.beat:ScheduleBeat`` (what ``vancetope beat`` and the
stack run). ``ScheduleBeat`` is a ``celery.beat.Scheduler`` whose entries come from the
settings, not from ``beat_schedule``: each enabled schedule is a Celery ``crontab`` (in its
own time zone) or ``schedule`` (``every_s``). A due entry sends a ``vancetope.run_schedule``
job to the brain's queue; the brain decides what the fire does (``brain.runtime.schedule_runs``).

Last fire times live in the store (``record_fire``), not in a shelve file beside beat, so
``catch_up`` after downtime survives a new container and is the same for SQLite and
MongoDB. At start, beat sends the fires ``catch_up`` asks for (``fires_to_catch_up``) and
then goes on from the schedule's next time. Beat reads the schedules once: restart it (and
the brain) after changing them; ``vancetope up`` does both.
"""

from __future__ import annotations

import hashlib
import logging
import time
from datetime import UTC, datetime
from typing import Any

from celery.beat import ScheduleEntry, Scheduler

from brain.config import Settings, load_settings
from brain.core.schedules import Schedule, fires_to_catch_up
from brain.errors import BrainError
from brain.store import Store, open_store
from workers.app import app
from workers.contracts import BRAIN_QUEUE, RUN_SCHEDULE_TASK, ScheduleFire

log = logging.getLogger("vancetope.beat")
EXIT_CONFIG = 78  # as the brain worker: restarting will not help until the config changes

__all__ = ["ScheduleBeat", "app"]


def fire_token(schedule: str, fired_at: float) -> str:
    """The same for the same schedule and time: a catch-up sent twice (beat restarted again
    before the brain took it) names the same run, which the store refuses a second time."""
    return hashlib.sha256(f"{schedule}@{fired_at:.6f}".encode()).hexdigest()[:16]


def first_last_run(spec: Schedule, last: datetime | None, now: datetime) -> datetime:
    """Where beat's entry starts counting from: the recorded last fire when nothing was missed
    since (a restart keeps the cadence), else now (what was missed is ``catch_up``'s)."""
    if last is not None and spec.next_fire(last) > now:
        return last
    return now


class ScheduleBeat(Scheduler):
    """A beat scheduler over the settings' schedules, its last fire times in the store."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            self.settings: Settings = load_settings()
            self.store: Store = open_store(self.settings.store)
        except BrainError as exc:
            log.critical("beat cannot start: %s", exc)
            raise SystemExit(EXIT_CONFIG) from exc
        super().__init__(*args, **kwargs)

    def setup_schedule(self) -> None:
        now = datetime.now(UTC)
        last_fires = self.store.last_fires()
        entries: dict[str, ScheduleEntry] = {}
        for spec in self.settings.schedules:
            if not spec.enabled:
                log.info("schedule %r is disabled", spec.name)
                continue
            at = last_fires.get(spec.name)
            last = datetime.fromtimestamp(at, UTC) if at is not None else None
            missed = fires_to_catch_up(spec, last, now)
            for fired in missed:
                self.send_fire(spec.name, fired.timestamp(), catch_up=True)
            if missed:
                self.store.record_fire(spec.name, now.timestamp())
                log.info(
                    "schedule %r: caught up %d missed run(s) (catch_up = %s)",
                    spec.name,
                    len(missed),
                    spec.catch_up,
                )
            entries[spec.name] = self.Entry(
                name=spec.name,
                task=RUN_SCHEDULE_TASK,
                schedule=spec.celery_schedule(),
                last_run_at=first_last_run(spec, last, now),
                app=self.app,
            )
            log.info("schedule %r: %s", spec.name, spec.cron or f"every {spec.every_s:g}s")
        self.data = entries

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        """Send the fire, then record it: a fire lost between the two is made up by catch_up."""
        fired_at = time.time()
        try:
            self.send_fire(entry.name, fired_at, producer=producer)
            self.store.record_fire(entry.name, fired_at)
        except Exception:  # beat outlives one failed send; the next tick tries the next fire
            log.exception("schedule %r: could not send its fire", entry.name)

    def send_fire(self, name: str, fired_at: float, *, catch_up: bool = False, producer: Any = None) -> None:
        fire = ScheduleFire(
            schedule=name, fired_at=fired_at, token=fire_token(name, fired_at), catch_up=catch_up
        )
        self.app.send_task(
            RUN_SCHEDULE_TASK,
            args=[fire.model_dump(mode="json")],
            queue=BRAIN_QUEUE,
            producer=producer,
            argsrepr=f"schedule {name}",
            kwargsrepr="{}",
        )
        log.info("schedule %r fired%s", name, " (catch-up)" if catch_up else "")

    def close(self) -> None:
        super().close()
        self.store.close()
