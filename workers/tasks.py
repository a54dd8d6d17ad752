"""The Celery task that runs one tool call (layer: workers). It holds no logic:
decode the ``ToolCall``, check it was not cancelled, count the delivery, execute,
hand the ``ToolResult`` to a sink (the server pool sends it to queue ``brain``; a
client agent pushes it to its own outbox).

A worker killed mid-call leaves the message unacked (late ack + reject on worker
lost), so the call is delivered again; the delivery counter in Redis turns a task
that keeps killing its worker into a clear ``PoisonTask`` failure instead of a loop.
All keys carry the connection's ``global_keyprefix``, so a client agent only ever
touches its own.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import redis
from celery import Celery, Task
from celery.exceptions import Ignore, Retry
from pydantic import ValidationError
from redis.client import Pipeline

from workers import masking
from workers.call_relay import CallChannel
from workers.call_stop import StopCheck, Stopped
from workers.contracts import (
    BRAIN_QUEUE,
    RECORD_RESULT_TASK,
    REFILLS_WINDOW_HEADER,
    RETRYING,
    RUN_TOOL_TASK,
    TASK_REVOKED_EVENT,
    TERMINATED_FIELDS,
    AskAnswer,
    ErrorInfo,
    ResourceUpdated,
    ToolAsk,
    ToolCall,
    ToolLog,
    ToolProgress,
    ToolResult,
    channel_resource_updates,
    key_cancelled,
    key_deliveries,
    key_tree_running,
    shown_failure,
    stop_member,
)
from workers.errors import CallFailed, PoisonTask
from workers.execute import execute
from workers.mcp_clients import MCPClientManager, get_manager
from workers.recent_calls import RecentCalls
from workers.redis_connect import app_redis_client
from workers.tools.builtin import BUILTINS, BuiltinTool

log = logging.getLogger("vancetope.worker")

_DELIVERY_TTL_S = 7 * 24 * 3600
# The stop check's connection (``HotState.stopped``): a link gone silent answers within these.
ASK_TIMEOUTS: Final = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0, "socket_keepalive": True}

# Takes a run's result; answers what it made of the task when it recorded it (``RETRYING``:
# a failed attempt to be tried again), else None (handed on to be recorded elsewhere).
ResultSink = Callable[[ToolResult], str | None]
# Asked before a call runs, with the worker's name and the start time: None if the run must
# not start (cancelled, or no longer the task's run), else this delivery's number.
RunStart = Callable[[ToolCall, str, float], int | None]
# Asked before a call runs (a client agent's consent): None to run it, else why it may not.
CallGate = Callable[[ToolCall], ErrorInfo | None]


class HotState:
    """Per-process Redis client for a worker's own hot-state keys (under its key prefix)."""

    def __init__(self, app: Celery) -> None:
        self._app = app
        self._client: redis.Redis | None = None
        self._pid = 0
        self._asker: redis.Redis | None = None
        self._asker_pid = 0
        opts = app.conf.broker_transport_options or {}
        self.prefix: str = opts.get("global_keyprefix", "") or ""

    @property
    def client(self) -> redis.Redis:
        if self._client is None or self._pid != os.getpid():
            self._client = app_redis_client(self._app)
            self._pid = os.getpid()
        return self._client

    def stopped(self, run_id: str) -> bool:
        """Whether ``run_id`` must stop (``stop_member`` in this worker's cancelled set): asked
        every ``STOP_POLL_S`` while a call runs (``workers.call_stop``), on a connection of its
        own with short timeouts, so that a silent link delays the call by a second or two at
        most, never holds it."""
        if self._asker is None or self._asker_pid != os.getpid():
            self._asker = app_redis_client(self._app, **ASK_TIMEOUTS)
            self._asker_pid = os.getpid()
        return must_stop(self._asker, self.prefix, run_id)

    def begin_run(self, call: ToolCall, worker: str, started_at: float) -> int | None:
        """``begin_run`` on this worker's own keys."""
        return begin_run(self.client, self.prefix, call, worker, started_at)


def must_stop(client: redis.Redis, prefix: str, run_id: str) -> bool:
    """Whether running ``run_id`` must stop: ``stop_member(run_id)`` in the cancelled set under
    ``prefix`` (a cancel or an expiry put it there), one ``SISMEMBER`` on ``client``."""
    return bool(client.sismember(prefix + key_cancelled(), stop_member(run_id)))


def begin_run(
    client: redis.Redis,
    prefix: str,
    call: ToolCall,
    worker: str,
    started_at: float,
    then: Callable[[Pipeline], object] | None = None,
) -> int | None:
    """None if the run was cancelled; else this delivery's number, the run marked running.

    One MULTI/EXEC, one round trip, no WATCH and no Lua (a client's Redis user may run no
    script, so none can block Redis for everyone): the cancel check, the count and the mark
    see the same state, so a run cancelled before its mark never starts, and two deliveries
    at once never get the same number. ``then`` queues more commands in the same
    transaction: on a link 100 ms from Redis each round trip saved is 200 ms off every call.

    The count and the mark are written whatever the check finds. A cancelled run's count
    is never read again, and its mark, like a mark over ``max_deliveries`` (that run fails
    at once as a PoisonTask), is trusted by no reader: readers trust a mark only for the run
    the store still has in flight (brain.cli.display.shown_state). Marks are never deleted
    one by one (a round trip per result): the hash expires, and the brain deletes it when
    the tree finishes."""
    with client.pipeline(transaction=True) as pipe:
        for command in begin_commands(prefix, call, worker, started_at):
            pipe.execute_command(*command)
        if then is not None:
            then(pipe)
        return begun(pipe.execute())


def begin_commands(prefix: str, call: ToolCall, worker: str, started_at: float) -> list[tuple[Any, ...]]:
    """``begin_run``'s transaction, as commands (``workers.sent_ahead`` sends them without
    waiting for the reply); ``begun`` reads its replies."""
    running = prefix + key_tree_running(call.tree_id)
    deliveries = prefix + key_deliveries(call.run_id)
    mark = json.dumps({"run_id": call.run_id, "worker": worker, "started_at": started_at})
    return [
        ("SISMEMBER", prefix + key_cancelled(), call.run_id),
        # INCRBY, not INCR: a client agent's ACL user is granted the command redis-py sends.
        ("INCRBY", deliveries, 1),
        ("EXPIRE", deliveries, _DELIVERY_TTL_S),
        ("HSET", running, call.task_id, mark),
        ("EXPIRE", running, _DELIVERY_TTL_S),
    ]


def begun(replies: list[Any]) -> int | None:
    """What ``begin_commands``' replies say: None if the run was cancelled, else this
    delivery's number."""
    cancelled, number, *_ = replies
    return None if cancelled else int(number)


def send_to_brain(app: Celery) -> ResultSink:
    """The sink that hands a result to the brain as a ``record_result`` job on queue ``brain``."""

    def to_brain(result: ToolResult) -> None:
        app.send_task(
            RECORD_RESULT_TASK,
            args=[result.model_dump(mode="json")],
            queue=BRAIN_QUEUE,
            # Flower shows this, never the result itself (it may hold file contents).
            argsrepr=f"{result.tool} result of {result.run_id}",
            kwargsrepr="{}",
            declare=[],
        )

    return to_brain


def register(
    app: Celery,
    *,
    sink: ResultSink | None = None,
    mcp: Callable[[], MCPClientManager | None] | None = None,
    native: Mapping[str, BuiltinTool] | None = None,
    client_id: str | None = None,
    builtins: Mapping[str, BuiltinTool] = BUILTINS,
    progress: ProgressSink | None = None,
    gate: CallGate | None = None,
    begin: RunStart | None = None,
    task_events: bool = True,
    channel: CallChannel | None = None,
    recent: RecentCalls | None = None,
    end: Callable[[ToolCall], None] | None = None,
    stop_asked: Callable[[str], bool] | None = None,
) -> Task:
    """Register ``vancetope.run_tool`` on ``app``. Defaults are the server pool's: results go
    to queue ``brain``, MCP servers come from ``VANCETOPE_MCP_CONFIG``, no native tools;
    ``builtins`` as ``builtin_tools`` made them from the worker's settings. ``progress``
    gets an MCP server's progress notifications while a call runs; each one is also a
    ``task-progress`` event, which Flower shows as the task's state (PROGRESS). ``gate`` is
    asked before each call runs (a client agent's user approving it); the time it takes is
    not the tool's: ``timeout_s`` starts when the tool starts. ``begin`` starts a run, before
    ``gate`` (default: ``HotState.begin_run``, the cancelled set and a delivery counter in
    Redis; the server pool's records the start in the store, a client agent's also tells the
    brain when the call is still running a moment later). Without
    ``task_events`` a server pool sends no ``task-progress`` events either. ``channel`` takes
    an MCP server's log messages and its sampling/elicitation requests during a call
    (``workers.call_relay``). ``recent`` (a client agent's) answers a task re-sent as a new run
    after its result was lost from the run that already did it (``workers.recent_calls``).
    ``end`` is told of every call this worker took once it is over (run, refused or failed;
    the server pool gives back a gate slot there). ``stop_asked(run_id)`` is asked every
    ``STOP_POLL_S`` while a call runs, whether it must stop (default: ``HotState.stopped``, on
    a connection of its own; a client agent asks on its channel's: ``client_agent.agent.Agent``)."""
    hot = HotState(app)
    start_run = begin or hot.begin_run
    ask_stop = stop_asked or hot.stopped

    def publish_updated(update: ResourceUpdated) -> None:
        hot.client.publish(channel_resource_updates(), update.model_dump_json())

    def server_mcp() -> MCPClientManager | None:
        manager = get_manager(os.environ.get("VANCETOPE_MCP_CONFIG") or None)
        if manager is not None:
            # The gateway relays what a subscribed resource's server says of it (issue 24).
            manager.resource_sink = publish_updated
        return manager

    deliver = sink or send_to_brain(app)
    mcp_manager = mcp or server_mcp

    def run(self: Task, call: ToolCall, worker: str) -> Outcome:
        started = time.time()
        stop: StopCheck | None = None
        deliveries = start_run(call, worker, started)
        if deliveries is None:
            log.info(
                "run %s of task %s was cancelled or is no longer its run; not starting it",
                call.run_id,
                call.task_id,
            )
            return Outcome({"ok": False, "cancelled": True, "task": call.task_id})
        if deliveries > call.max_deliveries:
            err = PoisonTask(
                f"task {call.task_id!r} (tool {call.tool!r}) was delivered {deliveries} times: its worker "
                f"died each time; gave up after {call.max_deliveries}. Check the tool for crashes or memory use.",
                deliveries=deliveries,
            )
            result = _failure(call, err.to_info(), worker, started, client_id)
        else:
            reused = recent.begin(call, wait_s=call.timeout_s) if recent is not None else None
            if reused is not None:
                log.warning(
                    "run %s of task %r (tool %r): the same call succeeded as run %s %.0fs ago and "
                    "its result did not reach the brain; answering with that result instead of "
                    "running the tool again",
                    call.run_id,
                    call.task_id,
                    call.tool,
                    reused.first_run_id,
                    reused.age_s,
                )
                result = reused.result
            else:
                ran: ToolResult | None = None
                stop = StopCheck(ask_stop, call.run_id)
                try:
                    ran = _gated_run(
                        call,
                        gate,
                        mcp_manager,
                        native,
                        builtins,
                        worker,
                        client_id,
                        started,
                        _reporter(self, progress, flower=client_id is None and task_events),
                        _Masked(channel) if channel is not None else None,
                        stop,
                    )
                finally:
                    if recent is not None:
                        recent.end(call, ran)
                result = ran
        outcome = deliver(masked(result))
        if not result.ok and client_id is None and stop is not None and stop.fired:
            # Stopped by its task's cancel or expiry: REVOKED, as Celery shows a task it
            # terminated (``Request._announce_revoked``); Ignore acks and sends no event of its own.
            if task_events:
                self.send_event(TASK_REVOKED_EVENT, **TERMINATED_FIELDS)
            raise Ignore()
        if not result.ok and client_id is None:
            # Handed on already; raising only makes Celery's own event (and so Flower) say
            # FAILURE, or RETRY for an attempt the brain tries again (Retry raised, not
            # self.retry(): the brain sends the next attempt, as a new run, when it is due).
            # A client agent sends no events: the brain tells Flower about its calls.
            failed = CallFailed(shown_failure(result), task=call.task_id, tool=call.tool)
            if outcome == RETRYING:
                raise Retry(f"{failed}; tried again as a new run", exc=failed)
            raise failed
        return Outcome({"ok": result.ok, "tool": call.tool, "task": call.task_id})

    # ``throws``: a failed call is an expected outcome, logged by Celery without a traceback.
    # ``shared=False``: this task is ``app``'s. Celery's default also registers it with every app
    # finalized later in the process, where another ``register`` of it may already be.
    @app.task(
        name=RUN_TOOL_TASK,
        bind=True,
        acks_late=True,
        reject_on_worker_lost=True,
        throws=(CallFailed,),
        shared=False,
    )
    def run_tool(self: Task, payload: Any) -> Outcome:
        worker = self.request.hostname or "worker"
        call = _decode(payload, worker, client_id)
        if call is None:
            return Outcome({"ok": False, "error": "malformed tool call (see worker log)"})
        if end is None:
            return run(self, call, worker)
        if call.holds_slot and (self.request.headers or {}).get(REFILLS_WINDOW_HEADER) is True:
            call = call.model_copy(update={"refills_window": True})
        try:
            return run(self, call, worker)
        finally:
            end(call)

    return run_tool


class Outcome:
    """What ``run_tool`` returns: the few words Flower shows as the task's result, written as
    the dict they are (``fields``). Not a dict itself: Celery writes a task's return value out
    with its ``saferepr``, which walks a dict token by token (17 us for these three keys, a
    twentieth of a pool child's time per no-op task); any other object is one ``repr``."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def __repr__(self) -> str:
        return repr(self.fields)

    def __eq__(self, other: object) -> bool:
        return self.fields == (other.fields if isinstance(other, Outcome) else other)

    __hash__ = None  # type: ignore[assignment]


ProgressSink = Callable[[ToolProgress], None]


def masked(result: ToolResult) -> ToolResult:
    """``result`` with every vault secret this process resolved replaced by ``***``, before it
    reaches the store, a message or Flower (``workers.masking``)."""
    if not masking.active():
        return result
    return ToolResult.model_validate(masking.mask_data(result.model_dump(mode="json")))


def _reporter(task: Task, sink: ProgressSink | None, flower: bool) -> ProgressSink:
    """``sink``, and on the server pool a ``task-progress`` event (a client agent sends no
    events: its Redis user may publish nowhere; the brain relays its progress instead).

    The event names the task read here, on the task's thread: an MCP server's progress is
    reported from the MCP client's event loop thread, where Celery's ``Task.request`` (a
    thread-local stack) is empty, and ``Task.send_event`` sent it with no task id, so Flower
    never showed a server call's progress."""
    request = task.request
    uuid, hostname = request.id, request.hostname

    def report(update: ToolProgress) -> None:
        if masking.active() and update.message:
            update = update.model_copy(update={"message": masking.mask(update.message)})
        if flower:
            with task.app.events.default_dispatcher(hostname=hostname) as dispatcher:
                dispatcher.send(
                    "task-progress",
                    uuid=uuid,
                    retry=True,
                    retry_policy=task.app.conf.task_publish_retry_policy,
                    progress=update.progress,
                    total=update.total,
                    message=update.message or "",
                )
        if sink is not None:
            sink(update)

    return report


class _Masked:
    """A channel whose log messages have every vault secret this process resolved replaced by
    ``***`` first, as a result's and a progress message's are."""

    def __init__(self, channel: CallChannel) -> None:
        self.channel = channel

    def log(self, update: ToolLog) -> None:
        if masking.active():
            update = ToolLog.model_validate(masking.mask_data(update.model_dump(mode="json")))
        self.channel.log(update)

    def ask(self, ask: ToolAsk, timeout: float) -> AskAnswer:
        return self.channel.ask(ask, timeout)


def _gated_run(
    call: ToolCall,
    gate: CallGate | None,
    mcp: Callable[[], MCPClientManager | None],
    native: Mapping[str, BuiltinTool] | None,
    builtins: Mapping[str, BuiltinTool],
    worker: str,
    client_id: str | None,
    started: float,
    progress: ProgressSink,
    channel: CallChannel | None,
    stopped: Stopped,
) -> ToolResult:
    """The call, once ``gate`` (a client agent's user) lets it run; the time spent asking is
    not the tool's. A broken MCP config fails the call, not the worker. ``stopped`` says
    whether the call's task was cancelled while it runs (``workers.call_stop``)."""
    refusal = gate(call) if gate is not None else None
    if refusal is not None:
        return _failure(call, refusal, worker, started, client_id)
    started = time.time() if gate is not None else started
    try:
        manager = mcp()
    except Exception as exc:  # noqa: BLE001 - the call's error, said in its result
        return _failure(
            call, ErrorInfo(type=type(exc).__name__, message=str(exc)), worker, started, client_id
        )
    return execute(
        call,
        mcp=manager,
        worker=worker,
        native=native,
        client_id=client_id,
        builtins=builtins,
        progress=progress,
        channel=channel,
        stopped=stopped,
    )


def _decode(payload: Any, worker: str, client_id: str | None) -> ToolCall | None:
    try:
        call = ToolCall.model_validate(payload)
    except ValidationError as exc:
        # Nothing to report to: without valid ids no task can be failed. The brain's
        # reconciler re-sends the real task if this message was a damaged copy of one.
        log.error("worker %s dropped a message that is not a valid tool call: %s", worker, exc)
        return None
    if client_id is not None and call.client_id != client_id:
        log.error(
            "worker %s dropped run %s: it was routed to client %r, not to this one",
            worker,
            call.run_id,
            call.client_id,
        )
        return None
    return call


def _failure(
    call: ToolCall, error: ErrorInfo, worker: str, started: float, client_id: str | None
) -> ToolResult:
    return ToolResult(
        run_id=call.run_id,
        tree_id=call.tree_id,
        task_id=call.task_id,
        tool=call.tool,
        ok=False,
        error=error,
        worker=worker,
        started_at=started,
        finished_at=time.time(),
        client_id=client_id,
    )
