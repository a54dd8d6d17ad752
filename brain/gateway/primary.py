"""The gateway's own tools (layer: brain/gateway, pure data): the primary tools every user
sees, and the two that stand for the tool pools when a list would be too long (seed 004)."""

from __future__ import annotations

from typing import Any

from brain.core.models import Location
from brain.gateway.catalog import GatewayTool

BRAIN_POOL = "brain"
HEALTH = "brain_health"
SUBMIT_TREE = "brain_submit_tree"
TREE_STATUS = "brain_tree_status"
CANCEL = "brain_cancel"
LIST_CLIENTS = "brain_list_clients"
SPECIALIZED_CMD = "brain_specialized_cmd"
LIST_POOLS = "brain_list_pools"


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> GatewayTool:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return GatewayTool(
        name=name,
        description=description,
        input_schema=schema,
        pool=BRAIN_POOL,
        action=name.removeprefix("brain_"),
        location=Location.SERVER,
    )


_TREE_ID = {"type": "string", "description": "a tree id (a call that waits returns one)"}

PRIMARY: tuple[GatewayTool, ...] = (
    _tool(HEALTH, "Is the brain up: its registry, your connected clients, the pools.", {}, []),
    _tool(
        SUBMIT_TREE,
        "Submit a task tree (the YAML/JSON tree as an object: id, tasks) as an interactive session "
        "of yours; returns its tree id at once. Follow it with brain_tree_status.",
        {
            "tree": {
                "type": "object",
                "description": "the tree: {id, tasks: [{id, tool, args, depends_on}]}",
            },
            "autonomous": {"type": "boolean", "description": "run as an autonomous session (default false)"},
        },
        ["tree"],
    ),
    _tool(
        TREE_STATUS,
        "A tree's status and every task's state, result and whole MCP result (a queued call's "
        "result is fetched here); without tree_id, your recent trees.",
        {"tree_id": _TREE_ID},
        [],
    ),
    _tool(
        CANCEL,
        "Cancel a tree's unfinished tasks (or one task), parked work included.",
        {"tree_id": _TREE_ID, "task_id": {"type": "string"}},
        ["tree_id"],
    ),
    _tool(LIST_CLIENTS, "Your client agents: connected or not, with which tools.", {}, []),
)

ROUTER: tuple[GatewayTool, ...] = (
    _tool(
        SPECIALIZED_CMD,
        "Run a tool of a pool: pool is a pool's name, action a tool of it, params its arguments. "
        "brain_list_pools lists the pools and their actions and finds tools by words.",
        {
            "pool": {"type": "string"},
            "action": {"type": "string"},
            "params": {"type": "object", "description": "the tool's arguments"},
        },
        ["pool", "action"],
    ),
    _tool(
        LIST_POOLS,
        "List the tool pools (with pool: one pool's actions and their argument schemas); with query, "
        "the tools whose name or description holds every word of it.",
        {"pool": {"type": "string"}, "query": {"type": "string"}},
        [],
    ),
)

OWN_NAMES = frozenset(t.name for t in (*PRIMARY, *ROUTER))

__all__ = [
    "BRAIN_POOL", "CANCEL", "HEALTH", "LIST_CLIENTS", "LIST_POOLS", "OWN_NAMES", "PRIMARY", "ROUTER",
    "SPECIALIZED_CMD", "SUBMIT_TREE", "TREE_STATUS",
]  # fmt: skip
