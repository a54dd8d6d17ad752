"""Resources, prompts and completion of one MCP server (layer: workers; SDK glue).

What a server offers beside tools is routed like a tool (``workers.contracts.surface_tool``):
discovery lists it into surface descriptors, and a call of ``S#read_resource``,
``S#get_prompt`` or ``S#complete`` runs the one request it names on the server's session. The
result goes back as the MCP result's JSON (what the gateway hands on whole and a tree reads as
``${tasks.<id>.result.contents}``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from mcp import Client, types
from pydantic import ValidationError

from workers.contracts import (
    COMPLETE,
    GET_PROMPT,
    MAX_SURFACE_ITEMS,
    READ_RESOURCE,
    McpSurface,
    ToolDescriptor,
    ToolType,
    surface_tool,
)
from workers.errors import ToolFailed

_PAGE_CAP = 20

# What each surface tool takes: the arguments a tree writes and the gateway sends.
READ_RESOURCE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "uri": {"type": "string", "minLength": 1},
        # Also subscribe to it upstream, when the server can (the gateway's resources/subscribe).
        "subscribe": {"type": "boolean"},
    },
    "required": ["uri"],
    "additionalProperties": False,
}
GET_PROMPT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "arguments": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "required": ["name"],
    "additionalProperties": False,
}
COMPLETE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "ref": {"type": "object"},
        "argument": {"type": "object"},
        "context": {"type": "object"},
    },
    "required": ["ref", "argument"],
    "additionalProperties": False,
}
SCHEMAS = {READ_RESOURCE: READ_RESOURCE_SCHEMA, GET_PROMPT: GET_PROMPT_SCHEMA, COMPLETE: COMPLETE_SCHEMA}
_WHAT = {
    READ_RESOURCE: "reads a resource of MCP server {server!r} (resources/read)",
    GET_PROMPT: "gets a prompt of MCP server {server!r} (prompts/get)",
    COMPLETE: "completes an argument of a prompt or resource template of MCP server {server!r}",
}


async def _pages(fetch: Callable[[str | None], Awaitable[Any]], field: str) -> tuple[list[Any], bool]:
    """Every item of a paginated list, up to MAX_SURFACE_ITEMS (and whether more were left)."""
    items: list[Any] = []
    cursor: str | None = None
    for _ in range(_PAGE_CAP):
        page = await fetch(cursor)
        items.extend(getattr(page, field))
        cursor = page.next_cursor
        if cursor is None or len(items) > MAX_SURFACE_ITEMS:
            break
    more = cursor is not None or len(items) > MAX_SURFACE_ITEMS
    return items[:MAX_SURFACE_ITEMS], more


def _wire(items: list[Any]) -> list[dict[str, Any]]:
    return [i.model_dump(mode="json", by_alias=True, exclude_none=True) for i in items]


def _descriptor(server: str, op: str, surface: McpSurface | None = None) -> ToolDescriptor:
    return ToolDescriptor(
        name=surface_tool(server, op),
        type=ToolType.MCP,
        mcp_server=server,
        description=_WHAT[op].format(server=server),
        input_schema=SCHEMAS[op],
        surface=surface,
    )


async def list_surface(server: str, client: Client) -> list[ToolDescriptor]:
    """The surface tools of a connected server, by the capabilities it declared and what it
    listed: none for a server of tools only, nor for one that declares resources or prompts
    and lists none (MCPServer declares both whatever it has), and completion only beside
    prompts or resource templates, the only things it completes."""
    caps = client.server_capabilities
    found: list[ToolDescriptor] = []
    if caps.resources is not None:
        resources, more = await _pages(
            lambda c: client.list_resources(cursor=c, cache_mode="refresh"), "resources"
        )
        templates, more_t = await _pages(
            lambda c: client.list_resource_templates(cursor=c, cache_mode="refresh"), "resource_templates"
        )
        if resources or templates:
            listed = McpSurface(
                resources=_wire(resources), resource_templates=_wire(templates), truncated=more or more_t
            )
            found.append(_descriptor(server, READ_RESOURCE, listed))
    if caps.prompts is not None:
        prompts, more = await _pages(lambda c: client.list_prompts(cursor=c, cache_mode="refresh"), "prompts")
        if prompts:
            found.append(_descriptor(server, GET_PROMPT, McpSurface(prompts=_wire(prompts), truncated=more)))
    if caps.completions is not None and found:
        found.append(_descriptor(server, COMPLETE))
    return found


async def request(server: str, client: Client, op: str, args: dict[str, Any]) -> dict[str, Any]:
    """Run one surface request; its result as the MCP result's JSON."""
    result: types.Result
    if op == READ_RESOURCE:
        result = await client.read_resource(str(args["uri"]), cache_mode="bypass")
    elif op == GET_PROMPT:
        arguments = {str(k): str(v) for k, v in (args.get("arguments") or {}).items()}
        result = await client.get_prompt(str(args["name"]), arguments or None)
    elif op == COMPLETE:
        try:
            ref: types.PromptReference | types.ResourceTemplateReference
            raw_ref = args["ref"]
            if raw_ref.get("type") == "ref/prompt":
                ref = types.PromptReference.model_validate(raw_ref)
            else:
                ref = types.ResourceTemplateReference.model_validate(raw_ref)
            argument = {str(k): str(v) for k, v in dict(args["argument"]).items()}
            context = {str(k): str(v) for k, v in dict(args.get("context") or {}).items()} or None
        except (ValidationError, TypeError, ValueError) as exc:
            raise ToolFailed(f"completion/complete: bad ref or argument: {exc}", server=server) from None
        result = await client.complete(ref=ref, argument=argument, context_arguments=context)
    else:
        raise ToolFailed(f"MCP server {server!r} has no request {op!r}", server=server)
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


__all__ = ["SCHEMAS", "list_surface", "request"]
