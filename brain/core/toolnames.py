"""Tool names that never collide silently (layer: brain/core; pure).

Every tool an MCP server offers is registered as ``<server>.<tool>``; its bare name is
kept too when nothing else has it. A bare name two sources offer is a clash: a built-in
keeps its bare name (an MCP server cannot replace it unnoticed), so does a registry-file
entry that declares another kind of tool (``type: native``: ``keep_declared``), and a name
two MCP servers share has no bare form at all, only the qualified ones. A client's MCP tool
whose bare name the registry gives to another tool answers to ``<server>.<tool>`` only
(``bare_name_taken``). Clashes are returned so that the brain logs them, ``vancetope
explain`` and ``vancetope clients`` show them (``clash_lines``), and every tool stays
reachable by its qualified name.

The separator is a dot because the MCP spec allows tool names of ``[A-Za-z0-9._-]`` only
(``mcp``'s ``validate_tool_name``, ``workers.toolnames.spec_name_problem``), and the gateway lists these names to MCP hosts. Tool and
server names may hold dots themselves, so a qualified name is never split on a dot: the
server is known (a spec's or descriptor's ``mcp_server``) and only its prefix is taken off.
The old ``<server>/<tool>`` form is still read (``canonical``), with a deprecation warning
where a person wrote it (``legacy_warning``). A tool whose own name starts with
``<its server>.`` would read as qualified, so it has no bare form: only ``<server>.<name>``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workers.contracts import ToolDescriptor, ToolType
from workers.toolnames import canonical, is_qualified, qualified, spec_name_problem

if TYPE_CHECKING:
    from brain.core.models import ToolSpec

# Who may own a bare name in a clash, beside ``<server>.<tool>`` names (which never do, but
# for the qualified name a dotted bare name repeats: that one is the qualified tool's).
BUILT_IN = "built-in"
REGISTRY_FILE = "registry file"


def legacy_warning(where: str, written: str) -> str:
    """What a person who wrote ``<server>/<tool>`` is told (the name works, for now)."""
    return (
        f"{where}: tool name {written!r} is the deprecated '<server>/<tool>' form; it is read as "
        f"{canonical(written)!r}, write that (MCP tool names may not hold '/')"
    )


@dataclass(frozen=True)
class Placed:
    tools: dict[str, ToolSpec]
    # bare name -> who offers it ("built-in", "<server>.<tool>"), for every bare name offered twice
    clashes: dict[str, list[str]] = field(default_factory=dict)
    # (server, why) for each tool left out: its qualified name breaks the MCP spec's rule
    refused: list[tuple[str, str]] = field(default_factory=list)


def place(builtins: Mapping[str, ToolSpec], discovered: Iterable[ToolSpec]) -> Placed:
    """Built-ins under their names, MCP tools under ``<server>.<tool>`` and, when unique, bare.
    A qualified name the spec forbids (over 128 characters, a server name with a space) is
    refused, never listed to hosts that would reject it. A bare name that reads as a qualified
    one (``b.c`` of server ``a`` beside tool ``c`` of server ``b``; ``git.x`` of server ``git``
    itself) is a clash: the qualified name keeps its meaning, the bare one is not given."""
    tools = dict(builtins)
    offers: dict[str, list[ToolSpec]] = {}
    refused: list[tuple[str, str]] = []
    for spec in discovered:
        server = spec.mcp_server or "?"
        full = qualified(server, spec.name)
        problem = spec_name_problem(full)
        if problem is not None:
            why = f"its name {full!r} breaks the MCP tool-name rule ({problem})"
            refused.append((server, f"tool {spec.name!r} of MCP server {server!r} is not registered: {why}"))
            continue
        tools[full] = spec.model_copy(update={"name": full})
        offers.setdefault(spec.name, []).append(spec)
    qualified_names = {qualified(s.mcp_server or "?", bare) for bare, specs in offers.items() for s in specs}
    clashes: dict[str, list[str]] = {}
    for bare, specs in offers.items():
        reads_qualified = bare in qualified_names or any(is_qualified(bare, s.mcp_server) for s in specs)
        if bare not in builtins and not reads_qualified and len(specs) == 1:
            tools[bare] = specs[0]
            continue
        who = [BUILT_IN] if bare in builtins else []
        who += [bare] if bare in qualified_names else []
        who += [qualified(s.mcp_server or "?", bare) for s in specs]
        clashes[bare] = who
    return Placed(tools, clashes, refused)


def _is_qualified_key(name: str, tools: Mapping[str, ToolSpec]) -> bool:
    spec = tools.get(name)
    return spec is not None and spec.type is ToolType.MCP and is_qualified(name, spec.mcp_server)


def keep_declared(declared: Mapping[str, ToolSpec], placed: Placed) -> Placed:
    """Registry-file entries that declare another kind of tool under an MCP tool's bare name
    keep that name (pure). An entry with no ``mcp_server`` whose ``type`` says it is no MCP
    tool (``native``, ``built_in``) is not that MCP tool: it was merged into it, silently, and
    ``<server>.<tool>`` vanished from the gateway's list and pool. Now the bare name is the
    entry's, as a built-in keeps its own, the MCP tool keeps ``<server>.<tool>``, and the clash
    is reported. An entry that names no type describes the MCP tool (``location: client``
    over a discovered tool): it is merged as before."""
    tools = dict(placed.tools)
    clashes = dict(placed.clashes)
    for name, spec in declared.items():
        if _is_qualified_key(name, tools) or spec.mcp_server or "type" not in spec.model_fields_set:
            continue
        if spec.type is ToolType.MCP:
            continue
        bare = tools.get(name)
        if bare is None:  # two MCP servers share it, so it had no bare form: now it has
            offered = [w for w in clashes.get(name, []) if not _is_label(w) and w != name]
        elif bare.type is ToolType.MCP and bare.mcp_server:
            offered = [qualified(bare.mcp_server, name)]
            del tools[name]
        else:
            continue  # a built-in's name: the entry overrides where it runs, as ever
        if offered:
            clashes[name] = [REGISTRY_FILE, *offered]
    return Placed(tools, clashes, placed.refused)


def bare_name_taken(registry: Mapping[str, ToolSpec], tool: ToolDescriptor) -> bool:
    """Whether the registry gives the bare name of ``tool`` (a client's MCP tool) to another
    tool: one that is not this MCP server's. Then the client's tool answers to
    ``<server>.<tool>`` only, and routing never takes it for the registry's."""
    spec = registry.get(tool.name)
    if spec is None or not tool.mcp_server or is_qualified(tool.name, tool.mcp_server):
        return False
    return not (spec.type is ToolType.MCP and spec.mcp_server == tool.mcp_server)


def owner_label(spec: ToolSpec) -> str:
    """Who a registry entry is, as a clash names the owner of a bare name (words, no tool name)."""
    if spec.type is ToolType.BUILT_IN:
        return BUILT_IN
    if spec.type is ToolType.MCP:
        return f"registry's tool of MCP server {spec.mcp_server!r}"
    return f"registry's {spec.type.value} tool"


def client_clashes(registry: Mapping[str, ToolSpec], tools: Iterable[ToolDescriptor]) -> dict[str, list[str]]:
    """A client's MCP tools whose bare name the registry gives to another tool (pure): bare
    name -> [the registry's owner, ``<server>.<tool>``], as ``place`` reports its clashes."""
    found: dict[str, list[str]] = {}
    for tool in tools:
        if tool.mcp_server and bare_name_taken(registry, tool):
            who = found.setdefault(tool.name, [owner_label(registry[tool.name])])
            who.append(qualified(tool.mcp_server, tool.name))
    return found


_OWNER_WORDS = {BUILT_IN: "the built-in", REGISTRY_FILE: "the registry file's tool"}


def _is_label(who: str) -> bool:
    """A clash entry that names an owner in words (``BUILT_IN``, ``REGISTRY_FILE``,
    ``owner_label``), not a tool name: tool names hold no spaces, and a dot tells nothing."""
    return who in _OWNER_WORDS or " " in who


def clash_lines(clashes: Mapping[str, list[str]]) -> list[str]:
    """One sentence per clash: who offers the name, what the bare name means, what to write.
    The bare name belongs to the entry that is no ``<server>.<tool>`` name (a built-in, the
    registry file's tool, the registry's tool a client's MCP tool met), or to the qualified
    name it spells, if there is one."""
    lines = []
    for bare, who in sorted(clashes.items()):
        owner = next((w for w in who if _is_label(w) or w == bare), None)
        others = [w for w in who if w != owner]
        written = " or ".join(repr(o) for o in others)
        if owner == bare:
            meaning = (
                f"{bare!r} is the qualified name of the tool of that name; write {written} for the other"
            )
        elif owner is not None:
            meaning = f"{bare!r} is {_OWNER_WORDS.get(owner, 'the ' + owner)}; write {written} for the other"
        else:
            meaning = f"{bare!r} alone names none of them; write {written}"
        lines.append(f"tool name {bare!r} is offered by {', '.join(who)}: {meaning}")
    return lines
