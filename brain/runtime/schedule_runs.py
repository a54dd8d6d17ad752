"""Act on schedule fires and summarise scheduled runs (layer: brain/runtime; glue around pure decisions).

Beat (``brain.beat``) only says "schedule X fired"; the brain decides here, at submit time,
what that fire does (``brain.core.schedules.decide_overlap``) by looking at the store for an
unfinished run of X. The look and the submit happen under a Redis lock per schedule
(``SET NX`` with an expiry, released by compare-and-delete), so two brains, two beats or a
fire delivered twice never start two runs of an ``overlap = "skip"`` schedule: whoever
holds the lock second finds the first one's run already in the store. A re-delivered fire
also names the same tree id (``run_tree_id``), which the store refuses a second time.

The brain's reconciler calls ``sweep`` every ``reconcile_interval_s``: it starts queued
fires whose schedule has become free, and makes the summaries (``brain.core.summary``) of
scheduled runs that ended or passed their schedule's ``deadline_s``. Summaries are made by
this sweep rather than where a tree finishes because a tree finishes in many processes (the
brain, a server worker recording a result, the CLI's cancel): the sweep sees every one,
survives a crash, and keeps file writes and webhooks off the result path. The store's
``put_summary`` is the compare-and-set that lets one brain only send a summary on.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from pydantic import ValidationError

from brain.core.models import SessionKind, TreeRecord, TreeStatus
from brain.core.schedules import FireAction, Overlap, Schedule, by_name, decide_overlap, run_tree_id
from brain.core.submission import SubmitRequest
from brain.core.summary import RunSummary, SummaryKind, summarise
from brain.core.treefile import load_tree
from brain.errors import BrainError
from brain.runtime.scheduler import Scheduler
from brain.runtime.summary_sinks import deliver
from workers.contracts import ScheduleFire, key_schedule_lock, key_schedule_queue
from workers.scripts import lua

log = logging.getLogger("vancetope.brain")

LOCK_TTL_MS = 60_000  # far above a submit; bounds how long a crashed brain holds a schedule
LOCK_WAIT_S = 10.0
# Runs of each schedule the sweep looks at for a missing summary, newest first.
SUMMARY_LOOKBACK = 10
MAX_QUEUED_FIRES = 100


class ScheduleRuns:
    def __init__(
        self, scheduler: Scheduler, schedules: Sequence[Schedule], clock: Callable[[], float] = time.time
    ) -> None:
        self.s = scheduler
        self.specs = by_name(schedules)
        self.clock = clock
        # Per schedule: runs whose final summary is stored, among the latest SUMMARY_LOOKBACK
        # (not looked at again; pruned to that window at each sweep).
        self._summarised: dict[str, set[str]] = {}

    # --- fires ---------------------------------------------------------------------------
    def fire(self, fire: ScheduleFire) -> TreeRecord | None:
        """Start, queue or skip one fire, as its schedule's ``overlap`` says. The run started, if any."""
        spec = self.specs.get(fire.schedule)
        if spec is None:
            log.warning(
                "schedule %r fired but this brain's vancetope.toml has no such schedule; "
                "restart beat and the brain after changing [[schedules]]",
                fire.schedule,
            )
            return None
        if not spec.enabled:
            log.info("schedule %r fired but is disabled: nothing started", spec.name)
            return None
        with self._lock(spec.name) as held:
            if not held:
                log.warning(
                    "schedule %r: another brain held its lock for %gs; this fire is dropped",
                    spec.name,
                    LOCK_WAIT_S,
                )
                return None
            action = decide_overlap(spec.overlap, self.running(spec.name) is not None)
            if action is FireAction.START:
                return self._start(spec, fire)
            if action is FireAction.QUEUE:
                self._enqueue(spec, fire)
            else:
                log.info("schedule %r: previous run still going (overlap = skip): fire skipped", spec.name)
        return None

    def running(self, name: str) -> TreeRecord | None:
        runs = self.s.store.schedule_runs(name, running_only=True, limit=1)
        return runs[0] if runs else None

    def _enqueue(self, spec: Schedule, fire: ScheduleFire) -> None:
        key = key_schedule_queue(spec.name)
        if self.s.hot.r.llen(key) >= MAX_QUEUED_FIRES:
            log.warning(
                "schedule %r: %d fires already queued; this one is dropped", spec.name, MAX_QUEUED_FIRES
            )
            return
        self.s.hot.r.rpush(key, fire.model_dump_json())
        log.info("schedule %r: previous run still going (overlap = queue): fire queued", spec.name)

    def _start(self, spec: Schedule, fire: ScheduleFire) -> TreeRecord | None:
        try:
            tree = load_tree(spec.tree, max_bytes=self.s.settings.max_tree_bytes)
            if spec.priority is not None and tree.priority is None:
                # `priority = "low"` on the schedule: its runs yield to everyone else's work.
                tree = tree.model_copy(update={"priority": spec.priority})
            tree_id = run_tree_id(tree.id, spec.name, fire.fired_at, fire.token)
            if self.s.store.get_tree(tree_id) is not None:
                log.info("schedule %r: run %s already started (fire delivered twice)", spec.name, tree_id)
                return None
            accepted = self.s.accept(
                SubmitRequest(
                    tree=tree,
                    source=str(spec.tree),
                    tree_id=tree_id,
                    session=SessionKind.AUTONOMOUS,
                    user=spec.user or self.s.settings.user,
                    schedule=spec.name,
                )
            )
        except BrainError as exc:
            log.error("schedule %r: not started: %s", spec.name, exc)
            return None
        for warning in accepted.warnings:
            log.warning("schedule %r: %s", spec.name, warning)
        log.info("schedule %r: started run %s", spec.name, tree_id)
        return accepted.record

    @contextmanager
    def _lock(self, name: str) -> Iterator[bool]:
        r, key, token = self.s.hot.r, key_schedule_lock(name), secrets.token_hex(8)
        deadline = time.monotonic() + LOCK_WAIT_S
        held = bool(r.set(key, token, nx=True, px=LOCK_TTL_MS))
        while not held and time.monotonic() < deadline:
            time.sleep(0.05)
            held = bool(r.set(key, token, nx=True, px=LOCK_TTL_MS))
        try:
            yield held
        finally:
            if held:
                r.eval(lua("brain.hot", "release_lock"), 1, key, token)

    # --- the sweep -------------------------------------------------------------------------
    def sweep(self) -> None:
        """Start queued fires whose schedule is free; summarise ended and overdue runs."""
        for spec in self.specs.values():
            if spec.overlap is Overlap.QUEUE:
                self._start_queued(spec)
            self._summarise_runs(spec)

    def _start_queued(self, spec: Schedule) -> None:
        key = key_schedule_queue(spec.name)
        if not self.s.hot.r.llen(key) or self.running(spec.name) is not None:
            return  # the cheap check first; it is made again under the lock
        with self._lock(spec.name) as held:
            if not held or self.running(spec.name) is not None:
                return
            raw = self.s.hot.r.lpop(key)
            if not isinstance(raw, bytes | str):
                return
            try:
                fire = ScheduleFire.model_validate_json(raw)
            except ValidationError as exc:
                log.error("schedule %r: dropped a malformed queued fire: %s", spec.name, exc)
                return
            self._start(spec, fire)

    def _summarise_runs(self, spec: Schedule) -> None:
        now = self.clock()
        runs = self.s.store.schedule_runs(spec.name, limit=SUMMARY_LOOKBACK)
        done = self._summarised[spec.name] = self._summarised.get(spec.name, set()) & {
            r.tree_id for r in runs
        }
        for run in runs:
            if run.tree_id in done:
                continue
            kinds = {s.kind for s in self.s.store.get_summaries(run.tree_id)}
            if run.status is not TreeStatus.RUNNING:
                if SummaryKind.FINAL not in kinds:
                    self._summarise(spec, run, SummaryKind.FINAL, now)
                done.add(run.tree_id)
            elif (
                spec.deadline_s is not None
                and now - run.submitted_at >= spec.deadline_s
                and SummaryKind.DEADLINE not in kinds
            ):
                self._summarise(spec, run, SummaryKind.DEADLINE, now)

    def _summarise(self, spec: Schedule, run: TreeRecord, kind: SummaryKind, now: float) -> RunSummary | None:
        summary = summarise(run, self.s.store.get_tasks(run.tree_id), kind, now)
        if not self.s.store.put_summary(summary):
            return None  # another brain made it (and sends it on)
        c = summary.counts
        log.info(
            "schedule %r: %s summary of run %s: %d done, %d failed, %d skipped, %d waiting for a client",
            spec.name,
            kind.value,
            run.tree_id,
            c.done,
            c.failed + c.expired,
            c.skipped,
            c.waiting,
        )
        deliver(spec, summary)
        return summary
