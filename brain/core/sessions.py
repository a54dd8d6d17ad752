"""A connected client's session and the checks on its announcement (layer: brain/core; pure).

The Redis side (who is connected now, enrollments from the store) is ``brain.hot.presence``;
what a session is, and whether an announcement may become one, needs neither.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from brain.core.models import Enrollment, ToolSpec
from brain.core.toolnames import bare_name_taken, client_clashes
from workers.contracts import MAX_ANNOUNCED_TOOLS, ClientConnected, ClientType, ToolDescriptor, surface_op
from workers.toolnames import is_qualified, name_on_server, qualified


class ClientSession(BaseModel):
    """A connected client: its accepted announcement."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    client_id: str
    user: str
    session_id: str
    client_type: ClientType
    tools: list[ToolDescriptor] = Field(default_factory=list)
    connected_at: float
    # Announced with a definition that changed since it was pinned: not routed to until
    # `vancetope clients approve-tools` (brain.hot.toolpins).
    held_tools: list[ToolDescriptor] = Field(default_factory=list)

    def tool(self, name: str, registry: Mapping[str, ToolSpec] | None = None) -> ToolDescriptor | None:
        """The announced tool ``name`` names: its bare name, or ``<mcp server>.<tool>``."""
        return next((t for t in self.tools if name in names_of(t, registry)), None)

    def tool_names(self, registry: Mapping[str, ToolSpec] | None = None) -> frozenset[str]:
        """Every name a task may use for this client's tools (brain.core.toolnames); with the
        registry, an MCP tool whose bare name the registry gives to another tool answers to
        ``<server>.<tool>`` only, so this client never counts as offering the registry's."""
        return frozenset(n for t in self.tools for n in names_of(t, registry))

    def clashes(self, registry: Mapping[str, ToolSpec]) -> dict[str, list[str]]:
        """Its MCP tools whose bare name the registry gives to another tool (``clash_lines``)."""
        return client_clashes(registry, self.tools)


def names_of(tool: ToolDescriptor, registry: Mapping[str, ToolSpec] | None = None) -> tuple[str, ...]:
    """A client's MCP tool answers to ``<server>.<tool>`` too, so a task can name the one it
    means whatever else (a built-in, another server) shares its bare name; to that name only
    when the registry gives the bare one to another tool. A tool the agent already announced
    as ``<server>.<tool>`` (its bare name is the agent's native tool's) has that name only; an
    older agent announced it as ``<server>/<tool>``, which it keeps answering to as well."""
    if not tool.mcp_server or surface_op(tool.name) is not None:
        return (tool.name,)  # a surface tool's name holds its server already
    full = qualified(tool.mcp_server, name_on_server(tool.name, tool.mcp_server))
    if is_qualified(tool.name, tool.mcp_server):
        return tuple(dict.fromkeys((full, tool.name)))
    if registry is not None and bare_name_taken(registry, tool):
        return (full,)
    return (tool.name, full)


def announced_schemas(
    sessions: Iterable[ClientSession], registry: Mapping[str, ToolSpec] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Every name the sessions' tools answer to -> the input schemas announced for it, each
    distinct one once (in session order): what a call's arguments are checked against when
    only clients describe its tool (brain.core.validation.announced_arg_problems)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for session in sessions:
        for tool in session.tools:
            for name in names_of(tool, registry):
                schemas = found.setdefault(name, [])
                if tool.input_schema not in schemas:
                    schemas.append(tool.input_schema)
    return found


def check_announcement(msg: ClientConnected, owner: str, enrollment: Enrollment | None) -> str | None:
    """Why an announcement is refused, or None. Pure: the relay logs and acks the answer."""
    if enrollment is None:
        return f"client {owner!r} is not enrolled; run `vancetope clients enroll {owner} --user NAME` on the brain"
    if msg.client_id != owner:
        return f"announcement names client {msg.client_id!r} but came through {owner!r}'s outbox"
    if len(msg.available_tools) > MAX_ANNOUNCED_TOOLS:
        return f"{len(msg.available_tools)} tools announced; at most {MAX_ANNOUNCED_TOOLS}"
    names = [t.name for t in msg.available_tools]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        return f"tools announced twice: {', '.join(dupes)}"
    return None


def user_sessions(sessions: Iterable[ClientSession], user: str) -> list[ClientSession]:
    """The connected clients of ``user`` only, in client_id order."""
    return sorted((s for s in sessions if s.user == user), key=lambda s: s.client_id)


def held_names(sessions: Mapping[str, ClientSession], client_ids: Collection[str]) -> frozenset[str]:
    """Tools these clients announced with a definition that changed since it was pinned: known
    (a tree may name them; its route says to approve them), but not routed to until approved."""
    return frozenset(
        n for cid in client_ids if (s := sessions.get(cid)) for t in s.held_tools for n in names_of(t)
    )
