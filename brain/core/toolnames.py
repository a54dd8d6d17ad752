"""Tool names that never collide silently (layer: brain/core; pure).

Every tool an MCP server offers is registered as ``<server>/<tool>``; its bare name is
kept too when nothing else has it. A bare name two sources offer is a clash: a built-in
keeps its bare name (an MCP server cannot replace it unnoticed), and a name two MCP
servers share has no bare form at all, only the qualified ones. Clashes are returned so
that the brain logs them and ``vancetope explain`` shows them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from brain.core.models import ToolSpec

SEPARATOR = "/"


def qualified(server: str, tool: str) -> str:
    return f"{server}{SEPARATOR}{tool}"


def name_on_server(name: str) -> str:
    """The name an MCP server knows a tool by: the part after ``<server>/``, if any."""
    return name.split(SEPARATOR, 1)[1] if SEPARATOR in name else name


@dataclass(frozen=True)
class Placed:
    tools: dict[str, ToolSpec]
    # bare name -> who offers it ("built-in", "<server>/<tool>"), for every bare name offered twice
    clashes: dict[str, list[str]] = field(default_factory=dict)


def place(builtins: Mapping[str, ToolSpec], discovered: Iterable[ToolSpec]) -> Placed:
    """Built-ins under their names, MCP tools under ``<server>/<tool>`` and, when unique, bare."""
    tools = dict(builtins)
    offers: dict[str, list[ToolSpec]] = {}
    for spec in discovered:
        server = spec.mcp_server or "?"
        tools[qualified(server, spec.name)] = spec.model_copy(update={"name": qualified(server, spec.name)})
        offers.setdefault(spec.name, []).append(spec)
    clashes: dict[str, list[str]] = {}
    for bare, specs in offers.items():
        if bare not in builtins and len(specs) == 1:
            tools[bare] = specs[0]
            continue
        who = (["built-in"] if bare in builtins else []) + [
            qualified(s.mcp_server or "?", bare) for s in specs
        ]
        clashes[bare] = who
    return Placed(tools, clashes)


def clash_lines(clashes: Mapping[str, list[str]]) -> list[str]:
    """One sentence per clash: who offers the name, what the bare name means, what to write."""
    lines = []
    for bare, who in sorted(clashes.items()):
        others = [w for w in who if w != "built-in"]
        if "built-in" in who:
            meaning = f"{bare!r} is the built-in; write {' or '.join(repr(o) for o in others)} for the other"
        else:
            meaning = f"{bare!r} alone names none of them; write {' or '.join(repr(o) for o in others)}"
        lines.append(f"tool name {bare!r} is offered by {', '.join(who)}: {meaning}")
    return lines
