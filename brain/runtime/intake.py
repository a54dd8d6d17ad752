"""Results, progress and approvals coming back (layer: brain/runtime).

What a worker or a client agent reports about a run it was sent: accepted only from where the
run was sent (``refuse_result``/``refuse_claim``, pure), recorded once (a compare-and-set on the
run id through ``Scheduler.move``), then the tree advanced. The scheduler decides what to start;
this module only takes in what comes back, so every source (the brain queue, a pool that
records its own results, a client's outbox) enters through the same three doors.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from typing import Any

from brain.core.fairshare import pause_asked_by
from brain.core.models import Progress, TaskRecord, TaskState
from brain.core.transitions import IN_FLIGHT
from brain.hot.gate import Gate
from brain.runtime.scheduler import DISPATCH_CHUNK, TREE_CACHE, Scheduler
from workers.contracts import (
    BRAIN_QUEUE,
    AskEvent,
    ErrorInfo,
    LogEvent,
    ProgressEvent,
    ToolAsk,
    ToolAwaiting,
    ToolLog,
    ToolProgress,
    ToolResult,
    ToolStarted,
    result_size,
)

log = logging.getLogger("vancetope.brain")

# A live view redraws at most every 0.2 s (brain.cli.watch.REDRAW_EVERY_S) and a tree's end
# always wakes it: waking it more often from one process only costs PUBLISH round trips.
_WAKE_EVERY_S = 0.2


def refuse_result(rec: TaskRecord | None, result: ToolResult, from_client: str | None) -> str | None:
    """Why a result may not complete ``rec``, or None when it may. Pure.

    ``from_client`` is where the result came from: None for the brain queue (only server
    workers may reach it), else the client whose outbox carried it. Either way the source
    must be the one the task record says its run was sent to (``TaskRecord.client_id``);
    what the result claims about itself only has to agree.
    """
    if rec is None:
        return "no such task"
    if rec.client_id != from_client:
        if from_client is None:
            return f"it was routed to client {rec.client_id!r}, not to the server"
        routed = "the server" if rec.client_id is None else f"client {rec.client_id!r}"
        return f"it was routed to {routed}"
    return refuse_claim(result.client_id, from_client)


def ran_after_its_end(rec: TaskRecord, result: ToolResult) -> bool:
    """Whether ``result`` is of the run ``rec``'s task was ended (cancelled, expired) under while
    it ran, so not recorded: its tool ran all the same. Pure."""
    return rec.run_id == result.run_id and rec.state in (TaskState.SKIPPED, TaskState.EXPIRED)


def refuse_claim(claimed: str | None, from_client: str | None) -> str | None:
    """Why a message claiming to come from client ``claimed`` (a result, a progress report)
    does not fit the way it came, or None. Pure; needs no record, so it is checked before
    anything is read or written."""
    if claimed == from_client:
        return None
    if from_client is None:
        return f"it claims client {claimed!r} but came through the brain queue"
    return f"it claims client {claimed!r}"


def checked_payload(
    result: ToolResult, cap: int
) -> tuple[bool, Any, dict[str, Any] | None, ErrorInfo | None]:
    """(ok, value, whole MCP result, error) to record for ``result``. Pure. The size is checked
    again here, measured as the worker and the agent measure it (``result_size``): a client
    agent's cap is its own promise, not ours."""
    if not result.ok:
        return False, None, None, result.error
    size = result_size(result.value, result.mcp)  # parsed from JSON: it is JSON
    if size > cap:
        error = ErrorInfo(
            type="ResultTooLarge",
            message=f"result of tool {result.tool!r} is {size} bytes, over the cap of "
            f"{cap} bytes (raise VANCETOPE_MAX_RESULT_BYTES, or return less)",
            data={"task": result.task_id, "tool": result.tool, "size": size},
        )
        return False, None, None, error
    if result.mcp is None:
        return True, result.value, None, None
    try:
        # Imported here: it loads the MCP SDK (a second of CPU), which a CLI command that only
        # reads the store never needs; the brain loads it at its first MCP result.
        from workers.mcp_clients import value_of

        return True, value_of(result.mcp), result.mcp, None
    except ValueError as exc:
        error = ErrorInfo(
            type="MalformedResult",
            message=f"result of tool {result.tool!r} claims to be an MCP result but is not: {exc}",
            data={"task": result.task_id, "tool": result.tool},
        )
        return False, None, None, error


class Intake:
    """The brain's doors for what comes back: ``on_result``, ``on_progress``, ``on_started``,
    ``on_awaiting``; and for what a gateway call's MCP server says while it runs, passed on
    as tree events only: ``on_log``, ``on_ask``.
    ``from_client`` is the client whose outbox carried the message, None for the brain queue."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._woken: dict[str, float] = {}

    # --- results ------------------------------------------------------------------------
    def on_result(self, result: ToolResult, from_client: str | None = None) -> bool:
        """Record a result once. A stale run id (re-sent, re-delivered, late) changes nothing;
        a client's result counts only for a task routed to that very client."""
        return self.take(result, from_client) is not None

    def take(self, result: ToolResult, from_client: str | None = None) -> TaskState | None:
        """``on_result``, saying what the task became: done, failed, or retrying (a failed
        attempt its retry policy covers); None when the result was not recorded."""
        claim = refuse_claim(result.client_id, from_client)
        if claim is not None:
            self._refused(result, from_client, claim)
            return None
        ok, value, whole, error = checked_payload(result, self.scheduler.settings.max_result_bytes)
        tree_rec = self.scheduler.tree(result.tree_id)
        fan_out = len(tree_rec.tree.dependents.get(result.task_id, ())) if tree_rec else 0
        # The record and the dispatch of what it made ready: one store transaction, unless
        # so many become ready that their chunks should each go out as soon as written.
        with self.scheduler.batch() if fan_out <= DISPATCH_CHUNK else nullcontext():
            recorded = self._record(result, from_client, ok, value, whole, error)
        if recorded is None:
            return None
        state, finished = recorded
        if not finished:
            self._wake_watchers(result.tree_id)  # a finished tree's watchers were woken by advance
        return state

    def _record(
        self,
        result: ToolResult,
        from_client: str | None,
        ok: bool,
        value: Any,
        whole: dict[str, Any] | None,
        error: ErrorInfo | None,
    ) -> tuple[TaskState, bool] | None:
        """Write the result and advance its tree: None if it was not recorded, else the state
        it recorded and whether the tree finished."""
        if not ok and self._retry(result, from_client, error):
            self._pause_after_write(result, from_client, error)
            return TaskState.RETRYING, False
        # The source must be where the record says this run was sent: part of the
        # compare-and-set, so the common case needs no read before the write.
        recorded = self.scheduler.move(
            result.tree_id,
            result.task_id,
            TaskState.DONE if ok else TaskState.FAILED,
            IN_FLIGHT,
            expect_run_id=result.run_id,
            expect_client_id=from_client,
            result=value,
            mcp=whole,
            error=error,
            redactions=result.redactions,
            reason="" if ok else (error.message if error else "failed"),
            worker=result.worker,
            started_at=result.started_at,
            finished_at=result.finished_at,
            updated_at=self.scheduler.clock(),
        )
        if recorded is None:
            rec = self.scheduler.store.get_task(result.tree_id, result.task_id)
            refusal = refuse_result(rec, result, from_client)
            if refusal is not None:
                self._refused(result, from_client, refusal)
                return None
            log.info(
                "ignored result of run %s (task %s): not the task's current run, or already recorded",
                result.run_id,
                result.task_id,
            )
            if rec is not None and ran_after_its_end(rec, result) and self.scheduler.events is not None:
                # A pool worker tells Flower how such a run ended itself; for an agent the brain does.
                events = self.scheduler.events
                self.scheduler.after_write(
                    lambda: events.task_done(result, unless_ended=True, task_ended=True)
                )
            return None
        if not ok:
            self._pause_after_write(result, from_client, error)
        with self.scheduler.recording(recorded):  # upstream() takes it, not a read back
            finished = self.scheduler.advance(result.tree_id, {result.task_id: recorded.state}) is not None
        if self.scheduler.events is not None:
            events = self.scheduler.events  # Flower's copy after what the tree's watchers wait for
            self.scheduler.after_write(lambda: events.task_done(result))
        return recorded.state, finished

    def _pause_after_write(
        self, result: ToolResult, from_client: str | None, error: ErrorInfo | None
    ) -> None:
        """Pause the budget a failed server run's 429 names, once its failure is written. Only
        for a result the store accepted (this task's current run, from where it was sent): a
        stale or forged one must not stop a server for everyone. After the write, as the
        messages are: a batch that rolls back pauses nothing."""
        if from_client is None and result.client_id is None:
            self.scheduler.after_write(lambda: self._pause(result, error))

    def _pause(self, result: ToolResult, error: ErrorInfo | None) -> None:
        """A server run that its remote answered 429 with Retry-After: pause that server's
        budget at the gate until then, for every pool process (``brain.hot.gate.Gate.pause``).
        A client's own calls pause nothing: the server pools' budgets are not theirs to stop."""
        asked = pause_asked_by(result.tool, error)
        if asked is None:
            return
        key, seconds = asked
        scope, _, name = key.partition(":")
        why = f"paused by HTTP 429 from {scope} {name} (Retry-After {seconds:g}s)"
        try:
            gate = self.scheduler.publisher.gate or Gate(self.scheduler.hot.r)
            gate.pause(key, seconds, why)
        except Exception as exc:  # noqa: BLE001 - the retry's own wait still honours Retry-After
            log.warning("could not pause %s after its 429 (%s)", key, exc)
            return
        log.info("%s: %s", key, why)

    def _retry(self, result: ToolResult, from_client: str | None, error: ErrorInfo | None) -> bool:
        """Record a failed attempt as ``retrying`` when its retry policy covers it, with the
        time of its next attempt; True if it was. Failures are few: reading the record first
        costs nothing that matters, and the write is still a compare-and-set on this run."""
        scheduler = self.scheduler
        rec = scheduler.store.get_task(result.tree_id, result.task_id)
        tree_rec = scheduler.tree(result.tree_id)
        if (
            rec is None
            or tree_rec is None
            or rec.run_id != result.run_id
            or rec.state not in IN_FLIGHT
            or rec.client_id != from_client
        ):
            return False  # not this task's current run: the normal path refuses or ignores it
        at = scheduler.retry_later(
            tree_rec,
            rec,
            error,
            IN_FLIGHT,
            started_at=result.started_at,
            finished_at=result.finished_at,
            worker=result.worker,
        )
        if at is None:
            return False
        if scheduler.events is not None:
            events = scheduler.events
            scheduler.after_write(lambda: events.task_retried(result, at))
        return True

    def on_progress(self, update: ToolProgress, from_client: str | None = None) -> bool:
        """Keep a running call's latest progress in its record: only for the current run, only
        while it is in flight, only from where it was sent (a compare-and-set like a result's);
        and publish it, with its values, on the tree's channel (a ``ProgressEvent``): the
        gateway relays each one to the MCP client, the record holds only the latest. The
        worker's ``Throttle`` bounds how many come (a burst, then 5 a second)."""
        if refuse_claim(update.client_id, from_client) is not None:
            return False
        written = self.scheduler.store.transition(
            update.tree_id,
            update.task_id,
            from_states=IN_FLIGHT,
            expect_run_id=update.run_id,
            expect_client_id=from_client,
            progress=Progress(
                progress=update.progress, total=update.total, message=update.message, at=update.at
            ),
            updated_at=self.scheduler.clock(),
        )
        if written is not None:
            self.scheduler.hot.publish_event(update.tree_id, ProgressEvent(progress=update).model_dump_json())
        return written is not None

    def _current(self, tree_id: str, task_id: str, run_id: str, from_client: str | None) -> TaskRecord | None:
        """The task's record when ``run_id`` is its current run, in flight, sent to
        ``from_client`` (None: the server pool); else None. What a log or an ask must match:
        a workstation may speak only of a call running on it now."""
        rec = self.scheduler.store.get_task(tree_id, task_id)
        if rec is None or rec.state not in IN_FLIGHT or rec.run_id != run_id or rec.client_id != from_client:
            return None
        return rec

    def on_log(self, update: ToolLog, from_client: str | None = None) -> bool:
        """Publish an MCP server's log message of a running call on the tree's channel (a
        ``LogEvent``; nothing is stored): only for the current run, in flight, from where it
        was sent. The worker bounds how many and how big."""
        if refuse_claim(update.client_id, from_client) is not None:
            return False
        if self._current(update.tree_id, update.task_id, update.run_id, from_client) is None:
            return False
        self.scheduler.hot.publish_event(update.tree_id, LogEvent(log=update).model_dump_json())
        return True

    def on_ask(self, ask: ToolAsk, from_client: str | None = None) -> bool:
        """Publish an MCP server's sampling/elicitation request of a running gateway call on the
        tree's channel (an ``AskEvent``), for the gateway following it to put to its MCP client:
        only for the current run of a one-task gateway call, in flight, from where it was sent.
        The answer goes to where the run is (``client_id``: the one it was sent to, whatever
        the ask says), so a workstation can ask only the MCP session that made a call running
        on it, and read only its own answers."""
        claim = refuse_claim(ask.client_id, from_client)
        rec = self._current(ask.tree_id, ask.task_id, ask.run_id, from_client) if claim is None else None
        tree_rec = self.scheduler.tree(ask.tree_id) if rec is not None else None
        if rec is None or tree_rec is None or not tree_rec.gateway_call:
            log.warning(
                "dropped a request (%s) for task %s of tree %s (run %s) from %s: not a gateway call running there",
                ask.kind,
                ask.task_id,
                ask.tree_id,
                ask.run_id,
                f"client {from_client!r}" if from_client else "the server pool",
            )
            return False
        event = AskEvent(ask=ask.model_copy(update={"client_id": from_client}))
        self.scheduler.hot.publish_event(ask.tree_id, event.model_dump_json())
        return True

    def on_started(self, started: ToolStarted, from_client: str | None = None) -> bool:
        """A client agent began a call it was sent: ``queued_client`` -> ``running``, for the
        current run only, only from the client it was sent to (a compare-and-set on both, as a
        progress report's). An agent that never says so (an older one) leaves its call queued
        until its result, which is accepted from either state. A start that arrives after the
        call was held for approval, or after its result, changes nothing."""
        if from_client is None or refuse_claim(started.client_id, from_client) is not None:
            return False
        written = self.scheduler.move(
            started.tree_id,
            started.task_id,
            TaskState.RUNNING,
            # only a call still queued there: held for approval, it runs again when approved
            # (on_awaiting); a late or repeated start never moves it back
            frozenset({TaskState.QUEUED_CLIENT}),
            expect_run_id=started.run_id,
            expect_client_id=from_client,
            started_at=started.started_at,
            updated_at=self.scheduler.clock(),
        )
        if written is not None:
            self._wake_watchers(started.tree_id)
        return written is not None

    def on_awaiting(self, update: ToolAwaiting, from_client: str | None = None) -> bool:
        """A client's call held for its user's approval (``awaiting_approval``), or approved and
        running again (``running``: the agent began it before it asked): for the current run
        only, only from where it was sent. A denial or a timeout arrives as a failed result."""
        if from_client is None or refuse_claim(update.client_id, from_client) is not None:
            return False
        if update.waiting:
            state, from_states = (
                TaskState.AWAITING_APPROVAL,
                frozenset({TaskState.QUEUED_CLIENT, TaskState.RUNNING}),
            )
            reason = (
                f"awaiting approval on client {from_client} (vancetope-agent approve {update.approval_id})"
            )
        else:
            state, from_states = TaskState.RUNNING, frozenset({TaskState.AWAITING_APPROVAL})
            reason = ""
        written = self.scheduler.move(
            update.tree_id,
            update.task_id,
            state,
            from_states,
            expect_run_id=update.run_id,
            expect_client_id=from_client,
            reason=reason,
            updated_at=self.scheduler.clock(),
        )
        if written is not None:
            self._wake_watchers(update.tree_id)
        return written is not None

    def _wake_watchers(self, tree_id: str) -> None:
        """Wake the tree's live views at most every ``_WAKE_EVERY_S`` from this process (a
        PUBLISH per result was a round trip per task; a view re-reads the whole tree on each
        wake-up anyway). A tree's end always wakes them (``advance``)."""
        now = time.monotonic()
        if now - self._woken.get(tree_id, 0.0) >= _WAKE_EVERY_S:
            self._woken[tree_id] = now
            if len(self._woken) > TREE_CACHE:
                self._woken.pop(next(iter(self._woken)))
            self.scheduler.hot.notify(tree_id)

    def _refused(self, result: ToolResult, from_client: str | None, refusal: str) -> bool:
        log.warning(
            "refused a result for task %s of tree %s (run %s) from %s: %s",
            result.task_id,
            result.tree_id,
            result.run_id,
            f"client {from_client!r}" if from_client else f"the {BRAIN_QUEUE!r} queue",
            refusal,
        )
        return False
