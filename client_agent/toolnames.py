"""The names the agent gives its MCP tools, and the names the user's patterns match (pure).

The rule of ``workers.toolnames`` as the agent applies it (the agent imports nothing of the
brain): a tool is named ``<server>.<tool>`` when its bare name will not
do, since MCP tool names may hold only ``[A-Za-z0-9._-]``. Settings written before the dot
(``allowed_tools = ["git/*"]``, ``ask``) keep matching: a pattern is tried on both forms.
"""

from __future__ import annotations

from workers.toolnames import LEGACY_SEPARATOR, SEPARATOR, name_on_server, qualified


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
