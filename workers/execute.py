"""Run one tool call on the server pool (layer: workers).

One job: turn a ``ToolCall`` into a ``ToolResult`` - validate the arguments,
dispatch by tool type (built-in or MCP), enforce the call's timeout and result
cap - without ever raising for a tool problem: every failure becomes
``ToolResult(ok=False, error=...)``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from jsonschema import exceptions as schema_errors
from jsonschema import validators
from mcp.types import CallToolResult

from workers import argcheck, mcp_surface
from workers.call_relay import CallChannel, CallRelay
from workers.call_stop import WHY_STOPPED, Stopped, Waited, stopped_error, wait_unless_stopped
from workers.contracts import (
    MAX_PROGRESS_MESSAGE_CHARS,
    ErrorInfo,
    ToolCall,
    ToolProgress,
    ToolResult,
    ToolType,
    result_size,
    surface_op,
)
from workers.errors import (
    Cancelled,
    InvalidArguments,
    ResultTooLarge,
    ToolFailed,
    ToolNotFound,
    ToolTimeout,
    WorkerError,
)
from workers.mcp_clients import MCPClientManager, ProgressSink, whole_result
from workers.tools.builtin import BUILTINS, BuiltinContext, BuiltinTool

log = logging.getLogger("vancetope.worker.execute")


def execute(
    call: ToolCall,
    *,
    mcp: MCPClientManager | None,
    worker: str,
    native: Mapping[str, BuiltinTool] | None = None,
    client_id: str | None = None,
    clock: Callable[[], float] = time.time,
    builtins: Mapping[str, BuiltinTool] = BUILTINS,
    progress: Callable[[ToolProgress], None] | None = None,
    channel: CallChannel | None = None,
    stopped: Stopped | None = None,
) -> ToolResult:
    """Run ``call`` and report its outcome; raises only for bugs in this function itself.

    ``native`` holds the native tools of a client agent (same shape as built-ins);
    ``client_id`` marks the result as executed by that client; ``builtins`` are the
    built-ins as this worker's settings made them (``builtin_tools``); ``progress`` gets an
    MCP server's progress notifications for this call (``Throttle`` coalesces them);
    ``channel`` its log messages and sampling/elicitation requests (``CallRelay``);
    ``stopped`` is asked while the call runs whether its task was cancelled, and a True
    stops the call with a ``Cancelled`` result (``workers.call_stop``).
    """
    started = clock()
    value: Any = None
    whole: dict[str, Any] | None = None
    error: ErrorInfo | None = None
    on_progress = Throttle(call, progress, client_id, clock) if progress is not None else None
    relay = CallRelay(call, channel, client_id, clock)
    try:
        value, whole = _dispatch(call, mcp, native, builtins, on_progress, relay, stopped)
        _check_size(call, value, whole)
    except WorkerError as exc:
        error = exc.to_info()
        if isinstance(exc, Cancelled):
            log.info(
                "run %s of task %s (tool %r) stopped after %.1fs: %s",
                call.run_id,
                call.task_id,
                call.tool,
                clock() - started,
                WHY_STOPPED,
            )
    except Exception as exc:  # noqa: BLE001 - a tool's surprise is a result, not a crash
        error = ErrorInfo(type=type(exc).__name__, message=str(exc))
    finally:
        if on_progress is not None:
            on_progress.flush()  # the latest progress goes before the result, or never
        relay.close()
    return ToolResult(
        run_id=call.run_id,
        tree_id=call.tree_id,
        task_id=call.task_id,
        tool=call.tool,
        ok=error is None,
        value=None if error else value,
        mcp=None if error else whole,
        error=error,
        worker=worker,
        started_at=started,
        finished_at=clock(),
        client_id=client_id,
    )


def _dispatch(
    call: ToolCall,
    mcp: MCPClientManager | None,
    native: Mapping[str, BuiltinTool] | None,
    builtins: Mapping[str, BuiltinTool],
    on_progress: ProgressSink | None = None,
    relay: CallRelay | None = None,
    stopped: Stopped | None = None,
) -> tuple[Any, dict[str, Any] | None]:
    """The value, and for an MCP tool the server's whole result."""
    if call.tool_type is ToolType.BUILT_IN:
        tool = builtins.get(call.tool)
        if tool is None:
            raise ToolNotFound(
                f"no built-in tool {call.tool!r} on the server (built-ins: {', '.join(sorted(builtins))})",
                tool=call.tool,
            )
        validate_args(call.tool, tool.descriptor.input_schema, call.args)
        return _run_builtin(tool, call.args, call.timeout_s, stopped), None
    if call.tool_type is ToolType.MCP and surface_op(call.tool) is not None:
        # resources/read, prompts/get, completion/complete: the MCP result is the value.
        return _run_surface(call, mcp, stopped), None
    if call.tool_type is ToolType.MCP:
        # The convenient value is derived from the whole result where it is recorded.
        return None, whole_result(_run_mcp(call, mcp, on_progress, relay, stopped))
    if native is not None:
        tool = native.get(call.tool)
        if tool is None:
            raise ToolNotFound(
                f"this client agent has no native tool {call.tool!r} (it has: {', '.join(sorted(native))})",
                tool=call.tool,
            )
        validate_args(call.tool, tool.descriptor.input_schema, call.args)
        return _run_builtin(tool, call.args, call.timeout_s, stopped), None
    raise ToolNotFound(
        f"native tool {call.tool!r} runs only on a client agent, not on the server", tool=call.tool
    )


def _mcp_for(call: ToolCall, mcp: MCPClientManager | None) -> tuple[str, MCPClientManager]:
    if not call.mcp_server:
        raise ToolNotFound(f"MCP tool {call.tool!r} names no mcp_server", tool=call.tool)
    if mcp is None:
        raise ToolNotFound(
            f"MCP tool {call.tool!r} needs server {call.mcp_server!r}, but this worker has no MCP config",
            tool=call.tool,
            server=call.mcp_server,
        )
    return call.mcp_server, mcp


def _run_surface(
    call: ToolCall, mcp: MCPClientManager | None, stopped: Stopped | None = None
) -> dict[str, Any]:
    server, manager = _mcp_for(call, mcp)
    found = surface_op(call.tool)
    assert found is not None
    if found[0] != server:
        raise ToolNotFound(f"{call.tool!r} is not a request of MCP server {server!r}", tool=call.tool)
    validate_args(call.tool, mcp_surface.SCHEMAS[found[1]], call.args)
    return manager.surface_request(server, found[1], call.args, timeout=call.timeout_s, stopped=stopped)


def _run_mcp(
    call: ToolCall,
    mcp: MCPClientManager | None,
    on_progress: ProgressSink | None,
    relay: CallRelay | None = None,
    stopped: Stopped | None = None,
) -> CallToolResult:
    server, manager = _mcp_for(call, mcp)
    schema = manager.input_schema(server, call.tool)
    if schema is None:
        # A fresh worker process has listed nothing yet; starting the server lists its tools,
        # so the first call is validated like every later one.
        manager.connect(server)
        schema = manager.input_schema(server, call.tool)
    if schema is not None:
        validate_args(call.tool, schema, call.args)
    return manager.call_tool_result(
        server,
        call.tool,
        call.args,
        timeout=call.timeout_s,
        on_progress=on_progress,
        hooks=relay,
        stopped=stopped,
    )


class _SpareThreads:
    """Daemon threads kept for built-in tool calls. Starting a thread per call was a tenth of
    a server worker's time per task (py-spy, bench/README.md); a call that outlives its
    timeout keeps its thread until it ends (a thread cannot be killed), and the next call
    gets another. A thread is named for the tool it runs (``builtin:<tool>``)."""

    IDLE = "builtin:idle"

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []
        self._pid = os.getpid()

    def run(self, name: str, fn: Callable[[], None]) -> None:
        """Start ``fn`` (which must not raise) in a spare thread, or in a new one."""
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's threads are not here
                self._idle, self._pid = [], os.getpid()
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name=self.IDLE, daemon=True).start()
        inbox.put(functools.partial(self._named, name, fn))

    @classmethod
    def _named(cls, name: str, fn: Callable[[], None]) -> None:
        me = threading.current_thread()
        me.name = f"builtin:{name}"
        try:
            fn()
        finally:
            me.name = cls.IDLE

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            inbox.get()()
            with self._lock:
                if self._pid != os.getpid() or len(self._idle) >= self.keep:
                    return
                self._idle.append(inbox)


_SPARE = _SpareThreads()


def _run_builtin(
    tool: BuiltinTool, args: dict[str, Any], timeout: float, stopped: Stopped | None = None
) -> Any:
    """Run a tool that may block in another thread, so the timeout (and a cancel: ``stopped``)
    holds even when it does; one that cannot block (``BuiltinTool.blocks``) here."""
    name = tool.descriptor.name
    ctx = BuiltinContext(deadline=time.monotonic() + timeout)
    if not tool.blocks:
        value = tool.run(args, ctx)
        # Its answer came too late all the same: the same outcome a timeout thread gives.
        if time.monotonic() > ctx.deadline:
            raise ToolTimeout(f"tool {name!r} did not answer within {timeout:g}s", tool=name)
        return value
    outcome: dict[str, Any] = {}
    finished = threading.Event()

    def target() -> None:
        try:
            outcome["value"] = tool.run(args, ctx)
        except BaseException as exc:  # noqa: BLE001 - handed back to the waiting thread
            outcome["error"] = exc
        finally:
            finished.set()

    _SPARE.run(name, target)
    waited = wait_unless_stopped(finished.wait, timeout, stopped)
    if waited is not Waited.DONE:
        ctx.cancel.set()  # cooperative tools (sleep) stop now; others end on their own deadline
        if waited is Waited.STOPPED:
            raise stopped_error(f"tool {name!r}", tool=name)
        raise ToolTimeout(f"tool {name!r} did not answer within {timeout:g}s", tool=name)
    error = outcome.get("error")
    if isinstance(error, Exception):
        raise error
    if error is not None:  # SystemExit and friends must not end the worker from a tool's thread
        raise ToolFailed(f"tool {name!r} raised {type(error).__name__}: {error}", tool=name)
    return outcome["value"]


def validate_args(tool: str, schema: dict[str, Any], args: dict[str, Any]) -> None:
    """InvalidArguments listing every problem (``workers.argcheck`` wording, the brain's too);
    a schema that is itself invalid is not enforced."""
    validator = _validator_of(schema)
    if validator is None:
        return
    errors = list(validator.iter_errors(args))
    if errors:
        raise InvalidArguments(
            argcheck.joined(tool, argcheck.problems(errors)),
            tool=tool,
            field=argcheck.first_field(errors),
        )


# The schemas a worker validates against are the same few objects call after call (a built-in's
# descriptor, an MCP tool's listed schema, replaced whole when its server lists again): found
# by identity first, keyed by the object itself so its id cannot be reused while kept. Writing
# each one out as text to find its validator was a third of the check's cost.
_BY_IDENTITY: dict[int, tuple[dict[str, Any], Any]] = {}
_BY_IDENTITY_MAX = 256


def _validator_of(schema: dict[str, Any]) -> Any:
    found = _BY_IDENTITY.get(id(schema))
    if found is not None and found[0] is schema:
        return found[1]
    validator = _validator(json.dumps(schema, sort_keys=True))
    if len(_BY_IDENTITY) >= _BY_IDENTITY_MAX:
        _BY_IDENTITY.clear()
    _BY_IDENTITY[id(schema)] = (schema, validator)
    return validator


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    # Keyed by the schema's text: building a validator (and checking the schema) per call is the slow part.
    schema = json.loads(schema_json)
    cls = validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except schema_errors.SchemaError:
        return None  # the tool's own problem; the tool can still judge its arguments
    return cls(schema)


# Clock arithmetic in floats: 0.6 - 0.4 is a hair under 0.2, and must still earn its token.
_EPSILON = 1e-6


class Throttle:
    """An MCP server's progress notifications as ``ToolProgress``, through a token bucket: a
    short burst passes at once (``BURST`` updates: a 0/50/100 sent within 100 ms reaches the
    MCP client as three notifications, not one), then at most ``RATE`` per second (a server may
    send thousands, and each one is a store write and a tree event). Never one lost for good:
    an update with no token left waits, replaced by any later one, and the one waiting goes
    when the next token is due (a timer) or when the call ends (``flush``, before its result),
    whichever comes first. After ``flush`` nothing more is sent.

    Called on the MCP client's loop thread; the timer sends from its own thread, so sending
    happens under a lock (an older update never follows a newer one). ``later(delay, fn)``
    starts the timer and returns something with ``cancel()`` (tests give a fake clock and a
    fake timer)."""

    BURST = 5
    RATE = 5.0  # tokens per second once the burst is spent
    EVERY_S = 1 / RATE  # the gap between two updates once the burst is spent

    def __init__(
        self,
        call: ToolCall,
        sink: Callable[[ToolProgress], None],
        client_id: str | None,
        clock: Callable[[], float],
        later: Callable[[float, Callable[[], None]], Cancellable] | None = None,
    ) -> None:
        self.call, self.sink, self.client_id, self.clock = call, sink, client_id, clock
        self.later = later or _timer
        self.tokens = float(self.BURST)
        self.filled_at: float | None = None  # when ``tokens`` was last topped up
        self.pending: ToolProgress | None = None
        self.timer: Cancellable | None = None
        self.closed = False
        self._lock = threading.Lock()

    def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        now = self.clock()
        update = ToolProgress(
            run_id=self.call.run_id,
            tree_id=self.call.tree_id,
            task_id=self.call.task_id,
            progress=progress,
            total=total,
            message=message[:MAX_PROGRESS_MESSAGE_CHARS] if message else None,
            at=now,
            client_id=self.client_id,
        )
        with self._lock:
            if self.closed:
                return
            self._fill(now)
            if self.tokens >= 1 - _EPSILON and self.pending is None:
                self._send(update)
                return
            self.pending = update  # the latest wins; the timer sends it
            if self.timer is None:
                self.timer = self.later(self._wait(), self._due)

    def _fill(self, now: float) -> None:
        if self.filled_at is not None:
            self.tokens = min(float(self.BURST), self.tokens + (now - self.filled_at) * self.RATE)
        self.filled_at = now

    def _wait(self) -> float:
        """How long until the next token."""
        return max((1 - self.tokens) / self.RATE, 0.0)

    def _due(self) -> None:
        with self._lock:
            self.timer = None
            if self.closed or self.pending is None:
                return
            self._fill(self.clock())
            if self.tokens >= 1 - _EPSILON:
                self._send(self.pending)
            else:  # a timer that went off early: wait for the token
                self.timer = self.later(self._wait(), self._due)

    def flush(self) -> None:
        """The call ended: send the update still waiting, at once, and nothing after it."""
        with self._lock:
            self.closed = True
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            if self.pending is not None:
                self._send(self.pending, spend=False)

    def _send(self, update: ToolProgress, spend: bool = True) -> None:
        self.pending = None
        if spend:
            self.tokens = max(self.tokens - 1, 0.0)
        try:
            self.sink(update)
        except Exception:  # progress is best effort; the call goes on
            log.warning("progress of task %s could not be reported", update.task_id, exc_info=True)


class Cancellable(Protocol):
    def cancel(self) -> None: ...


def _timer(delay: float, fn: Callable[[], None]) -> Cancellable:
    timer = threading.Timer(delay, fn)
    timer.daemon = True
    timer.name = "vancetope-progress"
    timer.start()
    return timer


def _check_size(call: ToolCall, value: Any, whole: dict[str, Any] | None) -> None:
    """The value and the whole MCP result together must fit ``max_result_bytes``: never cut,
    refused whole, naming the biggest content block when one is what made it too big."""
    try:
        n = result_size(value, whole)
    except (TypeError, ValueError) as exc:
        raise ToolFailed(
            f"result of tool {call.tool!r} is not JSON-serialisable: {exc}", tool=call.tool
        ) from exc
    cap = call.max_result_bytes
    if n > cap:
        biggest = _biggest_block(whole)
        what = f" (its largest content block, {biggest[0]}, is {biggest[1]} bytes)" if biggest else ""
        raise ResultTooLarge(
            f"result of tool {call.tool!r} is {n} bytes{what}, over the cap of {cap} bytes "
            "(raise max_result_bytes / VANCETOPE_MAX_RESULT_BYTES, or return less)",
            tool=call.tool,
            size=n,
            cap=cap,
        )


def _compact(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _biggest_block(whole: dict[str, Any] | None) -> tuple[str, int] | None:
    blocks = (whole or {}).get("content") or []
    sized = [
        (f"#{i} {b.get('type', '?')}", len(_compact(b))) for i, b in enumerate(blocks) if isinstance(b, dict)
    ]
    return max(sized, key=lambda item: item[1]) if sized else None
