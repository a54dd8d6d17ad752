"""Advance task trees (layer: brain, glue around pure decisions).

Each task is its own Celery job (DESIGN.md decision 3). The store is the record:
every state change is a compare-and-set on (state, run_id), so a redelivered job,
a late result or two brains advancing the same tree never complete a task or
dispatch a dependent twice. Decisions come from ``transitions.plan`` and
``routing.decide_route``; this module only applies them.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from brain.config import Settings
from brain.dispatch import Publisher
from brain.hotstate import HotState
from brain.models import (
    SessionKind,
    TaskRecord,
    TaskSpec,
    TaskState,
    TaskTree,
    TreeRecord,
    TreeStatus,
)
from brain.registry import RegistrySnapshot
from brain.routing import Presence, Route, RouteKind, RouteRequest, decide_route
from brain.store import Store
from brain.transitions import plan, tree_status
from brain.validation import UnresolvedReference, resolve_args
from workers.contracts import BRAIN_QUEUE, SERVER_QUEUE, ErrorInfo, ToolCall, ToolResult

log = logging.getLogger("vancetope.brain")

IN_FLIGHT = frozenset({TaskState.QUEUED_SERVER, TaskState.QUEUED_CLIENT, TaskState.RUNNING})


def new_run_id(tree_id: str, task_id: str, attempt: int) -> str:
    return f"{tree_id}.{task_id}.{attempt}.{uuid.uuid4().hex[:12]}"


class Scheduler:
    def __init__(
        self,
        store: Store,
        hot: HotState,
        publisher: Publisher,
        registry: RegistrySnapshot,
        settings: Settings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.hot = hot
        self.publisher = publisher
        self.registry = registry
        self.settings = settings
        self.clock = clock

    # --- submit ------------------------------------------------------------------
    def submit(
        self,
        tree: TaskTree,
        *,
        tree_id: str | None = None,
        session: SessionKind = SessionKind.AUTONOMOUS,
        client_id: str | None = None,
        user: str | None = None,
    ) -> TreeRecord:
        """Record the tree and its tasks, then dispatch what is ready. ``tree_id`` names this run."""
        now = self.clock()
        run_tree_id = tree_id or f"{tree.id}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        record = TreeRecord(
            tree_id=run_tree_id, tree=tree, session=session, client_id=client_id, user=user, submitted_at=now
        )
        tasks = [
            TaskRecord(tree_id=run_tree_id, task_id=t.id, tool=t.tool, updated_at=now) for t in tree.tasks
        ]
        self.store.put_tree(record, tasks)
        self.advance(run_tree_id)
        return record

    # --- advance -------------------------------------------------------------------
    def advance(self, tree_id: str) -> TreeStatus | None:
        """Skip what cannot run, dispatch what is ready, finish the tree when all is final."""
        tree_rec = self.store.get_tree(tree_id)
        if tree_rec is None or tree_rec.status is not TreeStatus.RUNNING:
            return tree_rec.status if tree_rec else None
        while True:
            records = self._records(tree_id)
            step = plan(tree_rec.tree, records)
            changed = False
            for task_id, why in step.skip:
                changed |= self._finish_without_run(records[task_id], TaskState.SKIPPED, why)
            for task_id in step.ready:
                changed |= self._start(tree_rec, tree_rec.tree.task(task_id), records)
            if not changed:
                break
        status = tree_status(records)
        if status is not None and self.store.finish_tree(tree_id, status, self.clock()):
            log.info("tree %s finished: %s", tree_id, status.value)
        self.hot.notify(tree_id)
        return status

    def _records(self, tree_id: str) -> dict[str, TaskRecord]:
        return {r.task_id: r for r in self.store.get_tasks(tree_id)}

    def _start(self, tree_rec: TreeRecord, spec: TaskSpec, records: dict[str, TaskRecord]) -> bool:
        route = decide_route(
            RouteRequest(tool=spec.tool, execution_target=spec.execution_target, session=tree_rec.session),
            self.registry.tools,
            self._presence(tree_rec),
        )
        rec = records[spec.id]
        if route.kind is RouteKind.SERVER:
            return self._dispatch_server(tree_rec, spec, rec, route, records)
        if route.kind is RouteKind.FAIL:
            hint = self.registry.failure_hint() if route.reason.startswith("Tool unknown") else ""
            error = ErrorInfo(type="RouteFailed", message=f"task {spec.id!r}: {route.reason}{hint}",
                              data={"task": spec.id, "tool": spec.tool})
            return self._finish_without_run(rec, TaskState.FAILED, route.reason, error=error)
        if route.kind is RouteKind.SKIP:
            return self._finish_without_run(rec, TaskState.SKIPPED, route.reason)
        # Client routes, blocked and pending-client parking come with the client path.
        parked = TaskState.BLOCKED if route.kind is RouteKind.BLOCKED else TaskState.PENDING_CLIENT
        return self._transition(rec, {TaskState.PENDING}, state=parked, reason=route.reason, route=route.kind.value)

    def _presence(self, tree_rec: TreeRecord) -> Presence:
        return Presence(session_client=tree_rec.client_id, user=tree_rec.user)

    def _dispatch_server(
        self, tree_rec: TreeRecord, spec: TaskSpec, rec: TaskRecord, route: Route, records: dict[str, TaskRecord]
    ) -> bool:
        try:
            args = resolve_args(spec.args, {d: records[d].result for d in spec.depends_on})
        except UnresolvedReference as exc:
            error = ErrorInfo(type="UnresolvedReference", message=f"task {spec.id!r}: {exc}", data={"task": spec.id})
            return self._finish_without_run(rec, TaskState.FAILED, str(exc), error=error)
        attempt = rec.attempt + 1
        run_id = new_run_id(tree_rec.tree_id, spec.id, attempt)
        summary = "server" if route.fell_back_from is None else f"server (fallback from {route.fell_back_from})"
        now = self.clock()
        moved = self.store.transition(
            rec.tree_id, rec.task_id, from_states={TaskState.PENDING}, expect_run_id=rec.run_id,
            state=TaskState.QUEUED_SERVER, run_id=run_id, attempt=attempt, route=summary,
            reason=route.reason, tool=route.tool, queued_at=now, updated_at=now,
        )
        if moved is None:
            return False
        self._publish(self._call(spec, moved, args))
        return True

    def _call(self, spec: TaskSpec, rec: TaskRecord, args: dict[str, Any]) -> ToolCall:
        tool = self.registry.tools[rec.tool]
        return ToolCall(
            run_id=rec.run_id or "", tree_id=rec.tree_id, task_id=rec.task_id, tool=tool.name,
            tool_type=tool.type, mcp_server=tool.mcp_server, args=args,
            timeout_s=spec.timeout_s or tool.timeout_s or self.settings.default_timeout_s,
            max_result_bytes=self.settings.max_result_bytes, max_deliveries=self.settings.max_deliveries,
        )

    def _publish(self, call: ToolCall) -> None:
        try:
            self.publisher.send(call, SERVER_QUEUE)
        except Exception:  # noqa: BLE001 - the store already says queued; the reconciler re-sends
            log.exception("could not publish task %s (run %s); the reconciler will re-send it",
                          call.task_id, call.run_id)

    def _finish_without_run(
        self, rec: TaskRecord, state: TaskState, reason: str, error: ErrorInfo | None = None
    ) -> bool:
        now = self.clock()
        return self._transition(rec, {TaskState.PENDING}, state=state, reason=reason, error=error,
                                finished_at=now)

    def _transition(self, rec: TaskRecord, from_states: set[TaskState], **changes: Any) -> bool:
        changes.setdefault("updated_at", self.clock())
        return self.store.transition(rec.tree_id, rec.task_id, from_states=from_states, **changes) is not None

    # --- results ------------------------------------------------------------------------
    def on_result(self, result: ToolResult) -> bool:
        """Record a result once. A stale run id (re-sent, re-delivered, late) changes nothing."""
        ok, value, error = result.ok, result.value, result.error
        size = len(json.dumps(value, default=str)) if ok else 0
        if size > self.settings.max_result_bytes:
            ok, value = False, None
            error = ErrorInfo(
                type="ResultTooLarge",
                message=f"result of tool {result.tool!r} is {size} bytes, over the cap of "
                f"{self.settings.max_result_bytes} bytes (raise VANCETOPE_MAX_RESULT_BYTES, or return less)",
                data={"task": result.task_id, "tool": result.tool, "size": size},
            )
        recorded = self.store.transition(
            result.tree_id, result.task_id, from_states=IN_FLIGHT, expect_run_id=result.run_id,
            state=TaskState.DONE if ok else TaskState.FAILED, result=value, error=error,
            reason="" if ok else (error.message if error else "failed"), worker=result.worker,
            started_at=result.started_at, finished_at=result.finished_at, updated_at=self.clock(),
        )
        if recorded is None:
            log.info("ignored result of run %s (task %s): not the task's current run, or already recorded",
                     result.run_id, result.task_id)
            return False
        self.hot.clear_running(result.tree_id, result.task_id, result.run_id)
        self.advance(result.tree_id)
        return True

    # --- reconcile -------------------------------------------------------------------------
    def reconcile(self) -> list[str]:
        """Re-send queued tasks that no queue holds; advance trees left with stale pending tasks.

        Returns the task ids re-sent. A re-send gets a new run id, so if the old message
        was only late, its result is ignored rather than recorded twice.
        """
        cutoff = self.clock() - self.settings.reconcile_grace_s
        resent: list[str] = []
        stale = self.store.tasks_in_states({TaskState.QUEUED_SERVER}, updated_before=cutoff)
        if stale:
            held = self.hot.message_ids_held([SERVER_QUEUE, BRAIN_QUEUE])
            for rec in stale:
                if rec.run_id not in held and self._resend(rec):
                    resent.append(rec.task_id)
        for tree_id in {r.tree_id for r in self.store.tasks_in_states({TaskState.PENDING}, updated_before=cutoff)}:
            self.advance(tree_id)
        return resent

    def _resend(self, rec: TaskRecord) -> bool:
        tree_rec = self.store.get_tree(rec.tree_id)
        if tree_rec is None:
            return False
        attempt = rec.attempt + 1
        now = self.clock()
        moved = self.store.transition(
            rec.tree_id, rec.task_id, from_states={TaskState.QUEUED_SERVER}, expect_run_id=rec.run_id,
            run_id=new_run_id(rec.tree_id, rec.task_id, attempt), attempt=attempt, queued_at=now, updated_at=now,
        )
        if moved is None:
            return False
        spec = tree_rec.tree.task(rec.task_id)
        records = self._records(rec.tree_id)
        args = resolve_args(spec.args, {d: records[d].result for d in spec.depends_on})
        log.warning("task %s of tree %s was queued but no queue held run %s: re-sent as run %s",
                    rec.task_id, rec.tree_id, rec.run_id, moved.run_id)
        self._publish(self._call(spec, moved, args))
        self.hot.notify(rec.tree_id)
        return True
