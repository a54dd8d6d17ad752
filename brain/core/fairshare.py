"""Which limits apply to a server run, and what a priority means (layer: brain/core; pure).

docs/fair-share.md is the user's view. A server run is bounded by the limits written on
its tool (registry ``rate_limit`` / ``max_concurrency``), on its tool's MCP server (the
``mcpServers`` entry: every tool of the server shares one budget) and on the pool it runs
on (``[[pools]]``). Each limit has a key (``tool:<name>``, ``server:<name>``,
``pool:<name>``) under which Redis keeps its budget across every pool process
(``brain.hot.gate``). Runs that share a pool, a user and a set of limit keys wait in one
*lane*, in order; a run with no limit skips the gate altogether.

Fair share (``Fairness``, on when the ``queue_window`` setting is above 0): every server run,
limited or not, waits at the gate, in a lane of its user, its tree and its priority; the gate
lets at most ``queue_window`` calls sit in a pool's queue and moves the rest round-robin across
users (``weight`` calls per turn), highest priority first within a user.
``max_in_flight_per_user`` is one more cap on each run: ``user:<name>@<pool>``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from brain.core.models import PRIORITY_WORDS, Priority, SessionKind, ToolSpec
from workers.contracts import DEFAULT_POOL, ErrorInfo, ToolType
from workers.rates import Limits, rate_per_s
from workers.throttle import pause_asked, url_origin

__all__ = [
    "DEFAULT_PRIORITY",
    "PRIORITY_WORDS",
    "AppliedLimit",
    "Fairness",
    "Priority",
    "applied_limits",
    "call_origin",
    "call_priority",
    "highest_first",
    "lane_id",
    "pause_asked_by",
    "pause_key",
    "priority_named",
    "priority_source",
    "queue_priority",
    "user_limit",
    "window_why",
    "written_limits",
]


@dataclass(frozen=True)
class AppliedLimit:
    """One limit on a run: where it is written (``scope`` and ``name``) and what it allows."""

    scope: str  # "tool", "server" or "pool"
    name: str
    rate_limit: str | None
    max_concurrency: int | None

    @property
    def key(self) -> str:
        return f"{self.scope}:{self.name}"

    @property
    def per_s(self) -> float:
        """Calls per second allowed (0: no rate limit)."""
        return rate_per_s(self.rate_limit) if self.rate_limit else 0.0

    def described(self) -> list[str]:
        """``["rate_limit 5/s of tool http_get", ...]``: how status and explain name it."""
        if self.scope == "user":
            user, _, pool = self.name.rpartition("@")
            return [f"max_in_flight_per_user {self.max_concurrency} of user {user} on pool {pool}"]
        of = f"of {self.scope} {self.name}"
        words = [f"rate_limit {self.rate_limit} {of}"] if self.rate_limit else []
        if self.max_concurrency is not None:
            words.append(f"max_concurrency {self.max_concurrency} {of}")
        return words


def applied_limits(
    tool: ToolSpec,
    pool: str | None,
    server_limits: Mapping[str, Limits],
    pool_limits: Mapping[str, Limits],
    paused: Collection[str] = (),
    origin: str | None = None,
) -> tuple[AppliedLimit, ...]:
    """The limits a server run of ``tool`` on ``pool`` is bounded by, tool first. A budget in
    ``paused`` (a server that answered 429) bounds it even when no limit is written there: the
    run waits at the gate, which holds it until the pause ends. ``origin``: the site the
    run's ``url`` argument names (``call_origin``), whose pause bounds it too."""
    found: list[AppliedLimit] = []
    if tool.rate_limit is not None or tool.max_concurrency is not None:
        found.append(AppliedLimit("tool", tool.name, tool.rate_limit, tool.max_concurrency))
    server = tool.mcp_server if tool.type is ToolType.MCP else None
    on_server = server_limits.get(server) if server else None
    if server and on_server is not None and on_server.any:
        found.append(AppliedLimit("server", server, on_server.rate_limit, on_server.max_concurrency))
    pool_name = pool or DEFAULT_POOL
    on_pool = pool_limits.get(pool_name)
    if on_pool is not None and on_pool.any:
        found.append(AppliedLimit("pool", pool_name, on_pool.rate_limit, on_pool.max_concurrency))
    pauses = [pause_key(tool.name, server)]
    if origin is not None and server is None:
        pauses.append(pause_key(tool.name, None, origin))
    for pause in pauses:
        if pause in paused and all(limit.key != pause for limit in found):
            scope, _, name = pause.partition(":")
            found.append(AppliedLimit(scope, name, None, None))
    return tuple(found)


def written_limits(
    tools: Iterable[ToolSpec], server_limits: Mapping[str, Limits], pool_limits: Mapping[str, Limits]
) -> list[AppliedLimit]:
    """Every limit written in the registry, the mcpServers file and the pools: tools, then
    servers, then pools, each by name (what ``status --queues`` lists)."""
    found = [
        AppliedLimit("tool", t.name, t.rate_limit, t.max_concurrency)
        for t in sorted(tools, key=lambda t: t.name)
        if t.rate_limit is not None or t.max_concurrency is not None
    ]
    for scope, written in (("server", server_limits), ("pool", pool_limits)):
        found += [
            AppliedLimit(scope, name, limits.rate_limit, limits.max_concurrency)
            for name, limits in sorted(written.items())
            if limits.any
        ]
    return found


def pause_key(tool: str, server: str | None, origin: str | None = None) -> str:
    """The budget a 429 with Retry-After pauses: its MCP server's (every tool of it); for a
    tool of no MCP server, the site that answered (``http_get`` names it: every call to that
    origin), else the tool's own."""
    if server:
        return f"server:{server}"
    return f"origin:{origin}" if origin else f"tool:{tool}"


def call_origin(args: Mapping[str, Any]) -> str | None:
    """The origin a call's ``url`` argument names (``http_get``'s), whose 429 pause holds it."""
    return url_origin(args.get("url"))


def pause_asked_by(tool: str, error: ErrorInfo | None) -> tuple[str, float] | None:
    """The budget a failed server call asks to pause and for how long (a 429 with Retry-After,
    ``workers.throttle``); None when it asks nothing. The MCP client names the server in the
    error's data; a built-in's error names none."""
    if error is None:
        return None
    seconds = pause_asked(error.data)
    if seconds is None or seconds <= 0:
        return None
    data = error.data if isinstance(error.data, dict) else {}
    server, origin = data.get("server"), data.get("origin")
    return (
        pause_key(
            tool,
            server if isinstance(server, str) and server else None,
            url_origin(origin) if isinstance(origin, str) else None,  # as the call's url reads
        ),
        seconds,
    )


def highest_first(task_ids: list[str], priority_of: Callable[[str], int]) -> list[str]:
    """``task_ids`` with the higher priorities first, in their own order within one priority
    (a tree's ready tasks, sent in this order: its ``high`` call is not written behind 5,000
    ``low`` ones, which would start while it is still being sent). The list itself when all
    share one priority."""
    if len(task_ids) < 2:
        return task_ids
    ranks = [priority_of(task_id) for task_id in task_ids]
    if min(ranks) == max(ranks):
        return task_ids
    order = sorted(range(len(task_ids)), key=lambda i: -ranks[i])  # stable
    return [task_ids[i] for i in order]


def lane_id(
    pool: str | None, user: str | None, limits: tuple[AppliedLimit, ...], *, tree: str = "", priority: int = 0
) -> str:
    """The lane of runs of ``user`` on ``pool`` bounded by exactly ``limits`` (with fair share,
    of one ``tree`` at one ``priority``): one FIFO list in Redis. A short hash (a key prefix may
    not hold arbitrary tool and user names); the lane's record in Redis says what it is."""
    parts = [pool or DEFAULT_POOL, user or "", *(limit.key for limit in limits)]
    if tree:
        parts += [f"tree:{tree}", f"priority:{priority}"]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


# What a task that names no priority gets, in a tree that names none, outside an interactive
# session or a gateway call (those get "high": a person waits for them).
DEFAULT_PRIORITY = PRIORITY_WORDS["normal"]


def call_priority(task: int | None, tree: int | None, session: SessionKind, gateway_call: bool) -> int:
    """A run's priority, 0-9 (9 first): its task's, else its tree's, else high for an
    interactive session or a gateway call and normal for an autonomous run."""
    return priority_source(task, tree, session, gateway_call)[0]


def queue_priority(task: int | None, tree: int | None, session: SessionKind, gateway_call: bool) -> int:
    """A server call's place in its pool's queue with fair share off, which gives users no
    share to keep a priority within: a person's call (high by default: an interactive
    session's, a gateway call) goes ahead of a batch, and a priority a task or tree writes
    counts up to its run's default only (normal for an autonomous run), so that nobody's
    batch marked high queues ahead of people's calls or of other users' work. Lower stays
    lower: it delays only its own writer."""
    default = call_priority(None, None, session, gateway_call)
    written = task if task is not None else tree
    return default if written is None else min(written, default)


def priority_source(
    task: int | None, tree: int | None, session: SessionKind, gateway_call: bool
) -> tuple[int, str]:
    """``call_priority`` and where it comes from (``explain`` says it): ``the task``,
    ``the tree`` (a schedule's ``priority`` is written there), or the default of the run."""
    if task is not None:
        return task, "set on the task"
    if tree is not None:
        return tree, "set on the tree (or by its schedule)"
    if gateway_call:
        return PRIORITY_WORDS["high"], "the default of a gateway call"
    if session is SessionKind.INTERACTIVE:
        return PRIORITY_WORDS["high"], "the default of an interactive session"
    return DEFAULT_PRIORITY, "the default of an autonomous run"


def priority_named(priority: int) -> str:
    """``high (8)`` for a priority a word stands for, else the number (``7``)."""
    words = {number: word for word, number in PRIORITY_WORDS.items()}
    return f"{words[priority]} ({priority})" if priority in words else str(priority)


@dataclass(frozen=True)
class Fairness:
    """The fair-share settings: ``queue_window`` (0: off, only limited calls wait at the gate),
    ``max_in_flight_per_user`` (None: no cap) and each user's ``weight`` (default 1)."""

    queue_window: int = 0
    max_in_flight_per_user: int | None = None
    weights: Mapping[str, int] = field(default_factory=dict)

    @property
    def on(self) -> bool:
        return self.queue_window > 0

    def weight(self, user: str | None) -> int:
        return self.weights.get(user or "", 1)


def user_limit(pool: str | None, user: str | None, cap: int) -> AppliedLimit:
    """``max_in_flight_per_user`` as a cap of its own per user and pool (``user:ada@default``):
    the gate leases its slots as any ``max_concurrency``'s."""
    return AppliedLimit("user", f"{user or '-'}@{pool or DEFAULT_POOL}", None, cap)


def window_why(window: int, pool: str | None) -> str:
    """Why a lane waits behind a full queue window (status's ``throttled by ...``)."""
    return f"queue_window {window} of pool {pool or DEFAULT_POOL}" if window > 0 else ""
