"""Schedules as the CLI shows them (layer: brain/cli; presentation; pure).

``vancetope schedules [--json]``: each schedule with its last and next fire and its last
run (which summary ``vancetope status TREE_ID`` shows of a run is
``brain.core.summary.shown_summary``, shared with the web view). Values in, JSON-ready dicts and rich
renderables out; the JSON shape is a contract like ``brain.core.report``'s (add, never rename).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.table import Table
from rich.text import Text

from brain.core.models import TreeRecord
from brain.core.schedules import Schedule


def next_fire(spec: Schedule, last_fired_at: float | None, now: float) -> float | None:
    """When beat fires ``spec`` next, as far as the store tells: after its last fire, or — never
    fired — after now. A time in the past means beat is not running (or is catching up)."""
    if not spec.enabled:
        return None
    after = last_fired_at if last_fired_at is not None else now
    return spec.next_fire(datetime.fromtimestamp(after, UTC)).timestamp()


def schedule_row(
    spec: Schedule, last_fired_at: float | None, last_run: TreeRecord | None, now: float
) -> dict[str, Any]:
    return {
        "name": spec.name,
        "enabled": spec.enabled,
        "tree": str(spec.tree),
        "cron": spec.cron,
        "timezone": spec.timezone if spec.cron else None,
        "every_s": spec.every_s,
        "user": spec.user,
        "overlap": spec.overlap.value,
        "catch_up": spec.catch_up.value,
        "deadline_s": spec.deadline_s,
        "last_fired_at": last_fired_at,
        "next_fire_at": next_fire(spec, last_fired_at, now),
        "last_run": None
        if last_run is None
        else {
            "tree_id": last_run.tree_id,
            "status": last_run.status.value,
            "submitted_at": last_run.submitted_at,
            "finished_at": last_run.finished_at,
        },
    }


def schedules_report(
    schedules: Sequence[Schedule],
    last_fires: Mapping[str, float],
    last_runs: Mapping[str, TreeRecord | None],
    now: float,
) -> list[dict[str, Any]]:
    return [schedule_row(s, last_fires.get(s.name), last_runs.get(s.name), now) for s in schedules]


def _when(at: float | None) -> str:
    return "" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def schedules_table(rows: Sequence[Mapping[str, Any]], now: float) -> Table:
    table = Table(title="schedules", title_justify="left")
    for col in ("schedule", "when", "enabled", "overlap", "catch up", "last fire", "next fire", "last run"):
        table.add_column(col, overflow="fold")
    for row in rows:
        when = f"{row['cron']} ({row['timezone']})" if row["cron"] else f"every {row['every_s']:g}s"
        nxt = row["next_fire_at"]
        shown_next = Text(_when(nxt))
        if nxt is not None and nxt < now - 1:
            shown_next = Text(f"{_when(nxt)} (overdue: is beat running?)", style="yellow")
        run = row["last_run"]
        table.add_row(
            Text(row["name"]),
            Text(when),
            "yes" if row["enabled"] else Text("no", style="dim"),
            row["overlap"],
            row["catch_up"],
            _when(row["last_fired_at"]),
            shown_next,
            Text(f"{run['tree_id']} ({run['status']})" if run else ""),
        )
    return table
