"""How a tool of an MCP server is named, for the brain and the client agent alike (pure).

``<server>.<tool>``: MCP tool names may hold only ``[A-Za-z0-9._-]`` (the SDK's
``validate_tool_name``). The older ``<server>/<tool>`` is still read (trees, registry files, an
older agent's announcement, user settings), never written. Tool and server names may hold dots
themselves, so a name is never split on its first dot: a known server's prefix is taken off.
The brain's placing of names (clashes, bare names) is ``brain.core.toolnames``; the agent's
patterns are ``client_agent.toolnames``.
"""

from __future__ import annotations

import re

SEPARATOR = "."
# The MCP spec's tool-name rule (SEP-986), as the SDK's ``mcp.shared.tool_name_validation``
# writes it. Checked here, not by importing that module: importing anything of ``mcp`` loads
# the whole SDK (about a second of CPU), in the brain, every CLI command and every pool.
SPEC_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
MAX_SPEC_NAME_CHARS = 128
# Read still, in trees, registry files, announcements and user settings; never written.
LEGACY_SEPARATOR = "/"


def spec_name_problem(name: str) -> str | None:
    """Why ``name`` breaks the MCP spec's tool-name rule (letters, digits, ``_ . -``, 1 to 128
    characters), in the SDK's words (``validate_tool_name``), or None: strict hosts refuse such
    a name."""
    if not name:
        return "Tool name cannot be empty"
    if len(name) > MAX_SPEC_NAME_CHARS:
        return f"Tool name exceeds maximum length of {MAX_SPEC_NAME_CHARS} characters (current: {len(name)})"
    if SPEC_NAME.fullmatch(name):
        return None
    said = []
    if " " in name:
        said.append("Tool name contains spaces, which may cause parsing issues")
    if "," in name:
        said.append("Tool name contains commas, which may cause parsing issues")
    if name.startswith("-") or name.endswith("-"):
        said.append("Tool name starts or ends with a dash, which may cause parsing issues in some contexts")
    if name.startswith(".") or name.endswith("."):
        said.append("Tool name starts or ends with a dot, which may cause parsing issues in some contexts")
    bad = dict.fromkeys(c for c in name if not SPEC_NAME.fullmatch(c))
    said.append(f"Tool name contains invalid characters: {', '.join(repr(c) for c in bad)}")
    return "; ".join(said)


def qualified(server: str, tool: str) -> str:
    return f"{server}{SEPARATOR}{tool}"


def name_on_server(name: str, server: str | None) -> str:
    """The name MCP server ``server`` knows a tool by: ``name`` without ``<server>.`` (or the
    legacy ``<server>/``). Never a split on the first dot: ``a.b.c`` of server ``a.b`` is ``c``."""
    if server:
        for separator in (SEPARATOR, LEGACY_SEPARATOR):
            if name.startswith(server + separator):
                return name[len(server) + len(separator) :]
    return name


def is_qualified(name: str, server: str | None) -> bool:
    """Whether ``name`` is a qualified name of ``server``'s (either separator)."""
    return bool(server) and name_on_server(name, server) != name


def canonical(name: str) -> str:
    """``<server>/<tool>`` (the old form) as ``<server>.<tool>``; any other name as it is.
    A tool name holds no ``/`` (ids do not), so the first one is the old separator."""
    server, slash, tool = name.partition(LEGACY_SEPARATOR)
    return qualified(server, tool) if slash else name
