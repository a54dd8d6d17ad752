"""The names the agent gives its MCP tools, and the names the user's patterns match (pure).

The brain's rule (``brain.core.toolnames``) as the agent needs it, kept apart so that the agent
imports nothing of the brain: a tool is named ``<server>.<tool>`` when its bare name will not
do, since MCP tool names may hold only ``[A-Za-z0-9._-]``. Settings written before the dot
(``allowed_tools = ["git/*"]``, ``ask``) keep matching: a pattern is tried on both forms.
"""

from __future__ import annotations

SEPARATOR = "."
LEGACY_SEPARATOR = "/"


def qualified(server: str, tool: str) -> str:
    return f"{server}{SEPARATOR}{tool}"


def name_on_server(name: str, server: str | None) -> str:
    """``name`` without ``<server>.`` (or ``<server>/``): never a split on the first dot, since
    tool and server names may hold dots."""
    if server:
        for separator in (SEPARATOR, LEGACY_SEPARATOR):
            if name.startswith(server + separator):
                return name[len(server) + len(separator) :]
    return name


def reads_qualified(name: str, server: str) -> bool:
    """A bare name the brain would take for ``<server>.<tool>`` (it starts with its server's)."""
    return name.startswith(server + SEPARATOR)


def pattern_names(name: str, server: str | None) -> list[str]:
    """What a user's glob pattern is matched against for a tool: its name, and for an MCP
    server's tool ``<server>.<tool>`` and the older ``<server>/<tool>`` (so ``git.*`` and
    ``git/*`` both cover every tool of server ``git``)."""
    if server is None:
        return [name]
    bare = name_on_server(name, server)
    return list(dict.fromkeys([name, qualified(server, bare), f"{server}{LEGACY_SEPARATOR}{bare}"]))
