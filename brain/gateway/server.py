"""The gateway's MCP server (layer: brain/gateway, SDK glue): the official SDK's low-level
``Server`` behind its streamable-HTTP session manager at ``/mcp``, with the SDK's bearer-token
middleware in front (no valid token: 401, nothing served) and a watcher that sends
``list_changed`` (tools, resources, prompts) to a user's sessions when what the user sees
changes: one of the user's clients connects, leaves or announces other tools (an mcp.json
edited, a held tool approved), or the registry reloads.

Resources, prompts and completion of the brain's MCP servers and of the user's clients' are
served too, routed like tool calls (``brain.gateway.surface``): a read is a one-task tree of
the surface tool ``<server>#read_resource``, so it runs where that server runs, with the same
offline rules; its failure is a protocol error (these requests have no error results).
A ``resources/subscribe`` is kept per session and routed like a read, with ``subscribe``: the
process that holds the upstream session (a pool worker, or the user's client agent) subscribes
upstream when the server declares ``resources.subscribe``, and keeps that subscription for the
life of its session (an unsubscribe only stops this gateway telling the session). What the
server then says (``notifications/resources/updated``) comes back on a pub/sub channel, from a
pool directly, from a client agent through its outbox and the brain, which stamps it with
the client it came from; the gateway sends it, under the same URI, to each session that
subscribed to it and whose user's catalog says the server is that sender's (``relay_update``).
A 2026-07-28 client's listen stream that asks for resource URIs subscribes upstream the same
way while it lasts, and hears of them through its user's bus.

Handlers decide nothing themselves: ``catalog``/``pools`` say what a user sees, ``backend``
submits and reads (in worker threads), ``results`` turns a task record into a result.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
import redis
import redis.asyncio
from mcp import types
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.provider import AccessToken
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.server.streamable_http_manager import (
    DEFAULT_SESSION_IDLE_TIMEOUT,
    StreamableHTTPASGIApp,
    StreamableHTTPSessionManager,
)
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ToolsListChanged,
)
from mcp.server.subscriptions import ResourceUpdated as ResourceChanged
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.routing import Route

from brain.core.models import TaskRecord, TaskState
from brain.core.resource_updates import DropCounts, Dropped, parse_update, subscribers
from brain.core.transitions import QUEUED
from brain.errors import BrainError, InvalidTaskTree
from brain.gateway.backend import (
    CALL_TASK,
    Caller,
    GatewayBackend,
    Refused,
    Submitted,
    UnknownTool,
    UserView,
    call_run_id,
)
from brain.gateway.call_events import CallEvents, SessionLevels
from brain.gateway.catalog import GatewayTool, UserState
from brain.gateway.pools import pool_detail, pool_summary, resolve, search
from brain.gateway.primary import LIST_POOLS, PRIMARY, SPECIALIZED_CMD
from brain.gateway.results import (
    RESOURCE_NOT_FOUND,
    final_result,
    queued_result,
    surface_value,
    text_result,
    value_result,
    waited_result,
)
from brain.runtime.gateway_door import DoorRefused
from workers.contracts import (
    READ_RESOURCE,
    channel_resource_updates,
    channel_tree_events,
    surface_tool,
    tool_metadata,
)
from workers.redis_connect import async_redis_client

log = logging.getLogger("vancetope.gateway")
# The gateway serves handshake-era clients too: logging/setLevel, notifications/message,
# sampling and elicitation are theirs (the SDK calls them deprecated as of 2026-07-28).
warnings.filterwarnings("ignore", category=MCPDeprecationWarning, module=r"brain\.gateway\.")

MCP_PATH = "/mcp"
# How often the watcher compares what each user sees (one HGETALL + one GET, then each watched
# user's catalog, computed in memory).
WATCH_INTERVAL_S = 1.0
# Resource URIs of one listen stream subscribed to upstream (each one is a routed read).
MAX_LISTENED_URIS = 64
# Between two reads of a call's record when no tree event woke the wait.
POLL_S = 0.5
# How long the end of a call waits for the next message of its tree, while there are some: what
# was published before the result (progress, log messages) is still arriving.
DRAIN_S = 0.02
INSTRUCTIONS = (
    "Vancetope routes each tool call to where it can run: the server's worker pool or one of your "
    "own workstations (client agents). Tools of a workstation come and go with it. When the list "
    "holds brain_specialized_cmd, most tools sit in pools: brain_list_pools lists and searches them."
)
_PRIMARY_NAMES = frozenset(t.name for t in PRIMARY)


class TokenVerifier:
    """The SDK's ``TokenVerifier`` over the store's gateway tokens: the principal is the user."""

    def __init__(self, backend: GatewayBackend) -> None:
        self.backend = backend

    async def verify_token(self, token: str) -> AccessToken | None:
        user = await anyio.to_thread.run_sync(self.backend.user_of, token)
        if user is None:
            return None
        return AccessToken(token=token, client_id=f"vancetope-user:{user}", scopes=[], subject=user)


@dataclass
class _Seen:
    session: ServerSession
    at: float


@dataclass
class Watch:
    """The last state the watcher saw, and each user's sessions to tell about changes."""

    loaded_at: float | None = None
    per_user: dict[str, UserState] = field(default_factory=dict)
    # client id -> its user, for the clients connected at the last look (from ``per_user``)
    client_users: dict[str, str] = field(default_factory=dict)
    # user -> MCP session id -> the session (handshake-era clients: notifications on its GET stream)
    sessions: dict[str, dict[str, _Seen]] = field(default_factory=dict)
    # user -> the bus of its subscriptions/listen streams (2026-07-28 clients)
    buses: dict[str, InMemorySubscriptionBus] = field(default_factory=dict)
    listeners: dict[str, ListenHandler] = field(default_factory=dict)
    # MCP session id -> the resource URIs it subscribed to -> the surface tool that reads each
    subscribed: dict[str, dict[str, str]] = field(default_factory=dict)
    # user -> listen stream -> the resource URIs it asked for -> the surface tool that reads each
    listened: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)


def changed_users(
    before: tuple[float | None, dict[str, UserState]],
    after: tuple[float, dict[str, UserState]],
    users: set[str],
) -> set[str]:
    """Users (of ``users``) whose tools may have changed: all on a registry reload, else those
    one of whose clients connected, left or reconnected, or whose catalog changed (a client
    announcing other tools in the same session, a held tool approved); nobody on the first
    look. A user not looked at before (a new MCP session) is told only if a client of theirs
    is connected now: their first tools/list is newer than anything else. Pure."""
    if before[0] is None:
        return set()
    if before[0] != after[0]:
        return set(users)
    told = set()
    for user in users:
        was, now = before[1].get(user), after[1].get(user)
        if was is None:
            if now is not None and now[0]:
                told.add(user)
        elif was != now:
            told.add(user)
    return told


def _session_id(ctx: ServerRequestContext[Any, Any]) -> str:
    request = ctx.request
    return (request.headers.get("mcp-session-id") if request is not None else None) or ""


def unknown_resource(uri: str, offline: tuple[str, ...]) -> str:
    """Why a read of ``uri`` goes nowhere, naming the user's clients that are offline: the
    resource may be on one of them."""
    text = (
        f"resource {uri!r} is not offered by any MCP server of yours that is reachable now (the "
        "brain's, or your connected clients'): resources/list shows what is"
    )
    if offline:
        names = ", ".join(repr(c) for c in offline)
        text += (
            f". Your client(s) {names} are offline: if it is on one of them, start its client agent "
            "and ask again (declare <server>#read_resource in the registry with location client to "
            "have reads wait or park instead)"
        )
    return text


def call_problems(exc: InvalidTaskTree) -> str:
    """The problems of a refused one-task call, without the tree around it: ``args.a: '2' is not
    of type 'integer'; args: 'b' is a required property``."""
    prefix = f"task {CALL_TASK!r}: "
    return "; ".join(p.removeprefix(prefix) for p in exc.problems)


def mcp_tool(tool: GatewayTool) -> types.Tool:
    """A catalog tool as tools/list shows it: every field its MCP server sent (annotations,
    title, icons, outputSchema, execution, _meta), not only name, description and schema."""
    return types.Tool.model_validate(
        {
            "name": tool.name,
            "description": tool.description or None,
            "inputSchema": tool.input_schema,
            **tool_metadata(tool),
        }
    )


@dataclass(frozen=True)
class Ended:
    """How a routed call ended: ``final`` (its record is in a final state), ``queued`` (parked
    as pending_client under offline_strategy queue) or ``waited`` (blocked past its wait)."""

    kind: str
    rec: TaskRecord


class _GatewayServer(Server[Any]):
    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        # The tool list changes with the user's clients: say so (tools.listChanged).
        return super().create_initialization_options(
            notification_options
            or NotificationOptions(tools_changed=True, resources_changed=True, prompts_changed=True),
            experimental_capabilities,
            extensions,
        )


class Gateway:
    def __init__(self, backend: GatewayBackend, redis_url: str) -> None:
        self.backend = backend
        self.redis_url = redis_url
        self.watch = Watch()
        self._update_drops = DropCounts()
        self.server = _GatewayServer(
            "vancetope",
            version="0.1.0",
            instructions=INSTRUCTIONS,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            on_subscriptions_listen=self.listen,
            on_set_logging_level=self.set_level,
            on_list_resources=self.list_resources,
            on_list_resource_templates=self.list_resource_templates,
            on_read_resource=self.read_resource,
            on_subscribe_resource=self.subscribe,
            on_unsubscribe_resource=self.unsubscribe,
            on_list_prompts=self.list_prompts,
            on_get_prompt=self.get_prompt,
            on_completion=self.complete,
        )
        self.server.middleware.append(self._remember_session)
        self._aredis: redis.asyncio.Redis | None = None
        self._told_clashes: set[str] = set()
        # Each MCP session's logging/setLevel: the least severe level it wants relayed.
        self.levels = SessionLevels()

    # --- the ASGI app ---------------------------------------------------------------
    def app(self, host: str) -> Starlette:
        security = None
        if host in ("127.0.0.1", "localhost", "::1"):
            # As the SDK does for a loopback server: no DNS-rebinding from a browser page.
            security = TransportSecuritySettings(
                enable_dns_rebinding_protection=True,
                allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
                allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
            )
        manager = StreamableHTTPSessionManager(app=self.server, security_settings=security)
        endpoint = RequireAuthMiddleware(StreamableHTTPASGIApp(manager), required_scopes=[])

        @asynccontextmanager
        async def lifespan(_: Starlette) -> AsyncIterator[None]:
            self._aredis = async_redis_client(self.redis_url)
            try:
                async with manager.run(), anyio.create_task_group() as tasks:
                    tasks.start_soon(self._watch_loop)
                    tasks.start_soon(self._relay_loop)
                    yield
                    tasks.cancel_scope.cancel()
            finally:
                await self._aredis.aclose()

        return Starlette(
            routes=[Route(MCP_PATH, endpoint=endpoint)],
            middleware=[
                Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(TokenVerifier(self.backend))),
                Middleware(AuthContextMiddleware),
            ],
            lifespan=lifespan,
        )

    # --- who is asking ----------------------------------------------------------------
    @staticmethod
    def user(ctx: ServerRequestContext[Any, Any]) -> str:
        found = getattr(ctx.request, "user", None) if ctx.request is not None else None
        if not isinstance(found, AuthenticatedUser) or not found.access_token.subject:
            # The bearer middleware lets nothing through without a user; this is a bug guard.
            raise MCPError(types.INVALID_REQUEST, "no authenticated user on this request")
        return found.access_token.subject

    @classmethod
    def caller(cls, ctx: ServerRequestContext[Any, Any]) -> Caller:
        """The user and the token: the brain takes the user from the token again."""
        user = cls.user(ctx)
        found = getattr(ctx.request, "user", None)
        assert isinstance(found, AuthenticatedUser)
        return Caller(user=user, token=found.access_token.token)

    async def _remember_session(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """Context middleware: note each user's sessions, so list_changed can reach them."""
        request = ctx.request
        session_id = request.headers.get("mcp-session-id") if request is not None else None
        if session_id:
            try:
                user = self.user(ctx)
            except MCPError:
                user = None
            if user is not None:
                self.watch.sessions.setdefault(user, {})[session_id] = _Seen(ctx.session, time.monotonic())
        return await call_next(ctx)

    # --- tools/list --------------------------------------------------------------------
    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        view = await anyio.to_thread.run_sync(self.backend.view, self.user(ctx))
        return types.ListToolsResult(tools=[mcp_tool(t) for t in view.listing.tools])

    # --- logging/setLevel --------------------------------------------------------------
    async def set_level(
        self, ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        """Keep the session's level: the MCP servers' log messages relayed to it during its
        calls are filtered by it (until then, every one the server sent)."""
        self.levels.set(_session_key(ctx), params.level)
        return types.EmptyResult()

    # --- tools/call --------------------------------------------------------------------
    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        caller = self.caller(ctx)
        name, args = params.name, dict(params.arguments or {})
        try:
            if name in (SPECIALIZED_CMD, LIST_POOLS):
                return await self._pooled(ctx, caller, name, args)
            return await self._call(ctx, caller, name, args)
        except UnknownTool as exc:
            # The spec's protocol error for an unknown tool; a tool that ran and failed, or was
            # given arguments its schema refuses, stays a result (isError) the model can read.
            raise MCPError(types.INVALID_PARAMS, str(exc)) from None
        except (redis.RedisError, BrainError) as exc:
            return text_result(f"tool {name!r} could not be called: {exc}", error=True)

    async def _call(
        self, ctx: ServerRequestContext[Any, Any], caller: Caller, name: str, args: dict[str, Any]
    ) -> types.CallToolResult:
        if name in _PRIMARY_NAMES:
            try:
                value = await anyio.to_thread.run_sync(self.backend.primary, caller, name, args)
            except (Refused, InvalidTaskTree, DoorRefused) as exc:
                return text_result(f"{name}: {exc}", error=True)
            return value_result(value)
        async with AsyncExitStack() as listening:
            try:
                submitted, woken = await listening.enter_async_context(self._submitted(caller, name, args))
            except InvalidTaskTree as exc:
                # Arguments its schema refuses (the registry's, or the announcing client's: the
                # same check on both routes): a tool execution error, as the spec words input
                # validation errors, so the model reads what to fix. Nothing was submitted.
                return text_result(f"tool {name!r} was not called: {call_problems(exc)}", error=True)
            except DoorRefused as exc:
                return text_result(f"tool {name!r} was not called: {exc}", error=True)
            return await self._follow(ctx, caller, submitted, woken)

    @asynccontextmanager
    async def _submitted(
        self, caller: Caller, name: str, args: dict[str, Any]
    ) -> AsyncIterator[tuple[Submitted, Callable[[float], Awaitable[bytes | None]]]]:
        """``name(args)`` submitted as a one-task tree of the caller, and the wait for its
        tree's events, listened to from before the call exists: its MCP server may log or ask
        as soon as it starts. Raises what ``submit_call`` raises."""
        run_id = call_run_id(name)
        async with self._tree_events(run_id) as woken:
            submitted = await anyio.to_thread.run_sync(self.backend.submit_call, caller, name, args, run_id)
            yield submitted, woken

    async def _pooled(
        self, ctx: ServerRequestContext[Any, Any], caller: Caller, name: str, args: dict[str, Any]
    ) -> types.CallToolResult:
        view = await anyio.to_thread.run_sync(self.backend.view, caller.user)
        if name == LIST_POOLS:
            pool, query = args.get("pool"), args.get("query")
            if isinstance(query, str) and query.strip():
                return value_result({"query": query, "tools": search(view.pools, query)})
            if isinstance(pool, str) and pool:
                if pool not in view.pools:
                    return text_result(
                        f"unknown pool {pool!r}; the pools are: {', '.join(sorted(view.pools))}", error=True
                    )
                return value_result(pool_detail(view.pools[pool]))
            return value_result({"pools": [pool_summary(p) for p in view.pools.values()]})
        found = resolve(view.pools, str(args.get("pool", "")), str(args.get("action", "")))
        if isinstance(found, str):
            return text_result(f"{SPECIALIZED_CMD}: {found}", error=True)
        params = args.get("params") or {}
        if not isinstance(params, dict):
            return text_result(
                f"{SPECIALIZED_CMD}: params must be an object (the arguments of {found.name!r})", error=True
            )
        return await self._call(ctx, caller, found.name, params)

    async def _follow(
        self,
        ctx: ServerRequestContext[Any, Any],
        caller: Caller,
        submitted: Submitted,
        woken: Callable[[float], Awaitable[bytes | None]],
    ) -> types.CallToolResult:
        """Wait for the call's task: its result, a queued receipt, or the block text after its wait."""
        ended = await self._outcome(ctx, caller, submitted, woken)
        if ended.kind == "queued":
            return queued_result(ended.rec)
        if ended.kind == "waited":
            return waited_result(ended.rec, submitted.wait_s)
        return final_result(ended.rec)

    async def _outcome(
        self,
        ctx: ServerRequestContext[Any, Any],
        caller: Caller,
        submitted: Submitted,
        woken: Callable[[float], Awaitable[bytes | None]],
    ) -> Ended:
        """How the call's task ended (or parked). Progress and log messages are relayed, and
        sampling/elicitation requests put to the MCP client (``call_events``); a cancelled MCP
        request cancels the task."""
        tree_id = submitted.tree_id
        try:
            return await self._wait(ctx, caller, submitted, woken)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                cancelled = await anyio.to_thread.run_sync(self.backend.cancel, caller, tree_id)
                log.info("MCP request cancelled: cancelled %s of tree %s", cancelled or "nothing", tree_id)
            raise

    async def _wait(
        self,
        ctx: ServerRequestContext[Any, Any],
        caller: Caller,
        submitted: Submitted,
        woken: Callable[[float], Awaitable[bytes | None]],
    ) -> Ended:
        async def reread() -> TaskRecord:
            return await anyio.to_thread.run_sync(self.backend.call_record, submitted.tree_id)

        events = CallEvents(ctx, self._aredis, CALL_TASK, self.levels.get(_session_key(ctx)), reread)
        blocked: TaskRecord | None = None  # the call's record while it was blocked
        quiet = False  # the last wait ended with no message
        before: TaskRecord | None = None  # the record read before the last wait

        async def relayed(ended: Ended, rec: TaskRecord) -> Ended:
            # What was published before the call ended is relayed before its result (progress,
            # log messages, in order), then the record's progress if the events missed it.
            message = await woken(DRAIN_S)
            while message is not None:
                await events.handle(message)
                message = await woken(DRAIN_S)
            await events.progress_from_record(rec)
            return ended

        while True:
            rec = await anyio.to_thread.run_sync(self.backend.call_record, submitted.tree_id)
            events.current = rec
            if rec.state is TaskState.EXPIRED and blocked is not None:
                return await relayed(Ended("waited", blocked), rec)  # the brain's sweep was first
            if rec.state.is_final:
                return await relayed(Ended("final", rec), rec)
            if rec.state is TaskState.PENDING_CLIENT:
                return await relayed(Ended("queued", rec), rec)
            if quiet and before is not None:
                # The record keeps the latest progress: one no event brought (a dropped
                # subscription) still reaches the client. The record read *before* the quiet
                # wait, not this one: a record is written before its event is published, so the
                # one just read may be ahead of events in flight (relaying its progress first
                # would drop theirs as older); a whole wait later, those of the earlier read
                # have come if they were coming.
                await events.progress_from_record(before)
            before = rec
            blocked = rec if rec.state is TaskState.BLOCKED else None
            # Timed from when it was parked (the store's wall clock), as the brain's sweep does.
            if blocked is not None and time.time() - (blocked.queued_at or time.time()) >= submitted.wait_s:
                await anyio.to_thread.run_sync(self.backend.cancel, caller, submitted.tree_id)
                after = await anyio.to_thread.run_sync(self.backend.call_record, submitted.tree_id)
                # It may have started meanwhile (the client came back): then its end counts.
                if after.state is TaskState.DONE or after.state in QUEUED:
                    continue
                return await relayed(Ended("waited", blocked), after)
            # Every event there is (in order: a log message sent before the result is relayed
            # before it), then the record again.
            message = await woken(POLL_S)
            quiet = message is None
            while message is not None:
                await events.handle(message)
                message = await woken(0)

    # --- resources, prompts, completion: routed like tools ------------------------------
    async def list_resources(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        view = await anyio.to_thread.run_sync(self.backend.view, self.user(ctx))
        for line in view.surface.clashes:
            if line not in self._told_clashes:  # once per clash, not at every listing
                self._told_clashes.add(line)
                log.warning("%s", line)
        listed = [types.Resource.model_validate(r) for r in view.surface.resources]
        return types.ListResourcesResult(resources=listed)

    async def list_resource_templates(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        view = await anyio.to_thread.run_sync(self.backend.view, self.user(ctx))
        listed = [types.ResourceTemplate.model_validate(t) for t in view.surface.templates]
        return types.ListResourceTemplatesResult(resource_templates=listed)

    async def read_resource(
        self, ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        caller = self.caller(ctx)
        uri = str(params.uri)
        tool = await self._reader(caller.user, uri)
        value = await self._routed(ctx, caller, tool, {"uri": uri})
        return types.ReadResourceResult.model_validate(value)

    async def _reader(self, user: str, uri: str) -> str:
        view = await anyio.to_thread.run_sync(self.backend.view, user)
        tool = view.surface.reader_of(uri)
        if tool is None:
            offline = await anyio.to_thread.run_sync(self.backend.offline_clients, user)
            raise MCPError(RESOURCE_NOT_FOUND, unknown_resource(uri, offline), {"uri": uri})
        return tool

    async def subscribe(
        self, ctx: ServerRequestContext[Any, Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        """Noted per session (a resource the user cannot read is refused), then read with
        ``subscribe`` where its server runs, like a read: that process subscribes upstream when
        the server can, and what the server then says of it comes back (``relay_update``)."""
        caller = self.caller(ctx)
        uri = str(params.uri)
        reader = await self._reader(caller.user, uri)
        # Noted first: a change said while the subscribing read runs is not lost.
        mine = self.watch.subscribed.setdefault(_session_id(ctx), {})
        mine[uri] = reader
        try:
            await self._routed(ctx, caller, reader, {"uri": uri, "subscribe": True})
        except BaseException:
            mine.pop(uri, None)
            raise
        return types.EmptyResult()

    async def unsubscribe(
        self, ctx: ServerRequestContext[Any, Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        """This session hears no more of it. The upstream subscription stays (the process that
        holds it cannot be addressed: one of a pool's workers); what it says reaches nobody."""
        self.watch.subscribed.get(_session_id(ctx), {}).pop(str(params.uri), None)
        return types.EmptyResult()

    # --- notifications/resources/updated ------------------------------------------------
    async def _relay_loop(self) -> None:
        while True:
            try:
                await self._relay_updates()
            except redis.RedisError as exc:
                log.warning("listening for resources/updated failed (%s); trying again", exc)
                await anyio.sleep(WATCH_INTERVAL_S)

    async def _relay_updates(self) -> None:
        assert self._aredis is not None
        pubsub = self._aredis.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe(channel_resource_updates())
        try:
            async for message in pubsub.listen():
                if message.get("type") != "message":
                    continue
                try:
                    await self.relay_update(message["data"])
                except (redis.RedisError, BrainError) as exc:
                    # The user's catalog could not be read: this change is lost, not the relay.
                    log.warning("a resources/updated was not relayed: %s", exc)
        finally:
            with anyio.CancelScope(shield=True):
                await pubsub.aclose()

    async def relay_update(self, raw: bytes | str) -> list[str]:
        """Tell each session that subscribed to the resource that it changed, under the URI it
        subscribed to (handshake-era sessions: ``resources/subscribe``; 2026-07-28 ones: a listen
        stream that asked for it, through the user's bus), if the user's catalog says the server
        is the sender's; who was told (session ids, ``listen:<user>``). The message is untrusted
        (a client agent's words, published by the brain as that client's): bounded, parsed
        strictly, and dropped with a log line when it does not fit."""
        try:
            update = parse_update(raw)
        except Dropped as exc:
            self._dropped_update(f"a {exc.kind} message on the channel", f"it was dropped: {exc}")
            return []
        reader = surface_tool(update.server, READ_RESOURCE)
        sender = "the server pool" if update.client_id is None else f"client {update.client_id!r}"
        targets = self._update_targets(reader, update.uri)
        if not targets:
            log.debug(
                "resources/updated of %r (%s, server %r): nobody subscribed",
                update.uri,
                sender,
                update.server,
            )
            return []
        views: dict[str, UserView] = {}
        told: list[str] = []
        users: set[str] = set()
        # A connected client is one user's: another user's catalog is not even built for its word.
        owner = None if update.client_id is None else self.watch.client_users.get(update.client_id)
        for user, who, send in targets:
            if owner is not None and user != owner:
                refused = True
            else:
                if user not in views:
                    views[user] = await anyio.to_thread.run_sync(self.backend.view, user)
                refused = not views[user].surface.may_notify(reader, update.client_id)
            if refused:
                self._dropped_update(
                    sender,
                    f"its resources/updated of {update.uri!r} was dropped: "
                    f"MCP server {update.server!r} is not one it serves user {user!r}",
                )
                continue
            try:
                await send()
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                continue  # its stream is gone; the session is forgotten when idle
            told.append(who)
            users.add(user)
        if told:
            # Counted, not named: a session id is half of what it takes to speak in that session.
            log.info(
                "resources/updated of %r (%s): told %d session(s) or stream(s) of user(s) %s",
                update.uri,
                sender,
                len(told),
                ", ".join(sorted(users)),
            )
        return told

    def _dropped_update(self, sender: str, what: str) -> None:
        """A WARNING for a dropped update, at most once a minute per sender (a hostile workstation
        may send a thousand a round), saying how many it covers."""
        count = self._update_drops.dropped(sender, time.monotonic())
        if count is not None:
            log.warning("%s: %s (%d such since the last line; at most one a minute)", sender, what, count)

    def _update_targets(self, reader: str, uri: str) -> list[tuple[str, str, Callable[[], Awaitable[None]]]]:
        """(user, who, how to tell them) for each session subscribed to ``uri`` read by
        ``reader``, and each user one of whose listen streams asked for it."""
        owners = {
            sid: (user, seen) for user, by_sid in self.watch.sessions.items() for sid, seen in by_sid.items()
        }
        found: list[tuple[str, str, Callable[[], Awaitable[None]]]] = []
        for sid in subscribers(self.watch.subscribed, reader, uri):
            if sid in owners:
                user, seen = owners[sid]
                found.append((user, sid, partial(seen.session.send_resource_updated, uri)))
        for user, streams in sorted(self.watch.listened.items()):
            bus = self.watch.buses.get(user)
            if bus is not None and subscribers(streams, reader, uri):
                # The bus hands it to the user's streams that asked for this URI, and no other.
                found.append((user, f"listen:{user}", partial(bus.publish, ResourceChanged(uri=uri))))
        return found

    async def list_prompts(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        view = await anyio.to_thread.run_sync(self.backend.view, self.user(ctx))
        return types.ListPromptsResult(
            prompts=[types.Prompt.model_validate(p.wire) for p in view.surface.prompts]
        )

    async def get_prompt(
        self, ctx: ServerRequestContext[Any, Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        caller = self.caller(ctx)
        view = await anyio.to_thread.run_sync(self.backend.view, caller.user)
        prompt = view.surface.prompt(params.name)
        if prompt is None:
            known = ", ".join(p.name for p in view.surface.prompts) or "none"
            raise MCPError(types.INVALID_PARAMS, f"unknown prompt {params.name!r} (your prompts: {known})")
        args = {"name": prompt.upstream, "arguments": dict(params.arguments or {})}
        value = await self._routed(ctx, caller, prompt.tool, args)
        return types.GetPromptResult.model_validate(value)

    async def complete(
        self, ctx: ServerRequestContext[Any, Any], params: types.CompleteRequestParams
    ) -> types.CompleteResult:
        caller = self.caller(ctx)
        view = await anyio.to_thread.run_sync(self.backend.view, caller.user)
        ref = params.ref.model_dump(mode="json", by_alias=True, exclude_none=True)
        tool = view.surface.completer_of(ref)
        if tool is None:
            raise MCPError(
                types.INVALID_PARAMS,
                f"no MCP server of yours completes arguments of {ref.get('name') or ref.get('uri')!r}",
            )
        if ref.get("type") == "ref/prompt":
            found = view.surface.prompt(str(ref.get("name")))
            assert found is not None
            ref["name"] = found.upstream
        args: dict[str, Any] = {"ref": ref, "argument": params.argument.model_dump(mode="json")}
        if params.context is not None and params.context.arguments:
            args["context"] = dict(params.context.arguments)
        value = await self._routed(ctx, caller, tool, args)
        return types.CompleteResult.model_validate(value)

    async def _routed(
        self, ctx: ServerRequestContext[Any, Any], caller: Caller, tool: str, args: dict[str, Any]
    ) -> Any:
        """A surface request as a one-task tree, routed like a tool call (server pool or the
        user's workstation, the same offline rules); its value, or the MCP error saying why not."""
        async with AsyncExitStack() as listening:
            try:
                submitted, woken = await listening.enter_async_context(self._submitted(caller, tool, args))
            except InvalidTaskTree as exc:
                raise MCPError(types.INVALID_PARAMS, f"{tool!r} was not sent: {call_problems(exc)}") from None
            except (UnknownTool, DoorRefused) as exc:
                raise MCPError(types.INVALID_REQUEST, f"{tool!r} was not sent: {exc}") from None
            except (redis.RedisError, BrainError) as exc:
                raise MCPError(types.INTERNAL_ERROR, f"{tool!r} could not be sent: {exc}") from None
            ended = await self._outcome(ctx, caller, submitted, woken)
        return surface_value(ended.kind, ended.rec, submitted.wait_s)

    @asynccontextmanager
    async def _tree_events(self, tree_id: str) -> AsyncIterator[Callable[[float], Awaitable[bytes | None]]]:
        """A wait that returns the tree's next message (None after ``timeout`` without one)."""
        assert self._aredis is not None
        pubsub = self._aredis.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe(channel_tree_events(tree_id))

        async def woken(timeout: float) -> bytes | None:
            found = await pubsub.get_message(timeout=timeout)
            if found is None:
                return None
            data = found.get("data")
            return data if isinstance(data, bytes) else str(data).encode()

        try:
            yield woken
        finally:
            with anyio.CancelScope(shield=True):
                await pubsub.aclose()

    # --- list_changed -----------------------------------------------------------------
    async def listen(
        self, ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """subscriptions/listen (2026-07-28 clients): one bus per user, so a user hears only of
        changes to their own tools, and of their own resources' (``relay_update``)."""
        user = self.user(ctx)
        bus = self.watch.buses.setdefault(user, InMemorySubscriptionBus())
        handler = self.watch.listeners.setdefault(user, ListenHandler(bus))
        uris = list(params.notifications.resource_subscriptions or ())[:MAX_LISTENED_URIS]
        if not uris:
            return await handler(ctx, params)
        # Resources it asks to hear of are subscribed to upstream as resources/subscribe does,
        # before the stream is acknowledged (a client that has the ack misses no change), and
        # heard of while it lasts. A URI none of the user's servers has is honored and never fires.
        caller = self.caller(ctx)
        view = await anyio.to_thread.run_sync(self.backend.view, user)
        wanted = {uri: reader for uri in uris if (reader := view.surface.reader_of(uri)) is not None}
        streams = self.watch.listened.setdefault(user, {})
        token = f"{_session_id(ctx)}/{ctx.request_id}"
        streams[token] = wanted
        try:
            async with anyio.create_task_group() as upstream:
                for uri, reader in wanted.items():
                    upstream.start_soon(self._subscribe_upstream, ctx, caller, uri, reader)
            return await handler(ctx, params)
        finally:
            streams.pop(token, None)
            if not streams:
                self.watch.listened.pop(user, None)

    async def _subscribe_upstream(
        self, ctx: ServerRequestContext[Any, Any], caller: Caller, uri: str, reader: str
    ) -> None:
        try:
            await self._routed(ctx, caller, reader, {"uri": uri, "subscribe": True})
        except MCPError as exc:
            log.info("listen stream of user %s: subscribing to %r upstream failed: %s", caller.user, uri, exc)

    async def _watch_loop(self) -> None:
        while True:
            try:
                await self.check_changes()
            except (redis.RedisError, BrainError) as exc:
                log.warning("watching presence and the registry failed (%s); trying again", exc)
            await anyio.sleep(WATCH_INTERVAL_S)

    async def check_changes(self) -> set[str]:
        """Compare what each user sees with the last look; tell the users concerned."""
        self._forget_idle_sessions()
        watched = set(self.watch.sessions) | set(self.watch.buses)
        after = await anyio.to_thread.run_sync(self.backend.state, watched)
        before = (self.watch.loaded_at, self.watch.per_user)
        self.watch.loaded_at, self.watch.per_user = after
        self.watch.client_users = {cid: user for user, (present, _) in after[1].items() for cid, _ in present}
        users = changed_users(before, after, watched)
        for user in sorted(users):
            await self._tell(user)
        return users

    async def _tell(self, user: str) -> None:
        log.info("what user %s sees changed: sending list_changed (tools, resources, prompts)", user)
        for seen in list(self.watch.sessions.get(user, {}).values()):
            # Best effort (the SDK drops it when the session's stream is gone).
            await seen.session.send_tool_list_changed()
            await seen.session.send_resource_list_changed()
            await seen.session.send_prompt_list_changed()
        bus = self.watch.buses.get(user)
        if bus is not None:
            await bus.publish(ToolsListChanged())
            await bus.publish(ResourcesListChanged())
            await bus.publish(PromptsListChanged())

    def _forget_idle_sessions(self) -> None:
        oldest = time.monotonic() - DEFAULT_SESSION_IDLE_TIMEOUT
        for user, seen in list(self.watch.sessions.items()):
            for session_id in [sid for sid, s in seen.items() if s.at < oldest]:
                del seen[session_id]
                self.watch.subscribed.pop(session_id, None)
            if not seen:
                del self.watch.sessions[user]


def _session_key(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """The MCP session a request belongs to (its Mcp-Session-Id), None without one."""
    request = ctx.request
    return request.headers.get("mcp-session-id") if request is not None else None


def serve(backend: GatewayBackend, redis_url: str, host: str, port: int) -> None:
    """Serve the gateway until interrupted (uvicorn, which the SDK depends on)."""
    import uvicorn

    gateway = Gateway(backend, redis_url)
    config = uvicorn.Config(gateway.app(host), host=host, port=port, log_level="warning", lifespan="on")
    log.warning("MCP gateway on http://%s:%d%s", host, port, MCP_PATH)
    uvicorn.Server(config).run()


__all__ = ["MCP_PATH", "Gateway", "TokenVerifier", "changed_users", "mcp_tool", "serve"]
