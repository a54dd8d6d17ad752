"""The active registry of one user, as an MCP client sees it (layer: brain/gateway, pure).

Seed 000 §5: the server's tools (the brain's registry snapshot) + the tools of the user's
connected clients = the active registry. Each tool is listed once, under a name the router
understands (``brain.core.toolnames``): an MCP tool under its bare name while nothing else has it,
else as ``<server>.<tool>``; never a name the MCP spec forbids. A registry tool that runs only on a workstation is *available*
only while one of the user's clients offers it; it stays in the catalog (the pools say it is
offline) and a call to it is routed anyway, so its ``offline_strategy`` applies. Never
another user's client.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from brain.core.models import Location, ToolSpec
from brain.core.sessions import ClientSession, user_sessions
from brain.core.toolnames import spec_name_problem
from workers.contracts import (
    TOOL_METADATA_FIELDS,
    McpSurface,
    ToolAnnotationsWire,
    ToolDescriptor,
    ToolExecutionWire,
    ToolIconsWire,
    ToolMeta,
    ToolOutputSchema,
    ToolTitle,
    ToolType,
    surface_op,
)
from workers.toolnames import is_qualified, name_on_server, qualified

BUILTIN_POOL = "builtin"
NATIVE_POOL = "native"


class GatewayTool(BaseModel):
    """One tool of a user's catalog."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str  # what tools/list shows and tools/call takes: a name the router understands
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    pool: str  # its default pool: its MCP server's name, "builtin" or "native"
    action: str  # its name within that pool (the name its server knows it by)
    location: Location
    # The user's connected clients that offer it (client_id order).
    clients: tuple[str, ...] = ()
    # False: it runs only on a workstation and no connected client of the user offers it.
    available: bool = True
    # What its MCP server said of it besides (title, annotations, icons, outputSchema,
    # execution, _meta), as it said it: tools/list hands it on whole.
    title: ToolTitle = None
    output_schema: ToolOutputSchema = None
    annotations: ToolAnnotationsWire = None
    icons: ToolIconsWire = None
    execution: ToolExecutionWire = None
    meta: ToolMeta = None
    # A surface tool's (``<server>#read_resource``…): the resources or prompts its server
    # listed. Never in tools/list; resources/list and prompts/list are made of these.
    surface: McpSurface | None = None


def default_pool(tool_type: ToolType, mcp_server: str | None) -> str:
    if tool_type is ToolType.MCP and mcp_server:
        return mcp_server
    return NATIVE_POOL if tool_type is ToolType.NATIVE else BUILTIN_POOL


def catalog(
    registry: Mapping[str, ToolSpec],
    sessions: Iterable[ClientSession],
    user: str,
    reserved: frozenset[str] = frozenset(),
) -> list[GatewayTool]:
    """Every tool ``user`` may call: the registry's, then those only the user's clients offer.
    A name in ``reserved`` (the gateway's own tools) is never given to another tool: an MCP
    tool of that bare name is listed as ``<server>.<tool>``, any other is left out. So is a
    name strict hosts refuse (``spec_name_problem``: a client's tool named with a space)."""
    own = user_sessions(sessions, user)
    offers = {
        name: tuple(s.client_id for s in own if name in s.tool_names(registry))
        for s in own
        for name in s.tool_names(registry)
    }
    listed = [
        _from_spec(_unreserved(name, spec, reserved), spec, offers)
        for name, spec in _registry_entries(registry)
    ]
    listed = [t for t in listed if t.name not in reserved and _listable(t.name)]
    taken = {t.name for t in listed} | set(reserved)
    for desc, clients in _client_only(registry, own):
        name = _qualified_name(desc) if is_qualified(desc.name, desc.mcp_server) else desc.name
        if name in taken and desc.mcp_server:
            name = _qualified_name(desc)
        if name in taken or not _listable(name):
            continue  # a second client-only tool of this name and no server to tell them apart
        taken.add(name)
        listed.append(_from_descriptor(name, desc, clients))
    return _with_announced_surfaces(listed, own)


def _listable(name: str) -> bool:
    """A name strict hosts accept, or a surface tool's (``S#read_resource``), which tools/list
    never shows: resources/list and prompts/list are made of those."""
    return spec_name_problem(name) is None or surface_op(name) is not None


def _with_announced_surfaces(listed: list[GatewayTool], own: list[ClientSession]) -> list[GatewayTool]:
    """A registry entry for a client's surface tool (``vault#read_resource`` with ``location:
    client``, so that reads park while the laptop is closed) lists nothing of its own: what the
    connected client announced of it is what its server has."""
    announced = {d.name: d.surface for s in own for d in s.tools if d.surface is not None}
    return [
        t.model_copy(update={"surface": announced[t.name]})
        if t.surface is None and t.name in announced
        else t
        for t in listed
    ]


def _registry_entries(registry: Mapping[str, ToolSpec]) -> list[tuple[str, ToolSpec]]:
    """One entry per tool: an MCP tool registered both bare and qualified is listed under its
    bare name, which means it and nothing else."""
    entries: list[tuple[str, ToolSpec]] = []
    for name, spec in sorted(registry.items()):
        if spec.type is ToolType.MCP and is_qualified(name, spec.mcp_server):
            bare = registry.get(name_on_server(name, spec.mcp_server))
            if bare is not None and bare.mcp_server == spec.mcp_server:
                continue
        entries.append((name, spec))
    return entries


def _unreserved(name: str, spec: ToolSpec, reserved: frozenset[str]) -> str:
    if name in reserved and spec.type is ToolType.MCP and spec.mcp_server:
        return qualified(spec.mcp_server, name_on_server(name, spec.mcp_server))
    return name


def _from_spec(name: str, spec: ToolSpec, offers: Mapping[str, tuple[str, ...]]) -> GatewayTool:
    clients = offers.get(name, ()) if spec.location is not Location.SERVER else ()
    return GatewayTool(
        name=name,
        description=spec.description,
        input_schema=spec.input_schema,
        pool=default_pool(spec.type, spec.mcp_server),
        action=name_on_server(name, spec.mcp_server) if spec.type is ToolType.MCP else name,
        location=spec.location,
        clients=clients,
        available=spec.location is not Location.CLIENT or bool(clients),
        **_metadata(spec),
    )


def _client_only(
    registry: Mapping[str, ToolSpec], sessions: list[ClientSession]
) -> list[tuple[ToolDescriptor, tuple[str, ...]]]:
    """Tools the clients announced that the registry does not describe, each once (the same
    tool on two clients of the user is one tool: the router picks the least loaded)."""
    found: dict[tuple[str | None, str], tuple[ToolDescriptor, tuple[str, ...]]] = {}
    for session in sessions:
        for desc in session.tools:
            if _described_by_registry(registry, desc):
                continue
            key = (desc.mcp_server, desc.name)
            first, clients = found.get(key, (desc, ()))
            found[key] = (first, (*clients, session.client_id))
    return [found[key] for key in sorted(found, key=lambda k: (k[1], k[0] or ""))]


def _described_by_registry(registry: Mapping[str, ToolSpec], desc: ToolDescriptor) -> bool:
    """The registry governs this announced tool: it is listed from the registry, not again from
    the client. A native tool named like a registry tool is that tool (or, for a server-only
    name, one whose calls never reach the client); an MCP tool is its server's own."""
    if desc.mcp_server:
        if _qualified_name(desc) in registry:
            return True
        bare = registry.get(desc.name)
        return bare is not None and bare.mcp_server == desc.mcp_server
    return desc.name in registry


def _qualified_name(desc: ToolDescriptor) -> str:
    """``<server>.<tool>`` of a client's MCP tool (the agent may have announced it so already,
    or, an older agent, as ``<server>/<tool>``)."""
    assert desc.mcp_server
    return qualified(desc.mcp_server, name_on_server(desc.name, desc.mcp_server))


def _from_descriptor(name: str, desc: ToolDescriptor, clients: tuple[str, ...]) -> GatewayTool:
    return GatewayTool(
        name=name,
        description=desc.description,
        input_schema=desc.input_schema,
        pool=default_pool(desc.type, desc.mcp_server),
        action=name_on_server(desc.name, desc.mcp_server),
        location=Location.CLIENT,
        clients=clients,
        **_metadata(desc),
    )


def _metadata(tool: ToolSpec | ToolDescriptor) -> dict[str, Any]:
    return {name: getattr(tool, name) for name in (*TOOL_METADATA_FIELDS, "surface")}


# What list_changed follows for one user: their connected clients (client_id, session_id) and
# a digest of their catalog (``catalog_digest``).
UserState = tuple[frozenset[tuple[str, str]], str]


def catalog_digest(tools: Iterable[GatewayTool]) -> str:
    """A digest of what a user sees of these tools: each one's name and definition (description,
    input schema, metadata), whether it is available and which of the user's clients offer it.
    Any change to what tools/list or the pools show changes it."""
    seen = [t.model_dump(mode="json") for t in tools]
    return hashlib.sha256(json.dumps(seen, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# user -> (the registry and the user's sessions a state was computed from, that state)
StateMemo = dict[str, tuple[Mapping[str, ToolSpec], tuple[ClientSession, ...], UserState]]


def user_states(
    registry: Mapping[str, ToolSpec],
    sessions: Iterable[ClientSession],
    users: Iterable[str],
    reserved: frozenset[str] = frozenset(),
    memo: StateMemo | None = None,
) -> dict[str, UserState]:
    """Each of ``users``, and each user with a connected client: their clients' sessions and
    the digest of their catalog. A client that re-announces other tools in the same session, a
    held tool approved, a tool whose definition changed: each changes the digest.

    With ``memo`` (kept by the caller between looks, and updated here), a user whose sessions
    are equal to last time's, against the same registry mapping, keeps last time's state
    without building their catalog again (equal sessions, parsed once, are the same objects)."""
    sessions = list(sessions)
    states: dict[str, UserState] = {}
    kept: StateMemo = {}
    for user in sorted(set(users) | {s.user for s in sessions}):
        own = tuple(user_sessions(sessions, user))
        known = memo.get(user) if memo is not None else None
        if known is not None and known[0] is registry and known[1] == own:
            state = known[2]
        else:
            present = frozenset((s.client_id, s.session_id) for s in own)
            state = (present, catalog_digest(catalog(registry, own, user, reserved)))
        states[user] = state
        kept[user] = (registry, own, state)
    if memo is not None:
        memo.clear()
        memo.update(kept)
    return states


__all__ = [
    "BUILTIN_POOL",
    "NATIVE_POOL",
    "GatewayTool",
    "StateMemo",
    "UserState",
    "catalog",
    "catalog_digest",
    "default_pool",
    "user_states",
]
