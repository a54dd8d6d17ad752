"""Schedules of night batches (layer: brain/core; pure).

One job: say what a ``[[schedules]]`` table of ``vancetope.toml`` means, and decide, as
functions of values, when a schedule fires, what a fire does while the previous run is
still going (``overlap``) and which runs missed during downtime are made up (``catch_up``).
Time comes in as arguments; nothing here reads the clock, Redis or the store.

The times themselves come from Celery's own ``celery.schedules``: a ``cron`` expression is
a ``crontab`` in the schedule's ``timezone``, ``every_s`` a ``schedule`` — what Celery beat
users already know. ``brain.beat`` runs them; ``brain.runtime.schedule_runs`` acts on a fire.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta, tzinfo
from enum import StrEnum
from pathlib import Path
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery.schedules import crontab, schedule
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from brain.core.models import Priority, check_id
from brain.errors import ConfigError

# A night batch that missed a month of minutes must not flood the pool when beat comes back.
MAX_CATCH_UP_RUNS: Final = 100
# How many missed cron times are looked at (a minute-cron over a week) before giving up.
MAX_MISSED_SCAN: Final = 10_000
SUMMARY_FORMATS: Final = {".md": "markdown", ".markdown": "markdown", ".json": "json"}
SUMMARY_FIELDS: Final = ("schedule", "date", "tree_id", "kind")
# The last hex digits of a scheduled run's tree id (see ``run_tree_id``).
_TOKEN_CHARS: Final = 6


class Overlap(StrEnum):
    """What a fire does while the schedule's previous run is unfinished."""

    SKIP = "skip"  # drop this fire
    QUEUE = "queue"  # start it once the previous run has ended
    ALLOW = "allow"  # start it now: both run


class CatchUp(StrEnum):
    """What beat does, when it starts again, about fire times it missed while down."""

    NONE = "none"  # nothing: the next fire is the next scheduled time
    LATEST = "latest"  # one run for the latest missed time
    ALL = "all"  # one run per missed time (at most MAX_CATCH_UP_RUNS, the latest ones)


class FireAction(StrEnum):
    START = "start"
    SKIP = "skip"
    QUEUE = "queue"


class Schedule(BaseModel):
    """One ``[[schedules]]`` table. ``tree`` and ``summary_file`` are absolute once loaded
    (``parse_schedules`` resolves them against the TOML file's folder)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    tree: Path
    cron: str | None = None
    # An IANA time zone name the cron expression is read in (Celery's `timezone` setting).
    timezone: str = "UTC"
    every_s: float | None = Field(default=None, gt=0)
    # Whose clients the run's client tools may use (None: the `user` setting, read at fire time).
    user: str | None = None
    overlap: Overlap = Overlap.SKIP
    catch_up: CatchUp = CatchUp.NONE
    enabled: bool = True
    # Seconds after a run starts at which a summary is made even if it has not ended.
    deadline_s: float | None = Field(default=None, gt=0)
    # Where each summary of this schedule's runs goes: a file template (format by extension)
    # with {schedule} {date} {tree_id} {kind}; and/or a URL the summary is POSTed to as JSON.
    summary_file: str | None = None
    summary_webhook: str | None = None
    # high | normal | low or 0-9 for its runs' tasks when their tree names none (fair share).
    priority: Priority = None

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        return check_id(v, 64)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, v: str) -> str:
        zone_of(v)
        return v

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, v: str | None) -> str | None:
        if v is not None:
            parse_cron(v)
        return v

    @field_validator("summary_file")
    @classmethod
    def _known_format(cls, v: str | None) -> str | None:
        if v is not None:
            summary_format(v)
            try:
                v.format_map({name: "x" for name in SUMMARY_FIELDS})
            except (KeyError, ValueError, IndexError, AttributeError) as exc:
                raise ValueError(
                    f"{v!r} is not a valid template ({exc}); use the fields {', '.join(SUMMARY_FIELDS)}"
                ) from exc
        return v

    @field_validator("summary_webhook")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"{v!r} is not an http:// or https:// URL")
        return v

    @model_validator(mode="after")
    def _one_timing(self) -> Schedule:
        if (self.cron is None) == (self.every_s is None):
            raise ValueError('set exactly one of cron (e.g. "0 2 * * *") or every_s')
        return self

    def celery_schedule(self, nowfun: Callable[[], datetime] | None = None) -> crontab | schedule:
        """The schedule as Celery beat runs it (``nowfun``: the clock, for tests)."""
        if self.cron is not None:
            cron = parse_cron(self.cron, nowfun)
            # crontab reads its zone from the app (one per app); each schedule has its own here.
            cron.tz = zone_of(self.timezone)
            return cron
        assert self.every_s is not None
        return schedule(timedelta(seconds=self.every_s), nowfun=nowfun)

    def next_fire(self, after: datetime) -> datetime:
        """The first fire time strictly after ``after`` (aware, in UTC)."""
        after = after.astimezone(UTC)
        if self.every_s is not None:
            return after + timedelta(seconds=self.every_s)
        cron = self.celery_schedule(nowfun=lambda: after)
        assert isinstance(cron, crontab)
        start, delta, _ = cron.remaining_delta(after)
        return (start + delta).astimezone(UTC)


def zone_of(name: str) -> tzinfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(
            f"unknown time zone {name!r}; use an IANA name such as 'Europe/Paris' or 'UTC'"
        ) from exc


def parse_cron(expression: str, nowfun: Callable[[], datetime] | None = None) -> crontab:
    """A 5-field cron expression (minute hour day-of-month month day-of-week) as Celery's crontab."""
    fields = expression.split()
    if len(fields) != 5:
        raise ValueError(
            f"{expression!r} has {len(fields)} field(s); write 5: minute hour day-of-month month "
            'day-of-week, e.g. "0 2 * * *" for 02:00 every day'
        )
    minute, hour, day_of_month, month_of_year, day_of_week = fields
    try:
        return crontab(minute, hour, day_of_week, day_of_month, month_of_year, nowfun=nowfun)
    except Exception as exc:  # ValueError, or celery's ParseException (an Exception only)
        raise ValueError(f"{expression!r} is not valid: {exc}") from exc


def summary_format(path: str) -> str:
    """``markdown`` or ``json``, by the file's extension."""
    fmt = SUMMARY_FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise ValueError(f"{path!r}: the extension picks the format; use {', '.join(SUMMARY_FORMATS)}")
    return fmt


def parse_schedules(tables: object, base: Path) -> tuple[Schedule, ...]:
    """The ``[[schedules]]`` tables of a TOML file in folder ``base``, checked: each error names
    the schedule and what to write instead (ConfigError). Paths become absolute; a tree file
    that does not exist is an error here, not at 2 a.m."""
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError("vancetope.toml: `schedules` must be an array of tables: write [[schedules]]")
    result: list[Schedule] = []
    for index, table in enumerate(tables):
        where = f"schedule {table.get('name')!r}" if table.get("name") else f"[[schedules]] #{index + 1}"
        values: dict[str, Any] = dict(table)
        for key in ("tree", "summary_file"):
            if isinstance(values.get(key), str):
                values[key] = str(base / values[key])
        try:
            spec = Schedule.model_validate(values)
        except ValidationError as exc:
            raise ConfigError(f"vancetope.toml: {where}: {validation_lines(exc)}") from exc
        if not spec.tree.is_file():
            raise ConfigError(
                f"vancetope.toml: {where}: tree file {spec.tree} does not exist "
                "(paths are relative to vancetope.toml)"
            )
        result.append(spec)
    names = [s.name for s in result]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"vancetope.toml: schedule name(s) {', '.join(map(repr, twice))} used twice")
    return tuple(result)


def validation_lines(exc: ValidationError) -> str:
    return "; ".join(
        (f"{'.'.join(map(str, e['loc']))}: " if e["loc"] else "") + e["msg"].removeprefix("Value error, ")
        for e in exc.errors()
    )


# --- decisions ------------------------------------------------------------------------


def decide_overlap(overlap: Overlap, previous_running: bool) -> FireAction:
    """What a fire does, given whether the schedule's previous run is still unfinished."""
    if not previous_running or overlap is Overlap.ALLOW:
        return FireAction.START
    return FireAction.QUEUE if overlap is Overlap.QUEUE else FireAction.SKIP


def missed_fires(
    next_fire: Callable[[datetime], datetime], last: datetime, now: datetime
) -> tuple[list[datetime], int]:
    """Fire times in ``(last, now]`` — the latest MAX_CATCH_UP_RUNS of them — and how many there
    were in all (scanning at most MAX_MISSED_SCAN)."""
    latest: deque[datetime] = deque(maxlen=MAX_CATCH_UP_RUNS)
    count = 0
    at = next_fire(last)
    while at <= now and count < MAX_MISSED_SCAN:
        latest.append(at)
        count += 1
        at = next_fire(at)
    return list(latest), count


def missed_every(every_s: float, last: datetime, now: datetime) -> tuple[list[datetime], int]:
    """``missed_fires`` for an interval, in O(MAX_CATCH_UP_RUNS) however long beat was down."""
    count = max(0, math.floor((now - last).total_seconds() / every_s))
    first = max(1, count - MAX_CATCH_UP_RUNS + 1)
    return [last + timedelta(seconds=k * every_s) for k in range(first, count + 1)], count


def decide_catch_up(catch_up: CatchUp, missed: list[datetime]) -> list[datetime]:
    """The missed fire times to run now, oldest first."""
    if catch_up is CatchUp.NONE or not missed:
        return []
    if catch_up is CatchUp.LATEST:
        return missed[-1:]
    return missed[-MAX_CATCH_UP_RUNS:]


def fires_to_catch_up(spec: Schedule, last: datetime | None, now: datetime) -> list[datetime]:
    """What beat sends for ``spec`` when it starts: nothing without a last fire on record."""
    if last is None or not spec.enabled:
        return []
    if spec.every_s is not None:
        missed, _ = missed_every(spec.every_s, last, now)
    else:
        missed, _ = missed_fires(spec.next_fire, last, now)
    return decide_catch_up(spec.catch_up, missed)


def run_tree_id(tree_id: str, schedule_name: str, fired_at: float, token: str) -> str:
    """The tree id of a scheduled run, in the shape of every run's (``Scheduler.submit``):
    ``<tree id>-<UTC fire time>-<6 hex>``. ``token`` comes from the fire (a digest of
    schedule and fire time), so a re-delivered fire names the same run and the store refuses it."""
    stamp = datetime.fromtimestamp(fired_at, UTC).strftime("%Y%m%d-%H%M%S")
    return f"{tree_id}-{stamp}-{token[:_TOKEN_CHARS]}"


def by_name(schedules: Iterable[Schedule]) -> Mapping[str, Schedule]:
    return {s.name: s for s in schedules}
