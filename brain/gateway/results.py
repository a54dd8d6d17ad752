"""A task's record as an MCP tool result (layer: brain/gateway, pure).

A tool that ran and failed is a *result* (``isError``), never a protocol error: the MCP
client's model reads the words. An MCP tool's whole ``CallToolResult`` (``TaskRecord.mcp``) is
returned as the server sent it; a built-in's or native tool's value becomes a text block
(JSON) and ``structuredContent``.
"""

from __future__ import annotations

import json
from typing import Any

from mcp import types
from mcp.shared.exceptions import MCPError

from brain.core.models import TaskRecord, TaskState
from brain.gateway.primary import TREE_STATUS


def text_result(
    text: str, *, error: bool = False, structured: dict[str, Any] | None = None
) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], is_error=error, structured_content=structured
    )


def value_result(value: Any) -> types.CallToolResult:
    """A plain value (a built-in's result, a primary tool's answer): JSON text + structuredContent."""
    text = value if isinstance(value, str) else json.dumps(value, indent=1, default=str)
    structured = value if isinstance(value, dict) else {"result": value}
    return text_result(text, structured=structured)


def final_result(rec: TaskRecord) -> types.CallToolResult:
    """The result of a task that reached a final state."""
    if rec.state is TaskState.DONE:
        if rec.mcp is not None:
            return types.CallToolResult.model_validate(rec.mcp, by_name=False)
        return value_result(rec.result)
    where = f" (tree {rec.tree_id}, task {rec.task_id})"
    if rec.state is TaskState.FAILED:
        message = rec.error.message if rec.error is not None else rec.reason
        return text_result(f"tool {rec.tool!r} failed: {message}{where}", error=True)
    return text_result(f"tool {rec.tool!r} {rec.state.value}: {rec.reason}{where}", error=True)


def queued_result(rec: TaskRecord) -> types.CallToolResult:
    """A call parked as pending_client (offline_strategy queue): the caller fetches it later."""
    return text_result(
        f"{rec.reason}. The call waits in the queue for one of your clients; its task id is "
        f"{rec.tree_id}/{rec.task_id}: fetch its result later with {TREE_STATUS} "
        f'{{"tree_id": "{rec.tree_id}"}}.',
        structured={"tree_id": rec.tree_id, "task_id": rec.task_id, "state": rec.state.value},
    )


def waited_result(rec: TaskRecord, waited_s: float) -> types.CallToolResult:
    """A block-strategy call whose client did not come within its wait: the router's words."""
    return text_result(
        f"{rec.reason} (waited {waited_s:g}s; no client of yours offering {rec.tool!r} connected, so the "
        "call was cancelled). Start the client agent and call again.",
        error=True,
    )


# The spec's error for a resource no server has (MCP 2025-11-25, resources: error handling).
RESOURCE_NOT_FOUND = -32002


def surface_value(kind: str, rec: TaskRecord, waited_s: float) -> Any:
    """The value of a routed resources/read, prompts/get or completion/complete (the MCP
    result's JSON); else the protocol error these requests have instead of an error result,
    with the router's words: parked for a client, not come within its wait, failed (with the
    upstream server's own error code when it sent one)."""
    if kind == "final" and rec.state is TaskState.DONE:
        return rec.result
    code, where = types.INTERNAL_ERROR, f" (tree {rec.tree_id})"
    if kind == "queued":
        message = (
            f"{rec.reason}. The request waits in the queue for one of your clients{where}; ask again "
            "once that client is connected"
        )
    elif kind == "waited":
        message = f"{rec.reason} (waited {waited_s:g}s; no client of yours that has it connected). Start the client agent and ask again"
    elif rec.state is TaskState.FAILED and rec.error is not None:
        message = rec.error.message + where
        upstream = rec.error.data.get("code")
        if isinstance(upstream, int) and not isinstance(upstream, bool):
            code = upstream
    else:
        message = f"{rec.state.value}: {rec.reason}{where}"
    raise MCPError(code, message)


__all__ = [
    "RESOURCE_NOT_FOUND",
    "final_result",
    "queued_result",
    "surface_value",
    "text_result",
    "value_result",
    "waited_result",
]
