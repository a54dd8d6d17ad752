"""The tool router (layer: brain/core; pure).

One job: decide where one tool call runs — the server pool, a client agent, or
nowhere yet (blocked, pending_client, skipped, failed) — from the tool spec, the
task's execution_target, the session kind, the think-process engine and who is
connected (seed 000 §4, §6, §8). No I/O, no clock: same inputs, same route.

Decision order (every step leaves its explanation in ``Route.reason``):

1. Engine allow-list: a tool the engine lists under neither ``server`` nor
   ``client`` fails, whether or not it exists.
2. Lookup: a tool in the registry uses its spec; a tool only a usable client
   announces is a client-only tool; anything else fails with ``Tool unknown``.
3. Pin: ``execution_target: server|client`` and an engine listing the tool under
   one side only pin the call to that side. Pins that disagree, or a pin to a side
   the tool cannot run on, fail.
4. Location (unpinned): ``server`` runs on the server; ``client`` needs a client;
   ``both`` runs on the preferred side (server when ``prefer`` is unset). With
   ``execution_target: any`` a ``both`` tool runs on the server, the side that is
   always available; ``any`` otherwise behaves like ``auto``.
5. No usable client offers the tool: engine ``auto_fallback`` first runs the server
   alternative (``fallback_tool``, else the tool itself when it is ``both``); then the
   offline strategy applies — the tool's ``offline_strategy``, else ``fallback`` for
   ``both`` tools (seed: "Client not present? → Fallback to Server"), else ``block``
   in interactive and ``queue`` in autonomous sessions. When the call is pinned to
   the client (``execution_target: client``, or an engine without ``auto_fallback``),
   running on the server is not allowed: a ``fallback`` strategy (configured or the
   ``both`` default) gives way to the session default. An engine binds fallbacks too:
   a ``fallback_tool`` the engine does not allow is never called; with no other server
   alternative the session default applies, and the reason says why.

Pool: a server route names the pool that runs it (``Route.pool``, None for the default
pool): the task's ``pool``, else the called tool's (a ``fallback_tool``'s own, when it
replaces the tool), else the tree's (``brain.core.pools``). A pool that is not configured
(``RouteRequest.pools``) fails the call.

Usable clients: a tree bound to a client (``Presence.session_client``: `run --client`, the
Python API's ``client_id=``, an interactive session's client) runs its client tasks on that
client only; when it is offline, or does not offer the tool, the offline strategy applies
(it parks for that client), never another client of the same user. An unbound tree (an
autonomous run with a user) takes, among the connected clients of its user that offer the
tool, the least loaded (``ClientView.load``: calls the brain has queued on or sent to it and
not yet seen finish), ties going in client_id order; never another user's client. Without a
known user and without a bound client, no client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from brain.core.models import ExecutionTarget, Location, OfflineStrategy, SessionKind, Side, ToolSpec
from brain.core.pools import pool_route, unknown_pool
from workers.contracts import DEFAULT_POOL, client_queue, pool_queue
from workers.toolnames import canonical


class RouteKind(StrEnum):
    SERVER = "server"
    CLIENT = "client"
    BLOCKED = "blocked"
    PENDING_CLIENT = "pending_client"
    SKIP = "skip"
    FAIL = "fail"


class Route(BaseModel):
    """Where one tool call goes, and why. ``tool`` is the tool actually called."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: RouteKind
    tool: str
    client_id: str | None = None
    reason: str
    # Set when a fallback_tool replaces the requested tool.
    fell_back_from: str | None = None
    # The offline strategy that produced this route; None when a side was simply available.
    strategy: OfflineStrategy | None = None
    # The named server pool of a SERVER route; None: the default pool.
    pool: str | None = None

    @property
    def summary(self) -> str:
        """Where it goes in a word: ``server``, ``server:<pool>``, ``client:<id>``, else the kind."""
        if self.kind is RouteKind.SERVER:
            return pool_route(self.pool)
        if self.kind is RouteKind.CLIENT and self.client_id is not None:
            return f"client:{self.client_id}"
        return self.kind.value

    @property
    def queue(self) -> str | None:
        """The Celery queue to publish on; None when nothing is sent now."""
        if self.kind is RouteKind.SERVER:
            return pool_queue(self.pool)
        if self.kind is RouteKind.CLIENT and self.client_id is not None:
            return client_queue(self.client_id)
        return None


class ClientView(BaseModel):
    """A connected client as the router sees it: whose it is, which tools it announced, and
    its load: calls waiting in its queue or taken by it and not yet finished."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    client_id: str
    user: str
    tools: frozenset[str] = frozenset()
    load: int = Field(default=0, ge=0)


class Presence(BaseModel):
    """Who is connected, seen from one session."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    session_client: str | None = None
    user: str | None = None
    clients: tuple[ClientView, ...] = ()

    def with_call_sent_to(self, client_id: str) -> Presence:
        """This view after one more call was sent to ``client_id`` (its load + 1): what a
        caller routing several calls from one view passes for the next one."""
        clients = tuple(
            c.model_copy(update={"load": c.load + 1}) if c.client_id == client_id else c for c in self.clients
        )
        return self.model_copy(update={"clients": clients})


class Engine(BaseModel):
    """A think process's toolset (seed 000 §8).

    Accepts the seed's shape (``tools: {server: [...], client: [...], auto_fallback: …}``)
    and the flat one (``server: [...]``, ``client: [...]``, ``auto_fallback: …``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    server: tuple[str, ...] = ()
    client: tuple[str, ...] = ()
    auto_fallback: bool = False

    @model_validator(mode="before")
    @classmethod
    def _flatten_seed_shape(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("tools"), dict):
            nested = data["tools"]
            rest = {k: v for k, v in data.items() if k != "tools"}
            clash = sorted(set(nested) & set(rest))
            if clash:
                raise ValueError(f"{', '.join(clash)} given both inside and beside 'tools'; keep one")
            return {**rest, **nested}
        return data

    @field_validator("server", "client")
    @classmethod
    def _canonical_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        # A registry file written before the dot lists ``git/git_status``: the tree says
        # ``git.git_status`` (brain.core.toolnames), so the engine must list that.
        return tuple(canonical(name) for name in v)

    def allows(self, tool: str) -> bool:
        return tool in self.server or tool in self.client

    def side_for(self, tool: str) -> Side | None:
        """The side this engine pins ``tool`` to; None when it lists the tool on both sides."""
        on_server, on_client = tool in self.server, tool in self.client
        if on_server == on_client:
            return None
        return Side.SERVER if on_server else Side.CLIENT


class RouteRequest(BaseModel):
    """One tool call to route."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: str
    execution_target: ExecutionTarget = ExecutionTarget.AUTO
    session: SessionKind = SessionKind.AUTONOMOUS
    engine: Engine | None = None
    # The pool the task names, and the one its tree names (brain.core.pools for the order).
    pool: str | None = None
    tree_pool: str | None = None
    # The configured named pools (the default pool is always there).
    pools: frozenset[str] = frozenset()


def decide_route(req: RouteRequest, registry: Mapping[str, ToolSpec], presence: Presence) -> Route:
    """Route one tool call. Never raises for bad input: an impossible call is a FAIL route."""
    try:
        return _decide(req, registry, presence)
    except _Refusal as refusal:
        return Route(kind=RouteKind.FAIL, tool=req.tool, reason=refusal.reason)


def route_without_presence(req: RouteRequest, registry: Mapping[str, ToolSpec]) -> Route | None:
    """The route, when no client coming or going could change it; else None (look presence
    up, then ``decide_route``). A registry tool routed to the server not as an offline
    strategy is such a route: ``_server`` never reads presence, and only the offline path
    (fallback) and client routes do. Lets the scheduler skip a Redis read per dispatch."""
    if req.tool not in registry:
        return None
    route = decide_route(req, registry, Presence())
    return route if route.kind is RouteKind.SERVER and route.strategy is None else None


# --- internals -----------------------------------------------------------------


class _Refusal(Exception):
    """Ends a decision with a FAIL route; keeps the happy path free of early returns."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class _Pick:
    client_id: str
    note: str


@dataclass(frozen=True)
class _Call:
    req: RouteRequest
    spec: ToolSpec | None  # None: not in the registry, announced by a usable client
    registry: Mapping[str, ToolSpec]
    presence: Presence
    pick: _Pick | None
    may_fall_back: bool = True  # False when the call is pinned to the client

    @property
    def tool(self) -> str:
        return self.req.tool


def _decide(req: RouteRequest, registry: Mapping[str, ToolSpec], presence: Presence) -> Route:
    tool = req.tool
    if req.engine is not None and not req.engine.allows(tool):
        raise _Refusal(f"tool {tool!r} is not allowed by engine {req.engine.id!r}")
    spec = registry.get(tool)
    pick = _pick_client(tool, presence)
    if spec is None and pick is None:
        raise _Refusal(f"Tool unknown: {tool}")
    call = _Call(req, spec, registry, presence, pick)
    pin, why = _pin(call)
    if pin is Side.SERVER:
        return _server(call, f"{why}: the server pool runs tool {tool!r}")
    if pin is Side.CLIENT:
        engine = req.engine
        may_fall_back = req.execution_target is not ExecutionTarget.CLIENT and bool(
            engine and engine.auto_fallback
        )
        return _client_or_offline(_replace(call, may_fall_back), why)
    return _by_location(call)


def _replace(call: _Call, may_fall_back: bool) -> _Call:
    return _Call(call.req, call.spec, call.registry, call.presence, call.pick, may_fall_back)


def _runs_on_server(spec: ToolSpec | None) -> bool:
    return spec is not None and spec.location is not Location.CLIENT


def _runs_on_client(spec: ToolSpec | None) -> bool:
    return spec is None or spec.location is not Location.SERVER


def _pin(call: _Call) -> tuple[Side | None, str]:
    """The side the task or the engine insists on, and the words for why."""
    tool, engine = call.tool, call.req.engine
    target = {ExecutionTarget.SERVER: Side.SERVER, ExecutionTarget.CLIENT: Side.CLIENT}.get(
        call.req.execution_target
    )
    engine_side = engine.side_for(tool) if engine is not None else None
    if target is not None and engine_side is not None and target is not engine_side:
        assert engine is not None
        raise _Refusal(
            f"execution_target {target.value} conflicts with engine {engine.id!r}, "
            f"which lists tool {tool!r} under {engine_side.value} only"
        )
    if target is not None:
        _require(call, target, f"task must run on the {target.value}")
        return target, f"execution_target {target.value}"
    if engine_side is not None:
        assert engine is not None
        why = f"engine {engine.id!r} lists tool {tool!r} under {engine_side.value}"
        _require(call, engine_side, why)
        return engine_side, why
    return None, ""


def _require(call: _Call, side: Side, why: str) -> None:
    if side is Side.SERVER and not _runs_on_server(call.spec):
        raise _Refusal(f"{why} but tool {call.tool!r} is client-only")
    if side is Side.CLIENT and not _runs_on_client(call.spec):
        raise _Refusal(f"{why} but tool {call.tool!r} is server-only")


def _by_location(call: _Call) -> Route:
    spec, tool = call.spec, call.tool
    if spec is None:
        return _client_or_offline(call, f"tool {tool!r} is not in the registry; a client announces it")
    if spec.location is Location.SERVER:
        return _server(call, f"tool {tool!r} has location server: the server pool runs it")
    if spec.location is Location.CLIENT:
        return _client_or_offline(call, f"tool {tool!r} has location client")
    if call.req.execution_target is ExecutionTarget.ANY:
        return _server(call, f"execution_target any: tool {tool!r} runs on the server, always available")
    if spec.preferred_side is Side.SERVER:
        return _server(call, f"tool {tool!r} has location both, prefer server: the server pool runs it")
    return _client_or_offline(call, f"tool {tool!r} has location both, prefer client")


def _server(call: _Call, reason: str) -> Route:
    pool, note = _pool(call, call.tool)
    return Route(kind=RouteKind.SERVER, tool=call.tool, reason=reason + note, pool=pool)


def _pool(call: _Call, tool: str) -> tuple[str | None, str]:
    """The named pool that runs ``tool`` for this call (None: the default pool), and words
    for the reason. Task, then tool, then tree; an unconfigured pool refuses the call."""
    spec = call.registry.get(tool)
    named = (
        (call.req.pool, "the task"),
        (spec.pool if spec is not None else None, f"tool {tool!r}"),
        (call.req.tree_pool, "the tree"),
    )
    pool, whose = next(((p, w) for p, w in named if p is not None), (None, ""))
    if pool is None or pool == DEFAULT_POOL:
        return None, ""
    if pool not in call.req.pools:
        raise _Refusal(unknown_pool(pool, call.req.pools, whose))
    return pool, f", on pool {pool!r} (named by {whose})"


def _client_or_offline(call: _Call, why: str) -> Route:
    if call.pick is None:
        return _offline(call)
    reason = f"{why}: client {call.pick.client_id!r} ({call.pick.note}) runs it"
    return Route(kind=RouteKind.CLIENT, tool=call.tool, client_id=call.pick.client_id, reason=reason)


def _pick_client(tool: str, presence: Presence) -> _Pick | None:
    if presence.session_client is not None:
        # Bound to one client: that one or none (the offline strategy then parks for it).
        own = _session_client(presence)
        return (
            _Pick(own.client_id, "this session's client") if own is not None and tool in own.tools else None
        )
    offering = [c for c in _same_user_clients(presence) if tool in c.tools]
    if not offering:
        return None
    # _same_user_clients is in client_id order and min() keeps the first of equals: the tie-break.
    least = min(offering, key=lambda c: c.load)
    if len(offering) == 1:
        return _Pick(least.client_id, f"a client of user {presence.user!r}")
    note = (
        f"the least loaded of {len(offering)} clients of user {presence.user!r}, {least.load} call(s) queued"
    )
    return _Pick(least.client_id, note)


def _session_client(presence: Presence) -> ClientView | None:
    for client in presence.clients:
        if client.client_id == presence.session_client and presence.user in (None, client.user):
            return client
    return None


def _same_user_clients(presence: Presence) -> list[ClientView]:
    """The clients an unbound tree may use. A bound tree uses its own client only; without a
    known user there is no way to tell whose a client is."""
    if presence.user is None or presence.session_client is not None:
        return []
    mine = [c for c in presence.clients if c.user == presence.user]
    return sorted(mine, key=lambda c: c.client_id)


def _absence(call: _Call) -> str:
    """Words for why no client runs the tool: the bound client is away or lacks it; for an
    unbound tree, no client at all, or none that offers it."""
    presence = call.presence
    bound = presence.session_client
    if bound is not None:
        if _session_client(presence) is not None:
            return f"client {bound!r} does not offer this tool"
        if any(c.client_id == bound for c in presence.clients):
            return f"client {bound!r} is not a client of user {presence.user!r}"
        return f"client {bound!r} not connected"
    if not _same_user_clients(presence):
        return "no client connected"
    return "no client with this tool connected"


# --- no usable client: auto_fallback, then the offline strategy -------------------------


def _offline(call: _Call) -> Route:
    engine = call.req.engine
    if engine is not None and engine.auto_fallback and call.may_fall_back:
        alternative = _server_alternative(call)
        if alternative is not None:
            return _fallback_route(call, alternative, f" (engine {engine.id!r} auto_fallback)")
    strategy, tool, absent = _strategy(call), call.tool, _absence(call)
    barred = _engine_bars_fallback(call)
    if strategy is OfflineStrategy.FALLBACK and barred and _server_alternative(call) is None:
        strategy = _session_default(call)  # as when pinned: waiting is the only honest option
    note = f"; not falling back: {barred}" if barred else ""
    if strategy is OfflineStrategy.BLOCK:
        reason = f"Waiting for Client for Tool: {tool}{note}"
        return Route(kind=RouteKind.BLOCKED, tool=tool, reason=reason, strategy=strategy)
    if strategy is OfflineStrategy.QUEUE:
        reason = f"Queued for Client: {tool} ({absent}){note}"
        return Route(kind=RouteKind.PENDING_CLIENT, tool=tool, reason=reason, strategy=strategy)
    if strategy is OfflineStrategy.SKIP:
        reason = f"Skipped: {absent} for Tool: {tool}{note}"
        return Route(kind=RouteKind.SKIP, tool=tool, reason=reason, strategy=strategy)
    alternative = _server_alternative(call)
    if alternative is None:
        raise _Refusal(_no_alternative(call, absent))
    return _fallback_route(call, alternative, "")


def _engine_bars_fallback(call: _Call) -> str | None:
    """Words for why the engine forbids the tool's fallback_tool; None when it does not."""
    engine, spec = call.req.engine, call.spec
    if engine is None or spec is None or spec.fallback_tool is None or engine.allows(spec.fallback_tool):
        return None
    return f"fallback_tool {spec.fallback_tool!r} is not allowed by engine {engine.id!r}"


def _strategy(call: _Call) -> OfflineStrategy:
    configured = call.spec.offline_strategy if call.spec is not None else None
    if configured is OfflineStrategy.FALLBACK and not call.may_fall_back:
        configured = None  # pinned to the client: waiting is the only honest option
    if configured is not None:
        return configured
    if call.may_fall_back and call.spec is not None and call.spec.location is Location.BOTH:
        return OfflineStrategy.FALLBACK
    return _session_default(call)


def _session_default(call: _Call) -> OfflineStrategy:
    return OfflineStrategy.BLOCK if call.req.session is SessionKind.INTERACTIVE else OfflineStrategy.QUEUE


def _server_alternative(call: _Call) -> str | None:
    """The tool to run on the server instead: a usable fallback_tool, else the tool itself."""
    spec = call.spec
    if spec is None:
        return None
    fallback = spec.fallback_tool
    if (
        fallback is not None
        and _runs_on_server(call.registry.get(fallback))
        and not _engine_bars_fallback(call)
    ):
        return fallback
    return call.tool if _runs_on_server(spec) else None


def _fallback_route(call: _Call, alternative: str, suffix: str) -> Route:
    reason = f"Fallback to Server: {_absence(call)}"
    fell_back_from = None
    if alternative != call.tool:
        reason += f"; calling fallback_tool {alternative!r} instead of {call.tool!r}"
        fell_back_from = call.tool
    pool, note = _pool(call, alternative)
    return Route(
        kind=RouteKind.SERVER,
        tool=alternative,
        reason=reason + suffix + note,
        fell_back_from=fell_back_from,
        strategy=OfflineStrategy.FALLBACK,
        pool=pool,
    )


def _no_alternative(call: _Call, absent: str) -> str:
    head = f"offline_strategy fallback: tool {call.tool!r} needs a client ({absent})"
    fallback_tool = call.spec.fallback_tool if call.spec is not None else None
    if fallback_tool is None:
        return f"{head} and has no fallback_tool"
    if fallback_tool not in call.registry:
        return f"{head} and its fallback_tool {fallback_tool!r} is not in the registry"
    return f"{head} and its fallback_tool {fallback_tool!r} does not run on the server (location client)"


def client_tools(presence: Presence) -> frozenset[str]:
    """Every tool a client this session may use has announced (the router picks among these):
    a bound session's own client's, else its user's clients'."""
    return frozenset(name for client in _reachable(presence) for name in client.tools)


def reachable_client_ids(presence: Presence) -> frozenset[str]:
    """The connected clients this session may use (``client_tools``'s)."""
    return frozenset(client.client_id for client in _reachable(presence))


def _reachable(presence: Presence) -> list[ClientView]:
    own = _session_client(presence)
    return ([own] if own is not None else []) + _same_user_clients(presence)
