"""What the gateway asks of the stack (layer: brain/gateway, Redis/store glue; synchronous,
run in worker threads by ``brain.gateway.server``).

A routed call is a one-task tree submitted as an *interactive session* of the token's user,
with no client bound: the router picks the user's least loaded connected client offering the
tool, or the server pool, and applies the tool's offline strategy (seed 000 §4) — the same
path as any tree, so the store records it and ``brain_tree_status`` finds it later. The
scheduler is not made for concurrent use: submits and cancels hold one lock.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brain.config import CONFIG_FILE, Settings
from brain.errors import BrainError
from brain.gateway import tokens
from brain.gateway.catalog import GatewayTool, catalog, user_sessions
from brain.gateway.pools import Listing, Pool, PoolConfig, build_pools, listing, load_tool_pools
from brain.gateway.primary import CANCEL, HEALTH, LIST_CLIENTS, OWN_NAMES, SUBMIT_TREE, TREE_STATUS
from brain.models import MAX_TREE_ID_CHARS, SessionKind, TaskRecord, TaskSpec, TaskTree
from brain.presence import ClientSession
from brain.registry import RegistrySnapshot
from brain.report import tree_report, trees_report
from brain.service import Brain
from brain.submission import check_submission
from brain.treefile import tree_from_data

CALL_TASK = "call"
# Trees of a user that brain_tree_status lists without a tree id.
RECENT_TREES = 20


class Refused(BrainError):
    """A primary tool's call that cannot be served; the text tells the caller what to do."""


@dataclass(frozen=True)
class UserView:
    """What one user sees now: the catalog, the tools/list, the pools."""

    user: str
    tools: list[GatewayTool]
    listing: Listing
    pools: dict[str, Pool]
    sessions: list[ClientSession]


@dataclass(frozen=True)
class Submitted:
    tree_id: str
    # How long a blocked call waits for a client before the gateway gives up on it.
    wait_s: float


def call_tree_id(tool: str) -> str:
    """The tree id of a call of ``tool`` (the run id adds a time and a token)."""
    return ("mcp-" + re.sub(r"[^A-Za-z0-9_.:-]", ".", tool))[:MAX_TREE_ID_CHARS]


class Backend:
    def __init__(self, brain: Brain, settings: Settings, pool_config: list[PoolConfig]) -> None:
        self.brain = brain
        self.settings = settings
        self.pool_config = pool_config
        self.lock = threading.Lock()

    @classmethod
    def connect(cls, settings: Settings, redis_url: str, cwd: Path | None = None) -> Backend:
        """Connect to a running stack (raises StackNotRunning without a brain's registry)."""
        pools = load_tool_pools((cwd or Path.cwd()) / CONFIG_FILE)
        return cls(Brain.connect(settings, redis_url), settings, pools)

    def close(self) -> None:
        self.brain.close()

    # --- who and what ----------------------------------------------------------------
    def user_of(self, token: str) -> str | None:
        return tokens.user_of(self.brain.store, token)

    def registry(self) -> RegistrySnapshot:
        """The brain's published registry; a reload is picked up here, and routing follows it."""
        raw = self.brain.hot.get_registry()
        current = self.brain.scheduler.registry
        if raw is not None and raw.get("loaded_at") != current.loaded_at:
            snapshot = RegistrySnapshot.model_validate(raw)
            with self.lock:
                self.brain.scheduler.registry = snapshot
            return snapshot
        return current

    def sessions(self) -> dict[str, ClientSession]:
        return self.brain.scheduler.presence.sessions()

    def view(self, user: str) -> UserView:
        registry = self.registry()
        own = user_sessions(self.sessions().values(), user)
        tools = catalog(registry.tools, own, user, OWN_NAMES)
        return UserView(
            user=user,
            tools=tools,
            listing=listing(tools, self.settings.gateway_max_tools),
            pools=build_pools(tools, self.pool_config),
            sessions=own,
        )

    def state(self) -> tuple[float, dict[str, frozenset[tuple[str, str]]]]:
        """(the registry's loaded_at, each user's connected client sessions): what list_changed
        follows. A small GET and one HGETALL; the snapshot itself is read only when it changed."""
        published = self.brain.hot.registry_loaded_at()
        registry = self.brain.scheduler.registry
        if published is None or published != registry.loaded_at:
            registry = self.registry()
        per_user: dict[str, set[tuple[str, str]]] = {}
        for s in self.sessions().values():
            per_user.setdefault(s.user, set()).add((s.client_id, s.session_id))
        return registry.loaded_at, {user: frozenset(found) for user, found in per_user.items()}

    # --- routed calls ----------------------------------------------------------------
    def submit_call(self, user: str, tool: str, args: Mapping[str, Any]) -> Submitted:
        """Submit ``tool(args)`` as a one-task interactive tree of ``user``. Raises
        InvalidTaskTree (every problem named) when the call cannot be valid."""
        registry = self.registry()
        spec = registry.tools.get(tool)
        wait_s = (
            (spec.max_wait_s if spec else None)
            or self.settings.max_wait_s
            or self.settings.gateway_max_wait_s
        )
        tree = TaskTree(
            id=call_tree_id(tool),
            max_wait_s=wait_s,
            tasks=[TaskSpec(id=CALL_TASK, tool=tool, args=dict(args))],
        )
        announced = frozenset(
            n for s in user_sessions(self.sessions().values(), user) for n in s.tool_names()
        )
        check_submission(tree, registry, source=f"tools/call {tool}", announced=announced)
        with self.lock:
            record = self.brain.scheduler.submit(tree, session=SessionKind.INTERACTIVE, user=user)
        return Submitted(tree_id=record.tree_id, wait_s=wait_s)

    def call_record(self, tree_id: str) -> TaskRecord:
        rec = self.brain.store.get_task(tree_id, CALL_TASK)
        if rec is None:
            raise BrainError(f"the gateway's call {tree_id!r} has no record in the store")
        return rec

    def cancel(self, tree_id: str, task_id: str | None = None) -> list[str]:
        with self.lock:
            return self.brain.sweeps.cancel(tree_id, task_id)

    # --- the primary tools ----------------------------------------------------------
    def primary(self, user: str, tool: str, args: Mapping[str, Any]) -> Any:
        """Answer one primary tool; raises Refused with what to do instead."""
        if tool == HEALTH:
            return self._health(user)
        if tool == SUBMIT_TREE:
            return self._submit_tree(user, args.get("tree"), bool(args.get("autonomous", False)))
        if tool == TREE_STATUS:
            return self._tree_status(user, args.get("tree_id"))
        if tool == CANCEL:
            return self._cancel(user, _text_arg(args, "tree_id"), args.get("task_id"))
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

    def _submit_tree(self, user: str, data: Any, autonomous: bool) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise Refused("brain_submit_tree needs 'tree': the tree as an object {id, tasks: [...]}")
        registry = self.registry()
        tree = tree_from_data(data, source="brain_submit_tree")
        announced = frozenset(
            n for s in user_sessions(self.sessions().values(), user) for n in s.tool_names()
        )
        warnings = check_submission(tree, registry, source="brain_submit_tree", announced=announced)
        session = SessionKind.AUTONOMOUS if autonomous else SessionKind.INTERACTIVE
        with self.lock:
            record = self.brain.scheduler.submit(tree, session=session, user=user)
        return {"tree_id": record.tree_id, "session": session.value, "warnings": warnings}

    def _own_tree(self, user: str, tree_id: str) -> Any:
        record = self.brain.store.get_tree(tree_id)
        if record is None or record.user != user:
            # Another user's tree is as unknown as a tree that does not exist.
            raise Refused(f"no tree {tree_id!r} of yours; brain_tree_status without tree_id lists your trees")
        return record

    def _tree_status(self, user: str, tree_id: Any) -> Any:
        if tree_id is None:
            trees = [t for t in self.brain.store.list_trees(limit=200) if t.user == user][:RECENT_TREES]
            counts = {t.tree_id: _counts(self.brain.store.get_tasks(t.tree_id)) for t in trees}
            return {"trees": trees_report(trees, counts)}
        record = self._own_tree(user, str(tree_id))
        return tree_report(record, self.brain.store.get_tasks(record.tree_id))

    def _cancel(self, user: str, tree_id: str, task_id: Any) -> dict[str, Any]:
        self._own_tree(user, tree_id)
        if task_id is not None and self.brain.store.get_task(tree_id, str(task_id)) is None:
            raise Refused(f"tree {tree_id!r} has no task {task_id!r}")
        return {"cancelled": self.cancel(tree_id, None if task_id is None else str(task_id))}

    def _clients(self, user: str) -> dict[str, Any]:
        sessions = self.sessions()
        enrolled = [e for e in self.brain.store.list_enrollments() if e.user == user]
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


__all__ = ["CALL_TASK", "Backend", "Refused", "Submitted", "UserView", "call_tree_id"]
