"""What the gateway asks of the stack (layer: brain/gateway, Redis/store glue; synchronous,
run in worker threads by ``brain.gateway.server``).

A routed call is a one-task tree submitted as an *interactive session* of the token's user,
with no client bound: the router picks the user's least loaded connected client offering the
tool, or the server pool, and applies the tool's offline strategy (seed 000 §4) — the same
path as any tree, so the store records it and ``brain_tree_status`` finds it later.

The gateway decides and writes nothing itself (issue 20, H6): it submits and cancels by
asking the brain (``brain.runtime.gateway_door``) with the caller's token, from which the brain takes
the user; it reads the registry and presence the brain publishes in Redis, and the store
through a read-only connection (SQLite ``mode=ro``; MongoDB: the URL's user). Its Redis user
(``vt-gateway``) reaches no client key and runs no SCAN, PSUBSCRIBE or script.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import redis

from brain.config import CONFIG_FILE, Settings
from brain.core.limits import check_tree_data
from brain.core.models import MAX_TREE_ID_CHARS, SessionKind, TaskRecord, TaskTree
from brain.core.report import tree_report, trees_report
from brain.core.sessions import ClientSession, announced_schemas, user_sessions
from brain.core.snapshot import RegistrySnapshot
from brain.core.submission import check_submission
from brain.core.treefile import tree_from_data
from brain.core.validation import did_you_mean
from brain.errors import BrainError, StackNotRunning
from brain.gateway.catalog import GatewayTool, StateMemo, UserState, catalog, user_states
from brain.gateway.pools import Listing, Pool, PoolConfig, build_pools, listing, load_tool_pools
from brain.gateway.primary import CANCEL, HEALTH, LIST_CLIENTS, OWN_NAMES, SUBMIT_TREE, TREE_STATUS
from brain.gateway.surface import Surface, surface_of
from brain.hot.boundary import unreachable
from brain.hot.presence import PresenceBook
from brain.hot.state import HotState
from brain.runtime import gateway_door as door
from brain.runtime import gateway_tokens as tokens
from brain.store import Store, open_store
from workers.contracts import surface_op
from workers.urls import redact_url

CALL_TASK = "call"
# Trees of a user that brain_tree_status lists without a tree id.
RECENT_TREES = 20
# How long a submit or cancel waits for the brain's reply.
ASK_TIMEOUT_S = 30.0


class Refused(BrainError):
    """A primary tool's call that cannot be served; the text tells the caller what to do."""


class UnknownTool(BrainError):
    """A ``tools/call`` of a name that is none of the caller's tools: the MCP server answers it
    with the protocol error the spec gives for an unknown tool (-32602), not a tool result."""


@dataclass(frozen=True)
class Caller:
    """Who asks: the token's user, and the token itself, which the brain checks again."""

    user: str
    token: str = field(repr=False)


@dataclass(frozen=True)
class UserView:
    """What one user sees now: the catalog, the tools/list, the pools."""

    user: str
    tools: list[GatewayTool]
    listing: Listing
    pools: dict[str, Pool]
    sessions: list[ClientSession]
    surface: Surface = field(default_factory=Surface)


@dataclass(frozen=True)
class Submitted:
    tree_id: str
    # How long a blocked call waits for a client before the gateway gives up on it.
    wait_s: float


def call_tree_id(tool: str) -> str:
    """The tree id of a call of ``tool`` (the run id adds a time and a token)."""
    return ("mcp-" + re.sub(r"[^A-Za-z0-9_.:-]", ".", tool))[:MAX_TREE_ID_CHARS]


def call_run_id(tool: str) -> str:
    """The run's id of a call of ``tool``, chosen by the gateway (as the brain would choose it:
    a time and a token after the tree id) so that it can listen to the run's channel before
    submitting: an MCP server may log or ask as soon as the call starts."""
    return f"{call_tree_id(tool)}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


class GatewayBackend(Protocol):
    """All the MCP server (``brain.gateway.server``) asks of the stack. ``Backend`` is the real
    one, over Redis and a read-only store; the server depends on nothing else of the brain."""

    def user_of(self, token: str) -> str | None: ...
    def view(self, user: str) -> UserView: ...
    def offline_clients(self, user: str) -> tuple[str, ...]: ...
    def state(self, users: Collection[str]) -> tuple[float, dict[str, UserState]]: ...
    def submit_call(
        self, caller: Caller, tool: str, args: Mapping[str, Any], run_id: str | None = None
    ) -> Submitted: ...
    def call_record(self, tree_id: str) -> TaskRecord: ...
    def cancel(self, caller: Caller, tree_id: str, task_id: str | None = None) -> list[str]: ...
    def primary(self, caller: Caller, tool: str, args: Mapping[str, Any]) -> Any: ...


class Backend:
    """``GatewayBackend`` over the stack: the registry and presence the brain publishes in Redis,
    the store read-only, and the brain's door for what it must do (submit, cancel)."""

    def __init__(
        self,
        hot: HotState,
        store: Store,
        registry: RegistrySnapshot,
        settings: Settings,
        pool_config: list[PoolConfig],
    ) -> None:
        self.hot = hot
        self.store = store
        self.presence = PresenceBook(hot.r, store)
        self._registry = registry
        self.settings = settings
        self.pool_config = pool_config
        self.lock = threading.Lock()
        # Each user's state as of the watcher's last look (``state``).
        self._states: StateMemo = {}

    @classmethod
    def connect(cls, settings: Settings, redis_url: str, cwd: Path | None = None) -> Backend:
        """Connect to a running stack (raises StackNotRunning without a brain's registry)."""
        pools = load_tool_pools((cwd or Path.cwd()) / CONFIG_FILE)
        hot = HotState.from_url(redis_url)
        try:
            raw = hot.get_registry()
        except redis.RedisError as exc:
            hot.close()
            raise unreachable(redis_url, exc) from exc
        if raw is None:
            hot.close()
            raise StackNotRunning(
                f"no brain has published its registry in Redis at {redact_url(redis_url)}; start one with "
                "`vancetope up` (or `vancetope brain` beside an external Redis)"
            )
        store = open_store(settings.store, read_only=True)
        return cls(hot, store, RegistrySnapshot.model_validate(raw), settings, pools)

    def close(self) -> None:
        try:
            self.store.close()
        finally:
            self.hot.close()

    # --- who and what ----------------------------------------------------------------
    def user_of(self, token: str) -> str | None:
        return tokens.user_of(self.store, token)

    def registry(self) -> RegistrySnapshot:
        """The brain's published registry; a reload is picked up here, and routing follows it."""
        raw = self.hot.get_registry()
        current = self._registry
        if raw is not None and raw.get("loaded_at") != current.loaded_at:
            snapshot = RegistrySnapshot.model_validate(raw)
            with self.lock:
                self._registry = snapshot
            return snapshot
        return current

    def sessions(self) -> dict[str, ClientSession]:
        return self.presence.sessions()

    def view(self, user: str) -> UserView:
        registry = self.registry()
        own = user_sessions(self.sessions().values(), user)
        every = catalog(registry.tools, own, user, OWN_NAMES)
        # Resources, prompts and completion are routed as tools but listed by their own lists.
        tools = [t for t in every if surface_op(t.name) is None]
        return UserView(
            user=user,
            tools=tools,
            listing=listing(tools, self.settings.gateway_max_tools),
            pools=build_pools(tools, self.pool_config),
            sessions=own,
            surface=surface_of(every),
        )

    def offline_clients(self, user: str) -> tuple[str, ...]:
        """The user's enrolled clients that are not connected (client_id order): where a
        resource nobody offers now may be. A store read, so only asked on that miss."""
        connected = {s.client_id for s in user_sessions(self.sessions().values(), user)}
        enrolled = (e.client_id for e in self.store.list_enrollments() if e.user == user)
        return tuple(sorted(c for c in enrolled if c not in connected))

    def state(self, users: Collection[str]) -> tuple[float, dict[str, UserState]]:
        """(the registry's loaded_at, what each of ``users`` and each user with a connected
        client sees: their clients' sessions and a digest of their catalog): what list_changed
        follows. A small GET and one HGETALL (sessions parsed only when they changed); the
        snapshot itself is read only when it changed, and a user's catalog is built again only
        when it or their sessions changed."""
        published = self.hot.registry_loaded_at()
        registry = self._registry
        if published is None or published != registry.loaded_at:
            registry = self.registry()
        states = user_states(registry.tools, self.sessions().values(), users, OWN_NAMES, self._states)
        return registry.loaded_at, states

    # --- routed calls ----------------------------------------------------------------
    def submit_call(
        self, caller: Caller, tool: str, args: Mapping[str, Any], run_id: str | None = None
    ) -> Submitted:
        """Submit ``tool(args)`` as a one-task interactive tree of the caller, through the
        brain (``run_id``: the run's tree id, ``call_run_id``; None: the brain's choice). Raises
        InvalidTaskTree (every problem named) when the call cannot be valid, DoorRefused with
        the brain's words when it refuses."""
        registry = self.registry()
        own = user_sessions(self.sessions().values(), caller.user)
        announced = frozenset(n for s in own for n in s.tool_names(registry.tools))
        unknown = unknown_tool(tool, registry, announced)
        if unknown is not None:
            raise UnknownTool(unknown)
        spec = registry.tools.get(tool)
        wait_s = (
            (spec.max_wait_s if spec else None)
            or self.settings.max_wait_s
            or self.settings.gateway_max_wait_s
        )
        data = {
            "id": call_tree_id(tool),
            "max_wait_s": wait_s,
            "tasks": [{"id": CALL_TASK, "tool": tool, "args": dict(args)}],
        }
        tree = TaskTree.model_validate(data)
        # Checked here for the caller's sake (every problem named at once); the brain checks again.
        check_submission(
            tree,
            registry,
            source=f"tools/call {tool}",
            announced=announced,
            announced_schemas=announced_schemas(own, registry.tools),
        )
        reply = self._ask(
            caller, kind="submit", tree=data, session=SessionKind.INTERACTIVE, call=True, tree_id=run_id
        )
        assert reply.tree_id is not None
        return Submitted(tree_id=reply.tree_id, wait_s=wait_s)

    def call_record(self, tree_id: str) -> TaskRecord:
        rec = self.store.get_task(tree_id, CALL_TASK)
        if rec is None:
            raise BrainError(f"the gateway's call {tree_id!r} has no record in the store")
        return rec

    def cancel(self, caller: Caller, tree_id: str, task_id: str | None = None) -> list[str]:
        return self._ask(caller, kind="cancel", tree_id=tree_id, task_id=task_id).cancelled

    def _ask(self, caller: Caller, **fields: Any) -> door.GatewayReply:
        return door.ask(self.hot.r, ASK_TIMEOUT_S, token=caller.token, **fields)

    # --- the primary tools ----------------------------------------------------------
    def primary(self, caller: Caller, tool: str, args: Mapping[str, Any]) -> Any:
        """Answer one primary tool; raises Refused with what to do instead."""
        user = caller.user
        if tool == HEALTH:
            return self._health(user)
        if tool == SUBMIT_TREE:
            return self._submit_tree(caller, args.get("tree"), bool(args.get("autonomous", False)))
        if tool == TREE_STATUS:
            return self._tree_status(user, args.get("tree_id"))
        if tool == CANCEL:
            return self._cancel(caller, _text_arg(args, "tree_id"), args.get("task_id"))
        if tool == LIST_CLIENTS:
            return self._clients(user)
        raise Refused(f"{tool!r} is not a primary tool")

    def _health(self, user: str) -> dict[str, Any]:
        view = self.view(user)
        registry = self.registry()
        return {
            "status": "ok",
            "user": user,
            "registry": {
                "tools": len(registry.tools),
                "loaded_at": registry.loaded_at,
                "mcp_failures": [f.model_dump(mode="json") for f in registry.mcp_failures],
            },
            "clients_connected": [s.client_id for s in view.sessions],
            "tools": len(view.tools),
            "pooled": view.listing.pooled,
            "max_tools": self.settings.gateway_max_tools,
        }

    def _submit_tree(self, caller: Caller, data: Any, autonomous: bool) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise Refused("brain_submit_tree needs 'tree': the tree as an object {id, tasks: [...]}")
        check_tree_data(data, self.settings, source="brain_submit_tree")
        registry = self.registry()
        tree = tree_from_data(data, source="brain_submit_tree")
        own = user_sessions(self.sessions().values(), caller.user)
        announced = frozenset(n for s in own for n in s.tool_names(registry.tools))
        check_submission(
            tree,
            registry,
            source="brain_submit_tree",
            announced=announced,
            announced_schemas=announced_schemas(own, registry.tools),
        )
        session = SessionKind.AUTONOMOUS if autonomous else SessionKind.INTERACTIVE
        reply = self._ask(caller, kind="submit", tree=data, session=session)
        return {"tree_id": reply.tree_id, "session": session.value, "warnings": reply.warnings}

    def _own_tree(self, user: str, tree_id: str) -> Any:
        record = self.store.get_tree(tree_id)
        if record is None or record.user != user:
            # Another user's tree is as unknown as a tree that does not exist.
            raise Refused(f"no tree {tree_id!r} of yours; brain_tree_status without tree_id lists your trees")
        return record

    def _tree_status(self, user: str, tree_id: Any) -> Any:
        if tree_id is None:
            trees = [t for t in self.store.list_trees(limit=200) if t.user == user][:RECENT_TREES]
            counts = {t.tree_id: _counts(self.store.get_tasks(t.tree_id)) for t in trees}
            return {"trees": trees_report(trees, counts)}
        record = self._own_tree(user, str(tree_id))
        return tree_report(record, self.store.get_tasks(record.tree_id))

    def _cancel(self, caller: Caller, tree_id: str, task_id: Any) -> dict[str, Any]:
        self._own_tree(caller.user, tree_id)
        if task_id is not None and self.store.get_task(tree_id, str(task_id)) is None:
            raise Refused(f"tree {tree_id!r} has no task {task_id!r}")
        return {"cancelled": self.cancel(caller, tree_id, None if task_id is None else str(task_id))}

    def _clients(self, user: str) -> dict[str, Any]:
        sessions = self.sessions()
        enrolled = [e for e in self.store.list_enrollments() if e.user == user]
        return {
            "clients": [
                {
                    "client_id": e.client_id,
                    "connected": e.client_id in sessions,
                    "client_type": sessions[e.client_id].client_type if e.client_id in sessions else None,
                    "tools": sorted(t.name for t in sessions[e.client_id].tools)
                    if e.client_id in sessions
                    else [],
                }
                for e in enrolled
            ]
        }


def unknown_tool(tool: str, registry: RegistrySnapshot, announced: frozenset[str]) -> str | None:
    """Why ``tool`` is none of the caller's tools (pure), or None: nothing in the registry, no
    name a clash made ambiguous (its call fails saying which names to write), and none of the
    caller's own clients announces it. Suggestions come from those names only, never another
    user's clients'."""
    known = registry.tools.keys() | announced | registry.clashes.keys()
    if tool in known:
        return None
    return (
        f"Unknown tool: {tool!r} (no registry entry declares it and none of your connected clients "
        f"announces it){did_you_mean(tool, sorted(known))}{registry.failure_hint()}"
    )


def _text_arg(args: Mapping[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str) or not value:
        raise Refused(f"argument {name!r} is required (a string)")
    return value


def _counts(tasks: list[TaskRecord]) -> dict[str, int]:
    found: dict[str, int] = {}
    for t in tasks:
        found[t.state.value] = found.get(t.state.value, 0) + 1
    return found


__all__ = [
    "CALL_TASK",
    "Backend",
    "Caller",
    "Refused",
    "Submitted",
    "UnknownTool",
    "UserView",
    "call_tree_id",
    "unknown_tool",
]
