"""Record a server task's result where it ran (layer: brain/runtime; wiring for the server pool).

A server worker that finishes a task records the result itself and dispatches the
dependents that became ready, instead of sending the result to the brain and waiting
for it to come round: a hop of a chain is then one message, not two, and the brain is
no longer the one process every result must pass through.

Nothing is weaker for it. The worker runs the brain's own ``Intake.on_result``: the
same compare-and-set on (state, run id) decides, so a re-delivered or late result, or
two processes recording at once, still complete a task and dispatch a dependent once.
What the pool's Redis user may not do is left to the brain:

- a result with a dependent whose route depends on who is connected (a client tool, an
  offline strategy: ``routes_here`` is False) goes to the brain unrecorded, as a
  ``record_result`` job, and the brain records it and routes the dependent: the pool's Redis
  user reaches no presence, parked list or client key (``vt-pool`` in ``brain.hot.acl``), so it
  can neither read who is connected nor reroute anyone's client call (issue 20, M6). A client
  call sent from here anyway goes through the brain (``ViaBrainPublisher``, ``publish_call``),
  which checks the store says exactly that run before it publishes;
- the registry it routes with is the pools' own copy (``key_pool_registry``): the one
  everyone else routes with (``key_registry``) is out of its reach, so a pool that rewrites
  its copy changes only what pools decide — and a pool already runs every server call;
- if recording here fails (the store or Redis refused), the result goes to the brain as
  before (``record_result``), which records it or finds it already recorded.

A crash between the write and the dispatch leaves pending dependents that the brain's
idle-tree sweep advances (``Sweeps.advance_idle``), as after a brain crash.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from celery import Celery

from brain.config import Settings, load_settings
from brain.core.fanout import parent_of
from brain.core.routing import route_without_presence
from brain.core.snapshot import RegistrySnapshot
from brain.hot.gate import Gate, Lane
from brain.hot.parked import ParkedWork
from brain.hot.presence import PresenceBook
from brain.hot.state import HotState, as_bytes
from brain.runtime.dispatch import Publisher, args_summary
from brain.runtime.events import ClientEvents
from brain.runtime.gate_ends import GateEnds
from brain.runtime.intake import Intake
from brain.runtime.scheduler import Scheduler
from brain.store import open_store
from workers.call_relay import wait_answer
from workers.contracts import (
    BRAIN_QUEUE,
    PUBLISH_CALL_TASK,
    AskAnswer,
    ToolAsk,
    ToolCall,
    ToolLog,
    ToolProgress,
    ToolResult,
    key_answer,
    key_pool_registry,
)
from workers.tasks import RunStart

log = logging.getLogger("vancetope.worker")

# How old the registry snapshot a worker routes with may be: the brain publishes a new one
# when it starts; a worker notices within this.
REGISTRY_MAX_AGE_S = 5.0


class ViaBrainPublisher(Publisher):
    """Sends server calls itself; hands a client's call to the brain, which alone may write
    that client's queue."""

    def send(
        self, call: ToolCall, pool: str | None = None, lane: Lane | None = None, priority: int | None = None
    ) -> None:
        if call.client_id is None:
            super().send(call, pool, lane, priority)
            return
        # Ids only: the brain rebuilds the call from the store, so nothing in this message
        # can change what the client is asked to run.
        self.app.send_task(
            PUBLISH_CALL_TASK,
            args=[
                {
                    "tree_id": call.tree_id,
                    "task_id": call.task_id,
                    "run_id": call.run_id,
                    "client_id": call.client_id,
                }
            ],
            queue=BRAIN_QUEUE,
            producer=self._producer(self.app),
            argsrepr=f"{args_summary(call)} for client {call.client_id}",
            kwargsrepr="{}",
            declare=[],
        )


def routes_here(scheduler: Scheduler, result: ToolResult) -> bool:
    """Whether a server pool may record ``result`` and start what it makes ready: every
    dependent routes without presence (a registry tool the server runs, not as an offline
    strategy). A failed result skips its dependents, or makes ready those whose ``run_if``
    runs them after a failure: the same rule, since those need routes too."""
    tree_rec = scheduler.tree(result.tree_id)
    if tree_rec is None:
        return True  # on_result refuses it, as the brain would
    tools = scheduler.registry.tools
    return all(
        route_without_presence(scheduler.route_request(tree_rec, tree_rec.tree.task(dependent)), tools)
        is not None
        # an item of a for_each task: the last item's result ends that task and starts its dependents
        for dependent in tree_rec.tree.dependents.get(parent_of(result.task_id) or result.task_id, ())
    )


class InlineRecorder:
    """The server pool's result sink: ``on_result`` here, else ``fallback`` (to the brain);
    and where a run starts: ``Store.begin_run`` here, else ``begin_fallback`` (Redis)."""

    def __init__(
        self,
        app: Celery,
        fallback: Callable[[ToolResult], object],
        begin_fallback: RunStart | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.app = app
        # The pool's settings as it read them at start: it then drops the credential
        # variables from its environment (workers.proc_guard), so a child cannot re-read them.
        self.settings = settings
        self.fallback = fallback
        self.begin_fallback = begin_fallback
        self._scheduler: Scheduler | None = None
        self._intake: Intake | None = None
        self._pid = 0
        self._registry_read_at = 0.0
        self._ends = GateEnds(self._gate)

    def __call__(self, result: ToolResult) -> str | None:
        """What ``result`` made of its task (``done``, ``failed``, ``retrying``) when recorded
        here; None when it was handed to the brain, or not recorded."""
        try:
            scheduler = self.scheduler()
            if not routes_here(scheduler, result):
                self.fallback(result)
                return None
            state = self.intake().take(result)
            return state.value if state is not None else None
        except Exception as exc:  # noqa: BLE001 - whatever failed here, the brain can still record it
            log.warning(
                "could not record the result of task %s (run %s) in the worker (%s); sending it to the brain",
                result.task_id,
                result.run_id,
                exc,
            )
            self.fallback(result)
            return None

    def begin(self, call: ToolCall, worker: str, started_at: float) -> int | None:
        """Start a run against the store: it is the record, so a run it no longer has in flight
        (cancelled, expired, already recorded, superseded) never starts, and the delivery is
        counted in the same local write. That write replaced a Redis round trip per task, the
        largest piece of a chain hop and of a worker's time per task (bench/README.md)."""
        try:
            return self.scheduler().store.begin_run(
                call.tree_id, call.task_id, call.run_id, worker, started_at
            )
        except Exception as exc:  # the Redis path still knows cancellations
            if self.begin_fallback is None:
                raise
            log.warning(
                "could not start run %s of task %s against the store (%s); checking Redis instead",
                call.run_id,
                call.task_id,
                exc,
            )
            return self.begin_fallback(call, worker, started_at)

    def end(self, call: ToolCall) -> None:
        """A run this worker took has ended (recorded, handed on, refused or failed): a run the
        gate admitted gives back its slot or its place in the queue window, and the gate admits
        what that frees (``brain.runtime.gate_ends``)."""
        self._ends.ended(call)

    def _gate(self) -> Gate:
        return self.scheduler().publisher.gate or Gate(self.scheduler().hot.r)

    def progress(self, update: ToolProgress) -> None:
        """A running call's progress, into its record (best effort: a lost one is replaced
        by the next, and the result does not depend on it)."""
        try:
            self.intake().on_progress(update)
        except Exception as exc:  # noqa: BLE001
            log.warning("could not record progress of task %s: %s", update.task_id, exc)

    def log(self, update: ToolLog) -> None:
        """An MCP server's log message during a call, onto the tree's channel (best effort)."""
        try:
            self.intake().on_log(update)
        except Exception as exc:  # noqa: BLE001
            log.warning("could not pass on a log message of task %s: %s", update.task_id, exc)

    def ask(self, ask: ToolAsk, timeout: float) -> AskAnswer:
        """An MCP server's sampling/elicitation request during a gateway call: onto the tree's
        channel for the gateway following the call, then its answer from ``key_answer`` (the
        gateway writes it there), waited for at most ``timeout``."""
        try:
            intake = self.intake()
            if not intake.on_ask(ask):
                return AskAnswer(
                    ask_id=ask.ask_id,
                    ok=False,
                    error=f"task {ask.task_id!r} is not a gateway call running here; nobody to ask",
                )
            r = intake.scheduler.hot.r
            key = key_answer(ask.ask_id)

            def pop(block: float) -> bytes | None:
                found = r.blpop([key], timeout=block)
                return as_bytes(found[1]) if found else None

            try:
                return wait_answer(pop, ask.ask_id, timeout)
            finally:
                r.delete(key)  # an answer that came too late (the gateway writes none after)
        except Exception as exc:  # noqa: BLE001 - the server gets an error, the call goes on
            log.warning("could not pass on a %s request of task %s: %s", ask.kind, ask.task_id, exc)
            return AskAnswer(
                ask_id=ask.ask_id, ok=False, error=f"the server pool could not pass it on: {exc}"
            )

    def intake(self) -> Intake:
        """This process's intake, over ``scheduler()``."""
        scheduler = self.scheduler()
        if self._intake is None or self._intake.scheduler is not scheduler:
            self._intake = Intake(scheduler)
        return self._intake

    def scheduler(self) -> Scheduler:
        """This process's scheduler: built on first use after a fork (prefork children must not
        share the parent's store or Redis connections), registry re-read every few seconds."""
        if self._scheduler is None or self._pid != os.getpid():
            self._scheduler = self._build()
            self._pid = os.getpid()
            self._registry_read_at = time.monotonic()
        elif time.monotonic() - self._registry_read_at > REGISTRY_MAX_AGE_S:
            self._scheduler.registry = self._registry(self._scheduler.hot)
            self._registry_read_at = time.monotonic()
        return self._scheduler

    def _build(self) -> Scheduler:
        settings = self.settings or load_settings()
        hot = HotState.from_url(self.app.conf.broker_url)
        store = open_store(settings.store)
        scheduler = Scheduler(
            store,
            hot,
            ViaBrainPublisher(self.app, task_events=settings.task_events, gate=Gate(hot.r)),
            self._registry(hot),
            settings,
            presence=PresenceBook(hot.r, store),
            parked=ParkedWork(hot.r),
            events=ClientEvents(self.app, task_events=settings.task_events),
        )
        return scheduler

    @staticmethod
    def _registry(hot: HotState) -> RegistrySnapshot:
        snapshot: dict[str, Any] | None = hot.get_registry(key_pool_registry())
        if snapshot is None:
            raise RuntimeError("no brain has published its registry yet")
        return RegistrySnapshot.model_validate(snapshot)
