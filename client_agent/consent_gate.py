"""The gate that holds a call of an ``ask`` tool until the workstation's user answers
(layer: client_agent, threads).

One job: ``ConsentGate``, asked by ``workers.tasks`` before each call. The answers come
through the consent state directory (client_agent.approvals.ConsentDir), signed by the
approval key: a decision file written by anything else counts as no answer.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from client_agent.config import AgentConfig, AskScope
from client_agent.consent import PendingRequest, RequestKind, asks, tree_scope_key
from workers.contracts import ErrorInfo, ToolAwaiting, ToolCall

if TYPE_CHECKING:
    from client_agent.approvals import ConsentDir

log = logging.getLogger("vancetope.agent.consent")

_POLL_S = 0.2
_TREE_SCOPES_KEPT = 4096


class ConsentGate:
    """``workers.tasks`` asks this before each call: a call of an ``ask`` tool waits here (as
    ``awaiting_approval``, reported through ``report``) until the user answers, the wait
    times out, the run is cancelled or the agent stops. The waiting call keeps its worker
    thread and its message (whose lease the worker keeps renewing), and ``timeout_s``
    starts only once it runs."""

    def __init__(
        self,
        config: AgentConfig,
        state: ConsentDir,
        report: Callable[[ToolAwaiting], None],
        stop: threading.Event,
        cancelled: Callable[[str], bool] = lambda run_id: False,
        poll_s: float = _POLL_S,
    ) -> None:
        self.patterns = config.ask
        self.scope = config.ask_scope
        self.timeout_s = config.ask_timeout_s
        self.client_id = config.client_id
        self.state = state
        self.report = report
        self.stop = stop
        self.cancelled = cancelled
        self.poll_s = poll_s
        self._lock = threading.Lock()
        self._tree_ok: OrderedDict[str, None] = OrderedDict()

    def __call__(self, call: ToolCall) -> ErrorInfo | None:
        if not asks(self.patterns, call.tool, call.mcp_server):
            return None
        key = tree_scope_key(call.tree_id, call.tool, call.mcp_server)
        if self._covered(key):
            log.info("task %s (tool %s): approved for this tree already", call.task_id, call.tool)
            return None
        now = time.time()
        request = PendingRequest(
            id=f"c-{secrets.token_hex(4)}",
            kind=RequestKind.CALL,
            since=now,
            tool=call.tool,
            mcp_server=call.mcp_server,
            tree_id=call.tree_id,
            task_id=call.task_id,
            run_id=call.run_id,
            args=call.args,
            expires_at=now + self.timeout_s,
            scope=self.scope.value,
        )
        self.state.add_pending(request)
        log.warning(
            "task %s of tree %s wants to run %s: waiting for your approval (vancetope-agent pending; "
            "vancetope-agent approve %s / deny %s; denied in %gs without an answer)",
            call.task_id, call.tree_id, call.tool, request.id, request.id, self.timeout_s,
        )  # fmt: skip
        self._report(call, request.id, waiting=True)
        try:
            error = self._wait(call, request, key)
        finally:
            self.state.remove_pending(request.id)
            self.state.forget_decision(request.id)
        if error is None:
            log.info("task %s (tool %s) approved (%s)", call.task_id, call.tool, request.id)
            self._report(call, request.id, waiting=False)
        else:
            log.warning("%s", error.message)
        return error

    def _covered(self, key: str) -> bool:
        with self._lock:
            return self.scope is AskScope.TREE and key in self._tree_ok

    def _approve_tree(self, key: str) -> None:
        if self.scope is not AskScope.TREE:
            return
        with self._lock:
            self._tree_ok[key] = None
            while len(self._tree_ok) > _TREE_SCOPES_KEPT:
                self._tree_ok.popitem(last=False)

    def _wait(self, call: ToolCall, request: PendingRequest, key: str) -> ErrorInfo | None:
        deadline = time.monotonic() + self.timeout_s
        turns = 0
        what = f"task {call.task_id!r} of tree {call.tree_id} (tool {call.tool!r})"
        data = {"task": call.task_id, "tool": call.tool, "approval": request.id}
        while True:
            decision = self.state.decision(request.id)
            if decision is not None and decision.approved:
                self._approve_tree(key)
                return None
            if decision is not None:
                why = f": {decision.reason}" if decision.reason else ""
                return ErrorInfo(
                    type="ApprovalDenied",
                    message=f"{what} was denied by the workstation's user{why}; nothing ran",
                    data=data,
                )
            if self._covered(key):  # another call of this tree and tool was approved meanwhile
                return None
            # The wall clock too: the monotonic one stops while the workstation sleeps, and a
            # call held over a week of closed lid would still take an approval on waking, after
            # the brain took it back and ran it again (its cancelled member kept a week and a day).
            if time.monotonic() >= deadline or (
                request.expires_at is not None and time.time() >= request.expires_at
            ):
                return ErrorInfo(
                    type="ApprovalTimeout",
                    message=f"{what}: no approval within {self.timeout_s:g}s on client agent "
                    f"{self.client_id!r}; nothing ran (the user can answer with vancetope-agent approve, "
                    "or raise ask_timeout_s)",
                    data=data,
                )
            if self.stop.is_set():
                return ErrorInfo(
                    type="ApprovalAborted",
                    message=f"{what}: the client agent stopped while the call awaited approval; "
                    "nothing ran (run the task again)",
                    data=data,
                )
            turns += 1
            if turns % 10 == 0 and self._cancelled(call.run_id):  # a round trip: not every poll
                return ErrorInfo(
                    type="Cancelled", message=f"{what} was cancelled while it awaited approval", data=data
                )
            self.stop.wait(self.poll_s)

    def _cancelled(self, run_id: str) -> bool:
        try:
            return self.cancelled(run_id)
        except Exception:  # noqa: BLE001 - a broker hiccup must not end the wait
            return False

    def _report(self, call: ToolCall, approval_id: str, waiting: bool) -> None:
        update = ToolAwaiting(
            run_id=call.run_id, tree_id=call.tree_id, task_id=call.task_id, waiting=waiting,
            approval_id=approval_id, at=time.time(), client_id=self.client_id,
        )  # fmt: skip
        try:
            self.report(update)
        except Exception as exc:  # noqa: BLE001 - the brain's view is for watching, the wait goes on
            log.warning("could not tell the brain that task %s awaits approval: %s", call.task_id, exc)
