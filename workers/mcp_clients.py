"""MCP client sessions kept open for the life of a worker process (layer: workers).

One job: give synchronous callers (Celery worker threads) ``list_tools``,
``discover`` and ``call_tool`` on the configured MCP servers, reusing one live
session per server instead of spawning a server per call (spawn + initialize
costs ~1 s, a call on a live session ~2 ms).

All MCP traffic runs on one private asyncio loop in a background thread, which
anyio's blocking portal (``anyio.from_thread.start_blocking_portal``) runs and
bridges sync callers into. Each server's session is entered and exited by its own
long-lived task, because an anyio context (the SDK's task groups) must be exited by
the task that entered it.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import fcntl
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack
from typing import IO, Any, Protocol, TextIO, TypeVar, TypeVarTuple, cast

import anyio
import anyio.from_thread
import httpx2
from mcp import Client
from mcp import types as mcp_types
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED, CallToolResult, TextContent, Tool
from pydantic import ValidationError

from workers import mcp_surface, sandbox
from workers.call_relay import AskRefused
from workers.call_stop import Stopped, Waited, stopped_error, wait_unless_stopped
from workers.contracts import (
    READ_RESOURCE,
    TOOL_METADATA_FIELDS,
    MCPServerFailure,
    ResourceUpdated,
    ToolDescriptor,
    ToolType,
)
from workers.errors import MCPServerUnavailable, ToolFailed, ToolNotFound, ToolTimeout, WorkerError
from workers.masking import mask
from workers.mcp_config import MCPConfig, MCPServerSpec, StdioServerSpec, load_mcp_config
from workers.secret_refs import resolve_values
from workers.throttle import TOO_MANY_REQUESTS, throttled_data
from workers.tools.process import mcp_server_env

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")
DEFAULT_START_TIMEOUT_S = 30.0
# The SDK's stdio shutdown is bounded (2 s grace + 2 s TERM + 2 s KILL); wait a bit more.
_CLOSE_GRACE_S = 8.0
# Safety net around every cross-thread wait; the loop-side code enforces the real timeouts.
_SLACK_S = 5.0
_LIST_PAGE_CAP = 50
_TAIL_SEP = "; last stderr lines:\n"
_TAIL_READ_BYTES = 64 * 1024
# A chatty server logging to stderr for weeks must not fill the disk.
_STDERR_MAX_BYTES = 1 << 20
# Failures that mean the connection is gone, not that the call was bad.
_CONNECTION_LOST = (
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
    OSError,
    httpx2.HTTPError,
)


class _StderrLog:
    """An unlinked temp file a stdio server writes its stderr into, so errors can quote its tail."""

    def __init__(self) -> None:
        # Closed by the session that owns it, not by a with-block.
        self.file: IO[str] = tempfile.TemporaryFile("w+", encoding="utf-8", prefix="vancetope-mcp-")  # noqa: SIM115
        fd = self.file.fileno()
        # O_APPEND: the child always writes at the end, so trimming from here is safe.
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)

    def tail(self, lines: int) -> str:
        if self.file.closed:
            return ""
        fd = self.file.fileno()
        size = os.fstat(fd).st_size
        start = max(0, size - _TAIL_READ_BYTES)
        rows = os.pread(fd, size - start, start).decode("utf-8", "replace").splitlines()
        rows = rows[1:] if start else rows  # the first row may be cut
        kept = [row.rstrip() for row in rows if row.strip()]
        return "\n".join(kept[-lines:])

    def trim(self) -> None:
        fd = -1 if self.file.closed else self.file.fileno()
        if fd >= 0 and (size := os.fstat(fd).st_size) > _STDERR_MAX_BYTES:
            keep = os.pread(fd, _TAIL_READ_BYTES, size - _TAIL_READ_BYTES)
            os.ftruncate(fd, 0)
            os.write(fd, keep)

    def close(self) -> None:
        self.file.close()


class _Session:
    """One server's connection, entered and exited by its own long-lived owner task."""

    def __init__(
        self, name: str, spec: MCPServerSpec, on_updated: Callable[[str, str], None] | None = None
    ) -> None:
        self.name = name
        self.spec = spec
        # Told (server, uri) of each notifications/resources/updated (loop thread; must not block).
        self.on_updated = on_updated
        # The resource URIs this session subscribed to upstream.
        self.subscribed: set[str] = set()
        self.stderr = _StderrLog() if isinstance(spec, StdioServerSpec) else None
        self.client: Client | None = None
        self.broken = False
        # Set when the server wrote a line that is not JSON-RPC after initializing: a call in
        # flight fails at once (not at its timeout) and the next call restarts the server.
        self.garbage = asyncio.Event()
        self.garbage_error: Exception | None = None
        self._stop = asyncio.Event()
        self._scope: anyio.CancelScope | None = None
        self._task: asyncio.Task[None] | None = None
        # The hooks of each call in flight on this session (loop thread only): where the
        # server's log messages and sampling/elicitation requests go (``_only``).
        self.inflight: list[CallHooks] = []
        # The last HTTP 429 the server answered: (when, monotonic; its Retry-After data). The
        # SDK turns a 429 into a bare "Server returned an error response": a call that fails
        # after one is reported as the 429 it was (``_throttled``).
        self.too_many: tuple[float, dict[str, Any]] | None = None

    async def _on_response(self, response: httpx2.Response) -> None:
        if response.status_code == TOO_MANY_REQUESTS:
            data = throttled_data(TOO_MANY_REQUESTS, response.headers.get("retry-after"), time.time())
            self.too_many = (time.monotonic(), data)

    @property
    def usable(self) -> bool:
        return self.client is not None and not self.broken

    async def open(self, timeout: float) -> None:
        """Start the owner task and wait until the session is initialized (or failed)."""
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._own(ready, timeout), name=f"mcp-session:{self.name}")
        # shield: a cancelled caller must not cancel the future the owner settles.
        await asyncio.shield(ready)

    async def _own(self, ready: asyncio.Future[None], timeout: float) -> None:
        try:
            # One scope for the whole life: its deadline bounds startup, then is lifted.
            with anyio.CancelScope(deadline=anyio.current_time() + timeout) as scope:
                self._scope = scope
                async with AsyncExitStack() as stack:
                    transport = await self._transport(stack)
                    # The handshake-era protocol (initialize): the one in which a server may
                    # send its client requests (sampling, elicitation) and log messages while a
                    # call runs; on a 2026-07-28 connection a server's create_message/elicit has
                    # no back-channel over stdio, and logs need a per-request opt-in.
                    client = Client(
                        transport,
                        message_handler=self._on_message,
                        mode="legacy",
                        logging_callback=self._on_log,
                        sampling_callback=self._on_sampling,
                        elicitation_callback=self._on_elicitation,
                    )
                    self.client = await stack.enter_async_context(client)
                    scope.deadline = math.inf
                    _settle(ready)
                    await self._stop.wait()
            if scope.cancelled_caught:
                _settle(ready, TimeoutError(f"it did not finish initializing within {timeout:g}s"))
        except Exception as exc:  # noqa: BLE001 - handed to the waiting caller
            if ready.done():
                logger.debug("MCP session %r ended with %r", self.name, exc)
            _settle(ready, exc)
        finally:
            self.client = None
            self.broken = True
            _settle(ready, RuntimeError("the session ended before it was ready"))

    async def _transport(self, stack: AsyncExitStack) -> Any:
        spec = self.spec
        # ${vault:NAME} is resolved here, as the server starts, and only into its process
        # environment or request headers (workers.secret_refs); never into its arguments,
        # which every local user can read (workers.mcp_config refuses them there).
        where = f"MCP server {self.name!r}"
        if isinstance(spec, StdioServerSpec):
            assert self.stderr is not None
            command, args = spec.command, list(spec.args)
            if (confined := sandbox.current()) is not None:  # server side only (workers.sandbox)
                command, args = confined.wrap(command, args)
            params = StdioServerParameters(
                command=command,
                args=args,
                # The whole environment, not added to ours: no VANCETOPE_* (Redis URL, store,
                # vault key) reaches a server (workers.tools.process.mcp_server_env).
                env=mcp_server_env(resolve_values(spec.env, f"{where} env")),
                cwd=spec.cwd,
            )
            return stdio_client(params, errlog=cast(TextIO, self.stderr.file))
        headers = resolve_values(spec.headers, f"{where} headers")
        http = httpx2.AsyncClient(
            headers=headers,
            timeout=httpx2.Timeout(30.0, read=300.0),
            event_hooks={"response": [self._on_response]},
        )
        await stack.enter_async_context(http)
        return streamable_http_client(spec.url, http_client=http)

    async def _on_message(self, message: Any) -> None:
        """The SDK hands over what the transport could not parse as an Exception. Before the
        session is ready it is tolerated (a banner printed while starting); after, the server
        broke the protocol: fail what waits and restart it on the next call. Stdio only: a
        line of a local server's stdout is the whole message there (an HTTP transport's
        faults are its own, and fail their request already). A resource this session subscribed
        to changed: ``on_updated`` is told."""
        if isinstance(message, mcp_types.ResourceUpdatedNotification):
            uri = str(message.params.uri)
            if self.on_updated is not None and uri in self.subscribed:
                self.on_updated(self.name, uri)
            return
        if not isinstance(message, Exception) or self.stderr is None:
            return
        if self.client is None:
            logger.debug("MCP server %r wrote a non-JSON-RPC line while starting: %r", self.name, message)
            return
        logger.warning("MCP server %r wrote a line that is not JSON-RPC: %s", self.name, _garbage(message))
        self.garbage_error = message
        self.garbage.set()
        self.mark_broken()

    def _only(self) -> CallHooks | None:
        """The call a log message or a request of the server belongs to. The SDK's callbacks
        get no id of the request that caused them (a stdio server's notification or request
        names none), so it is the only call in flight on this session. With several in flight
        (a client agent runs calls in threads; a prefork pool child runs one at a time) it is
        none: a log message goes to no call rather than to each (another MCP session, maybe
        another conversation, would read it), and a request is refused, as guessing whose
        LLM host to ask would be worse than no answer."""
        return self.inflight[0] if len(self.inflight) == 1 else None

    async def _on_log(self, params: mcp_types.LoggingMessageNotificationParams) -> None:
        hooks = self._only()
        if hooks is None:
            logger.debug(
                "MCP server %r logged with %d calls in flight: not passed on", self.name, len(self.inflight)
            )
            return
        hooks.log(params.level, params.logger, params.data)

    async def _on_sampling(
        self, context: Any, params: mcp_types.CreateMessageRequestParams
    ) -> mcp_types.CreateMessageResult | mcp_types.CreateMessageResultWithTools | mcp_types.ErrorData:
        model: type[mcp_types.CreateMessageResult | mcp_types.CreateMessageResultWithTools] = (
            mcp_types.CreateMessageResultWithTools if params.tools else mcp_types.CreateMessageResult
        )
        return await self._ask("sampling", params, model)

    async def _on_elicitation(
        self, context: Any, params: mcp_types.ElicitRequestParams
    ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
        return await self._ask("elicitation", params, mcp_types.ElicitResult)

    async def _ask(self, kind: Any, params: Any, model: Any) -> Any:
        hooks = self._only()
        if hooks is None and self.inflight and not any(h.interactive for h in self.inflight):
            # Whichever call asked, none has an MCP client to ask: say so, as for one call.
            tools = sorted({h.tool for h in self.inflight})
            if len(tools) == 1:
                hooks = self.inflight[0]
            else:
                what = "sampling" if kind == "sampling" else "elicitation"
                return mcp_types.ErrorData(
                    code=mcp_types.INVALID_REQUEST,
                    message=f"{what} is not available to calls from task trees: the calls of tools "
                    f"{', '.join(map(repr, tools))} in flight on MCP server {self.name!r} come from "
                    "trees, and no MCP client waits for them; call the tool through the MCP gateway to use it",
                )
        if hooks is None:
            return mcp_types.ErrorData(
                code=mcp_types.INVALID_REQUEST,
                message=f"{kind} refused: MCP server {self.name!r} asked with "
                f"{len(self.inflight) or 'no'} calls in flight on its session, so whose MCP client to ask is unknown",
            )
        try:
            result = await hooks.ask(kind, params.model_dump(mode="json", by_alias=True, exclude_none=True))
            return model.model_validate(result)
        except AskRefused as exc:
            return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message=str(exc))
        except ValidationError as exc:
            return mcp_types.ErrorData(
                code=mcp_types.INTERNAL_ERROR,
                message=f"{kind} for tool {hooks.tool!r}: the MCP client's answer is not valid: {exc.errors()[0]['msg']}",
            )

    def tail(self, lines: int) -> str:
        return self.stderr.tail(lines) if self.stderr is not None else ""

    def mark_broken(self) -> None:
        """Stop using this session; its owner task unwinds (and reaps the process) in the background."""
        self.broken = True
        self._stop.set()

    async def close(self, grace: float) -> None:
        self.mark_broken()
        task = self._task
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=grace)
            if not task.done() and self._scope is not None:
                self._scope.cancel()
                await asyncio.wait({task}, timeout=grace)
        if self.stderr is not None:
            self.stderr.close()


def _log_sink_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.warning("passing on a resources/updated failed: %s", future.exception())


def _settle(future: asyncio.Future[None], exc: BaseException | None = None) -> None:
    if not future.done():
        future.set_result(None) if exc is None else future.set_exception(exc)


class _ProtocolGarbage(Exception):
    """The server wrote a non-JSON-RPC line while a call waited for its answer."""


_GARBAGE_SHOWN = 300


async def _unless_garbage(session: _Session, tool: str, call: Coroutine[Any, Any, _T]) -> _T:
    """``call``'s result, or _ProtocolGarbage as soon as the server writes protocol garbage
    (the SDK drops such a line and would let the call wait for its timeout)."""
    running = asyncio.ensure_future(call)
    garbage = asyncio.ensure_future(session.garbage.wait())
    try:
        await asyncio.wait({running, garbage}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (running, garbage):
            if not task.done():
                task.cancel()
    if running.done() and not running.cancelled():
        return running.result()
    what = _garbage(session.garbage_error)
    raise _ProtocolGarbage(
        mask(
            f"tool {tool!r} on MCP server {session.name!r}: the server wrote a reply that is not JSON-RPC "
            f"({what}); the call failed at once and the server is restarted on the next call"
        )
    )


def _garbage(exc: Exception | None) -> str:
    """What the server wrote and why it is not JSON-RPC, on one line (pydantic's error, or
    whatever the transport raised, without its help links)."""
    if isinstance(exc, ValidationError) and exc.errors():
        err = exc.errors()[0]
        return f"{err['msg']}; it wrote {str(err.get('input', ''))[:_GARBAGE_SHOWN]!r}"
    return " ".join(_describe(exc).split())[:_GARBAGE_SHOWN] if exc is not None else "unreadable output"


def _describe(exc: BaseException) -> str:
    """A one-line reason, looking inside the SDK's exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(dict.fromkeys(_describe(inner) for inner in exc.exceptions))
    if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED:
        return "it exited or closed the connection"
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"command not found: {exc.filename}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


ProgressSink = Callable[[float, "float | None", "str | None"], None]


def _throttled(session: _Session, tool: str, began: float) -> ToolFailed | None:
    """The failure of a call during which its server answered HTTP 429 (None: it did not):
    the status and Retry-After in its data, which pause the server's budget and let the
    retry policy count it as unavailable (``workers.throttle``)."""
    seen = session.too_many
    if seen is None or seen[0] < began:
        return None
    data = seen[1]
    after = f" (Retry-After: {data['retry_after_s']:g}s)" if "retry_after_s" in data else ""
    message = f"MCP server {session.name!r} answered HTTP 429 Too Many Requests{after}"
    return ToolFailed(message, server=session.name, tool=tool, **data)


class CallHooks(Protocol):
    """Where one call's server log messages and requests go (``workers.call_relay.CallRelay``).
    ``log`` runs on the loop thread (quick, never raising); ``ask`` returns the MCP client's
    result as JSON or raises AskRefused."""

    tool: str
    interactive: bool  # a gateway call: an MCP client waits for it

    def log(self, level: Any, logger: str | None, data: Any) -> None: ...

    async def ask(self, kind: Any, params: dict[str, Any]) -> dict[str, Any]: ...


class _NoHooks:
    """A call nobody relays for (``call_tool`` without hooks): it still counts as in flight, so
    another call's hooks never get its server's messages."""

    def __init__(self, tool: str) -> None:
        self.tool = tool
        self.interactive = False

    def log(self, level: Any, logger: str | None, data: Any) -> None:
        return None

    async def ask(self, kind: Any, params: dict[str, Any]) -> dict[str, Any]:
        raise AskRefused(f"{kind} refused: nothing passes the requests of tool {self.tool!r} on")


def _progress_callback(sink: ProgressSink | None) -> Any:
    """The SDK's async progress callback around a plain function; None when nobody listens
    (then no progress token is sent and the server sends no notifications)."""
    if sink is None:
        return None

    async def callback(progress: float, total: float | None, message: str | None) -> None:
        try:
            sink(progress, total, message)
        except Exception:  # a progress report must never fail the call
            logger.warning("recording a progress notification failed", exc_info=True)

    return callback


def whole_result(result: CallToolResult) -> dict[str, Any]:
    """The result as the MCP specification spells it in JSON (``content`` with every block:
    text, image, audio, resource_link, embedded resource; ``structuredContent``; ``isError``):
    what a task record keeps beside the convenient value, on both routes alike."""
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def value_of(whole: dict[str, Any]) -> Any:
    """``tool_value`` of a whole result kept as JSON (what a worker sent); ValueError if it is
    not a CallToolResult (a client agent sends what it likes)."""
    try:
        return tool_value(CallToolResult.model_validate(whole))
    except ValidationError as exc:
        raise ValueError(f"not an MCP CallToolResult: {exc.errors()[0]['msg']}") from None


def tool_value(result: CallToolResult) -> Any:
    """The convenient value ``${tasks.<id>.result}`` gives: structured_content (a lone
    ``{"result": x}`` unwrapped to x), else the text blocks joined, else (no text at all)
    the blocks themselves. The whole result is kept beside it (``whole_result``)."""
    structured = result.structured_content
    if structured is not None:
        if isinstance(structured, dict) and set(structured) == {"result"}:
            return structured["result"]
        return structured
    if _text(result) or not result.content:
        return _text(result)
    # No text at all (images, resources): keep the blocks rather than return "".
    return [block.model_dump(mode="json", exclude_none=True) for block in result.content]


def _text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


def _descriptor(server: str, tool: Tool) -> ToolDescriptor:
    """A listed tool as the server described it: every field it sent (title, annotations,
    icons, outputSchema, execution, _meta) kept for the gateway. Metadata the SDK parsed but
    that does not validate again is left out, with a warning; the tool itself stays."""
    head: dict[str, Any] = {
        "name": tool.name,
        "type": ToolType.MCP,
        "mcp_server": server,
        "description": tool.description or "",
        "input_schema": tool.input_schema or {"type": "object"},
    }
    wire = tool.model_dump(mode="json", by_alias=True, exclude_none=True)
    extra = {name: wire[key] for name, key in TOOL_METADATA_FIELDS.items() if key in wire}
    try:
        return ToolDescriptor(**head, **extra)
    except ValidationError as exc:
        if not extra:
            raise
        logger.warning("MCP server %r: the metadata of tool %r is left out: %s", server, tool.name, exc)
        return ToolDescriptor(**head)


class MCPClientManager:
    """Live MCP sessions for one process. Thread-safe; create one per process (see ``get_manager``)."""

    def __init__(
        self,
        config: MCPConfig,
        *,
        stderr_tail_lines: int = 20,
        start_timeout: float = DEFAULT_START_TIMEOUT_S,
    ) -> None:
        self.config = config
        self._tail_lines = stderr_tail_lines
        self._start_timeout = start_timeout
        self._pid = os.getpid()
        # Touched only on the loop thread:
        self._sessions: dict[str, _Session] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # Written on the loop thread, read by callers:
        self._tools: dict[str, dict[str, ToolDescriptor]] = {}
        self._tools_lock = threading.Lock()
        self._closed = False
        self._close_lock = threading.Lock()
        # Where an upstream notifications/resources/updated goes (a server pool publishes it, a
        # client agent sends it to its outbox); None: nowhere. Called on a thread of its own.
        self.resource_sink: Callable[[ResourceUpdated], None] | None = None
        # server -> the URIs subscribed to (loop thread): subscribed again on a restarted session.
        self._wanted: dict[str, set[str]] = {}
        # One thread: changes are passed on in the order the servers said them.
        self._sink_thread = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="vancetope-mcp-updates"
        )
        # The loop thread: anyio runs an asyncio loop in it and takes calls from any thread.
        self._portal_cm = anyio.from_thread.start_blocking_portal("asyncio")
        self._portal = self._portal_cm.__enter__()
        self._thread: threading.Thread = self._portal.call(threading.current_thread)
        self._thread.name = "vancetope-mcp-loop"

    # --- public sync API ---------------------------------------------------------

    def list_tools(self, server: str, timeout: float) -> list[ToolDescriptor]:
        """The server's tools; starts the server if needed (start and listing each bounded by timeout)."""
        self._spec(server)
        return self._submit(2 * timeout, self._list_tools, server, timeout)

    def discover(self, timeout: float) -> tuple[list[ToolDescriptor], list[MCPServerFailure]]:
        """Every server's tools, listed concurrently; a failing server is reported, not raised."""
        return self._submit(2 * timeout, self._discover, timeout)

    def call_tool(self, server: str, tool: str, args: dict[str, Any], timeout: float) -> Any:
        """Call one tool and return its convenient value (``tool_value``)."""
        return tool_value(self.call_tool_result(server, tool, args, timeout))

    def call_tool_result(
        self,
        server: str,
        tool: str,
        args: dict[str, Any],
        timeout: float,
        on_progress: ProgressSink | None = None,
        hooks: CallHooks | None = None,
        stopped: Stopped | None = None,
    ) -> CallToolResult:
        """Call one tool and return the server's whole ``CallToolResult``; ToolFailed if the
        server marked it an error. ``timeout`` bounds the call, start_timeout a (re)start.
        ``on_progress(progress, total, message)`` gets the server's progress notifications
        (on the manager's loop thread: it must be quick and not block); ``hooks`` its log
        messages and sampling/elicitation requests (without: logs dropped, requests refused);
        ``stopped`` is asked while the call runs whether its task was cancelled (``Cancelled``)."""
        self._spec(server)
        return self._submit(
            self._start_timeout + 2 * timeout,
            self._call,
            server,
            tool,
            args,
            timeout,
            on_progress,
            hooks,
            stopped=stopped,
            what=f"tool {tool!r} on MCP server {server!r}",
        )

    def surface_request(
        self, server: str, op: str, args: dict[str, Any], timeout: float, stopped: Stopped | None = None
    ) -> dict[str, Any]:
        """One resources/read, prompts/get or completion/complete (``op``: a surface op of
        ``workers.contracts``) on ``server``; the result's JSON. ToolFailed carries the
        server's JSON-RPC error code (e.g. -32002, resource not found)."""
        self._spec(server)
        return self._submit(
            self._start_timeout + 2 * timeout,
            self._surface,
            server,
            op,
            args,
            timeout,
            stopped=stopped,
            what=f"{op} on MCP server {server!r}",
        )

    def connect(self, server: str) -> None:
        """Start the server now if it is not running (bounded by start_timeout), which also lists its tools."""
        self._spec(server)
        self._submit(self._start_timeout, self._session, server, self._start_timeout)

    def input_schema(self, server: str, tool: str) -> dict[str, Any] | None:
        """The tool's input schema if this process has listed the server's tools, else None."""
        with self._tools_lock:
            descriptor = self._tools.get(server, {}).get(tool)
        return None if descriptor is None else descriptor.input_schema

    def close(self, timeout: float = 20.0) -> None:
        """Stop every session and server process, then the loop thread. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if os.getpid() != self._pid:
            return  # a forked copy: the sessions and thread belong to the parent
        if self._thread.is_alive():
            try:
                self._portal.start_task_soon(self._close_all).result(timeout)
            except Exception:
                logger.warning("closing MCP sessions did not finish cleanly", exc_info=True)
            # Stop the portal, cancelling whatever still runs; its loop then cancels stray
            # tasks and closes async generators on the way out.
            with contextlib.suppress(Exception):
                self._portal.start_task_soon(self._portal.stop, True).result(timeout)
            self._thread.join(timeout)
        self._sink_thread.shutdown(wait=False, cancel_futures=True)
        if self._thread.is_alive():
            logger.warning("the MCP client loop thread did not stop within %gs", timeout)
        else:
            self._portal_cm.__exit__(None, None, None)  # joins the (finished) thread

    # --- plumbing ------------------------------------------------------------------

    def adopt_subscriptions(self, previous: MCPClientManager, timeout: float) -> None:
        """A reload replaced ``previous`` (a client agent's mcp.json edited): what gateway
        sessions subscribed to there is subscribed to here, on each server this config still
        has (at once where its session is open, else when it opens), so their changes keep
        coming. A subscription that fails is logged; the rest go on."""
        try:
            wanted = previous._submit(timeout, previous._subscriptions)
        except WorkerError:
            return  # closed already: nothing to carry over
        if not wanted:
            return
        try:
            self._submit(timeout * (1 + sum(map(len, wanted.values()))), self._adopt, wanted, timeout)
        except WorkerError as exc:  # the reload goes on; its sessions subscribe again when they open
            logger.warning("carrying the resource subscriptions over to the reloaded servers failed: %s", exc)

    async def _subscriptions(self) -> dict[str, set[str]]:
        return {server: set(uris) for server, uris in self._wanted.items()}

    async def _adopt(self, wanted: dict[str, set[str]], timeout: float) -> None:
        for server, uris in sorted(wanted.items()):
            if server not in self.config.servers:
                continue
            self._wanted.setdefault(server, set()).update(uris)
            session = self._sessions.get(server)
            if session is None or not session.usable:
                continue  # subscribed when it opens (_session)
            await self._subscribe_again(session, uris, timeout)

    def _spec(self, server: str) -> MCPServerSpec:
        spec = self.config.servers.get(server)
        if spec is None:
            known = ", ".join(sorted(self.config.servers)) or "none"
            raise ToolNotFound(
                f"no MCP server named {server!r} in {self.config.source} (configured: {known})", server=server
            )
        return spec

    def _submit(
        self,
        budget: float,
        func: Callable[[*_Ts], Awaitable[_T]],
        *args: *_Ts,
        stopped: Stopped | None = None,
        what: str = "the MCP request",
    ) -> _T:
        """``func(*args)`` on the loop thread; its result here. Cancelled on the loop when the
        wait gives up, or when ``stopped`` says the call's task was cancelled (the portal's
        future cancels the task; the SDK then sends the server ``notifications/cancelled``)."""
        closed = MCPServerUnavailable("the MCP client manager is closed", server="", stderr_tail="")
        if self._closed or os.getpid() != self._pid:
            raise closed
        try:
            future = self._portal.start_task_soon(func, *args)
        except RuntimeError:  # the portal stopped between the check and here
            raise closed from None
        waited = wait_unless_stopped(
            lambda seconds: bool(concurrent.futures.wait([future], seconds).done), budget + _SLACK_S, stopped
        )
        if not future.done():
            future.cancel()
            if waited is Waited.STOPPED:
                raise stopped_error(what)
            raise ToolTimeout(f"the MCP client loop did not answer within {budget + _SLACK_S:g}s")
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            during = "the MCP client manager closed during the call"
            raise MCPServerUnavailable(during, server="", stderr_tail="") from None

    async def _session(self, server: str, start_timeout: float) -> _Session:
        """The live session, (re)starting the server once if there is none or it died."""
        current = self._sessions.get(server)
        if current is not None and current.usable:
            return current
        async with self._locks.setdefault(server, asyncio.Lock()):
            current = self._sessions.get(server)
            if current is not None and current.usable:
                return current
            if current is not None:
                await current.close(_CLOSE_GRACE_S)
            fresh = self._sessions[server] = _Session(server, self._spec(server), self._updated)
            try:
                await fresh.open(start_timeout)
            except Exception as exc:  # noqa: BLE001 - every start failure means the same to callers
                raise self._unavailable(fresh, "could not start", exc) from None
            with contextlib.suppress(WorkerError):
                await self._list(fresh, start_timeout)  # for argument validation; not essential
            await self._subscribe_again(fresh, self._wanted.get(server, set()), start_timeout)
            return fresh

    def _unavailable(self, session: _Session, what: str, exc: BaseException) -> MCPServerUnavailable:
        tail = mask(session.tail(self._tail_lines))
        summary = mask(f"MCP server {session.name!r} ({session.spec.describe()}) {what}: {_describe(exc)}")
        message = f"{summary}{_TAIL_SEP}{tail}" if tail else summary
        return MCPServerUnavailable(message, server=session.name, stderr_tail=tail)

    async def _list(self, session: _Session, timeout: float) -> list[ToolDescriptor]:
        client = session.client
        if client is None:
            raise self._unavailable(session, "is not connected", RuntimeError("session closed"))
        tools: list[Any] = []
        cursor: str | None = None
        try:
            with anyio.fail_after(timeout):
                for _ in range(_LIST_PAGE_CAP):
                    page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if cursor is None:
                        break
        except TimeoutError:
            raise ToolTimeout(
                f"MCP server {session.name!r} did not list its tools within {timeout:g}s"
            ) from None
        except Exception as exc:
            raise self._call_error(session, "tools/list", exc) from exc
        descriptors = [_descriptor(session.name, t) for t in tools]
        with self._tools_lock:
            self._tools[session.name] = {d.name: d for d in descriptors}
        return descriptors

    def _call_error(self, session: _Session, tool: str, exc: Exception) -> WorkerError:
        lost = (
            exc.code == CONNECTION_CLOSED if isinstance(exc, MCPError) else isinstance(exc, _CONNECTION_LOST)
        )
        if lost:
            session.mark_broken()
            return self._unavailable(session, "died or dropped the connection", exc)
        if isinstance(exc, MCPError):
            return ToolFailed(exc.message, server=session.name, tool=tool, code=exc.code)
        return ToolFailed(_describe(exc), server=session.name, tool=tool)

    async def _list_tools(self, server: str, timeout: float) -> list[ToolDescriptor]:
        """Its tools, then what it offers beside them (resources, prompts, completion) as the
        surface tools that route them (``workers.mcp_surface``)."""
        session = await self._session(server, timeout)
        tools = await self._list(session, timeout)
        client = session.client
        if client is None:
            raise self._unavailable(session, "is not connected", RuntimeError("session closed"))
        try:
            with anyio.fail_after(timeout):
                return tools + await mcp_surface.list_surface(session.name, client)
        except TimeoutError:
            raise ToolTimeout(
                f"MCP server {session.name!r} did not list its resources and prompts within {timeout:g}s"
            ) from None
        except Exception as exc:
            raise self._call_error(session, "resources/list", exc) from exc

    async def _surface(self, server: str, op: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
        session = await self._session(server, self._start_timeout)
        client = session.client
        if client is None:
            raise self._unavailable(session, "is not connected", RuntimeError("session closed"))
        try:
            with anyio.fail_after(timeout):
                if op == READ_RESOURCE and args.get("subscribe") is True:
                    await self._subscribe(session, str(args["uri"]), timeout)
                return await mcp_surface.request(server, client, op, args)
        except TimeoutError:
            raise ToolTimeout(
                f"{op} on MCP server {server!r} did not answer within {timeout:g}s", server=server, tool=op
            ) from None
        except WorkerError:
            raise
        except Exception as exc:
            raise self._call_error(session, op, exc) from exc

    async def _subscribe(self, session: _Session, uri: str, timeout: float) -> None:
        """resources/subscribe to ``uri`` on the session, once, if the server declares it can;
        kept for the life of the session (and the process: a restarted session subscribes
        again). The process may be one of several that run the server's calls (a prefork pool),
        so an unsubscribe could not be sent to the session that holds it: none is."""
        client = session.client
        caps = client.server_capabilities.resources if client is not None else None
        if client is None or caps is None or not caps.subscribe or uri in session.subscribed:
            return
        # The request Client.subscribe_resource sends, without its deprecation warning: these
        # sessions speak the handshake-era protocol (mode="legacy"), in which this is the way
        # to hear of a resource's changes (the SDK calls it removed as of 2026-07-28).
        request = mcp_types.SubscribeRequest(params=mcp_types.SubscribeRequestParams(uri=uri))
        with anyio.fail_after(timeout):
            await client.session.send_request(request, mcp_types.EmptyResult)
        session.subscribed.add(uri)
        self._wanted.setdefault(session.name, set()).add(uri)

    async def _subscribe_again(self, session: _Session, uris: set[str], timeout: float) -> None:
        """``_subscribe`` to each of ``uris`` (a restarted session, or a reload's new one); one
        that fails is logged: a lost subscription must not fail the call or stop the others."""
        for uri in sorted(uris):
            try:
                await self._subscribe(session, uri, timeout)
            except Exception as exc:  # noqa: BLE001 - said in the log, the rest go on
                logger.warning("MCP server %r: subscribing again to %r failed: %s", session.name, uri, exc)

    def _updated(self, server: str, uri: str) -> None:
        """An upstream resource changed: to ``resource_sink`` on a thread of its own (it writes
        to Redis), so the session's message loop never waits on it, in order."""
        sink = self.resource_sink
        if sink is None:
            logger.debug("MCP server %r: resource %r changed; nowhere to tell", server, uri)
            return
        try:
            update = ResourceUpdated(server=server, uri=uri)
        except ValidationError as exc:
            logger.warning(
                "MCP server %r: a resources/updated not passed on (%s)", server, exc.errors()[0]["msg"]
            )
            return
        future = asyncio.get_running_loop().run_in_executor(self._sink_thread, sink, update)
        future.add_done_callback(_log_sink_failure)

    async def _discover(self, timeout: float) -> tuple[list[ToolDescriptor], list[MCPServerFailure]]:
        names = list(self.config.servers)
        outcomes = await asyncio.gather(
            *(self._list_tools(n, timeout) for n in names), return_exceptions=True
        )
        tools: list[ToolDescriptor] = []
        failures: list[MCPServerFailure] = []
        for name, outcome in zip(names, outcomes, strict=True):
            if isinstance(outcome, list):
                tools.extend(outcome)
            elif isinstance(outcome, WorkerError):
                # The tail has its own field; keep the message to the one-line summary.
                summary = outcome.message.split(_TAIL_SEP, 1)[0]
                tail = outcome.data.get("stderr_tail", "")
                failures.append(MCPServerFailure(server=name, message=summary, stderr_tail=tail))
            elif isinstance(outcome, Exception):
                failures.append(MCPServerFailure(server=name, message=mask(_describe(outcome))))
            else:
                raise outcome
        return tools, failures

    async def _call(
        self,
        server: str,
        tool: str,
        args: dict[str, Any],
        timeout: float,
        on_progress: ProgressSink | None = None,
        hooks: CallHooks | None = None,
    ) -> CallToolResult:
        session = await self._session(server, self._start_timeout)
        await self._require_tool(session, tool, timeout)
        client = session.client
        if client is None:
            raise self._unavailable(session, "is not connected", RuntimeError("session closed"))
        mine = hooks or _NoHooks(tool)
        session.inflight.append(mine)
        began = time.monotonic()
        try:
            with anyio.fail_after(timeout):
                result = await _unless_garbage(
                    session,
                    tool,
                    client.call_tool(tool, args, progress_callback=_progress_callback(on_progress)),
                )
        except _ProtocolGarbage as exc:
            raise ToolFailed(str(exc), server=server, tool=tool) from None
        except TimeoutError:
            raise ToolTimeout(
                f"tool {tool!r} on MCP server {server!r} did not answer within {timeout:g}s",
                server=server,
                tool=tool,
            ) from None
        except Exception as exc:
            raise _throttled(session, tool, began) or self._call_error(session, tool, exc) from exc
        finally:
            session.inflight.remove(mine)
            if session.stderr is not None:
                session.stderr.trim()
        if result.is_error:
            message = _text(result) or "the tool reported an error without a message"
            raise ToolFailed(message, server=server, tool=tool)
        return result

    async def _require_tool(self, session: _Session, tool: str, timeout: float) -> None:
        """ToolNotFound when the listing lacks the tool, after one refresh (the listing may be stale)."""
        with self._tools_lock:
            known = self._tools.get(session.name)
        if known is None or tool in known:
            return
        names = {d.name for d in await self._list(session, timeout)}
        if tool not in names:
            raise ToolNotFound(
                f"MCP server {session.name!r} has no tool {tool!r} (it has: {', '.join(sorted(names)) or 'none'})",
                server=session.name,
                tool=tool,
            )

    async def _close_all(self) -> None:
        sessions = list(self._sessions.values())
        self._sessions.clear()
        await asyncio.gather(*(s.close(_CLOSE_GRACE_S) for s in sessions))


# --- one manager per process -------------------------------------------------------

_signatures: dict[tuple[int, str], tuple[int, int]] = {}
_managers: dict[tuple[int, str], MCPClientManager] = {}
_managers_lock = threading.Lock()
# Managers inherited over fork: never used or closed here, only kept from the GC.
_inherited: list[MCPClientManager] = []


def get_manager(config_path: str | None) -> MCPClientManager | None:
    """This process's manager for ``config_path`` (None: no MCP servers).

    Keyed by pid: a Celery prefork child gets its own manager (its own loop
    thread and server subprocesses) on first use, never the parent's. When the file
    changes (size or mtime), the next call gets a manager of the new config and the old
    one is closed: a prefork child runs one call at a time, so none is using it. A new
    file that does not load is logged and the manager in use is kept.
    """
    if not config_path:
        return None
    key = (os.getpid(), os.path.abspath(config_path))
    seen = _file_signature(config_path)
    with _managers_lock:
        current = _managers.get(key)
        if current is not None and _signatures.get(key) == seen:
            return current
        try:
            fresh = MCPClientManager(load_mcp_config(config_path))
        except WorkerError as exc:
            if current is None:
                raise
            logger.error(
                "MCP config %s changed but does not load; keeping the servers in use: %s", config_path, exc
            )
            _signatures[key] = seen
            return current
        _managers[key], _signatures[key] = fresh, seen
    if current is not None:
        logger.warning(
            "MCP config %s changed: its servers are restarted with the new definitions", config_path
        )
        current.close()
    return fresh


def _file_signature(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0)
    return (st.st_mtime_ns, st.st_size)


def _close_own_managers() -> None:
    pid = os.getpid()
    with _managers_lock:
        own = [m for (owner, _), m in _managers.items() if owner == pid]
    for manager in own:
        manager.close()


def _after_fork_in_child() -> None:
    global _managers_lock
    # The parent's lock may have been held by another thread at fork time.
    _managers_lock = threading.Lock()
    _inherited.extend(_managers.values())
    _managers.clear()


atexit.register(_close_own_managers)
os.register_at_fork(after_in_child=_after_fork_in_child)
