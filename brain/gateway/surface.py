"""Resources, prompts and completion as one user sees them (layer: brain/gateway, pure).

Made from the surface tools of the user's catalog (``workers.contracts.surface_tool``: the
brain's MCP servers' and the user's connected clients'), in catalog order: the registry's
first, then the clients'. Each list says where an item came from, so a read, a get or a
completion is routed to the surface tool of the server that listed it, like a tool call.

- Resources keep their URIs (a URI is the resource's identity, and clients read back the
  URI they listed). A URI two servers list is listed once, for the first; the clash is
  reported (``clashes``, which the gateway logs once).
- Prompts are named as tools are: bare while no other server of the user has that name,
  else ``<server>.<prompt>`` for each of them (``workers.toolnames.qualified``).
- A URI no server listed goes to the server whose resource template matches it (RFC 6570
  simple expansion), else to the one server with resources when there is only one, or whose
  list was cut short (``McpSurface.truncated``), else to the one workstation server the
  registry declares (``<server>#read_resource`` with ``location: client``) while its client is
  offline: the read is then routed, and its offline strategy applies (wait, park, refuse).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from brain.core.models import Location
from brain.core.resource_updates import may_notify
from brain.gateway.catalog import GatewayTool
from workers.contracts import COMPLETE, GET_PROMPT, READ_RESOURCE, surface_op, surface_tool
from workers.toolnames import qualified


@dataclass(frozen=True)
class Prompt:
    name: str  # as listed to this user
    upstream: str  # as its server knows it
    tool: str  # the surface tool that gets it: ``<server>#get_prompt``
    wire: dict[str, Any]


@dataclass
class Surface:
    """What one user can list and where each item is read from."""

    resources: list[dict[str, Any]] = field(default_factory=list)
    templates: list[dict[str, Any]] = field(default_factory=list)
    prompts: list[Prompt] = field(default_factory=list)
    # uri -> the surface tool that reads it
    by_uri: dict[str, str] = field(default_factory=dict)
    # (template, its compiled pattern, the surface tool that reads what it matches)
    by_template: list[tuple[str, re.Pattern[str], str]] = field(default_factory=list)
    # read tools whose server may have more than it listed (cut short), or all of them
    readers: list[str] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    # read tools of the registry whose workstation is offline (``location: client``)
    offline_readers: list[str] = field(default_factory=list)
    completers: set[str] = field(default_factory=set)
    # read tool -> (where it runs, the user's clients that offer it): who may say its server's
    # resources changed (``may_notify``)
    origins: dict[str, tuple[Location, tuple[str, ...]]] = field(default_factory=dict)
    # "uri ... is listed by a, b" lines, for the log
    clashes: list[str] = field(default_factory=list)

    def reader_of(self, uri: str) -> str | None:
        """The surface tool that reads ``uri``, None when no server of the user could have it."""
        if uri in self.by_uri:
            return self.by_uri[uri]
        for _, pattern, tool in self.by_template:
            if pattern.fullmatch(uri):
                return tool
        if len(self.truncated) == 1:
            return self.truncated[0]
        if len(self.readers) == 1 and not self.offline_readers:
            return self.readers[0]
        return self.offline_readers[0] if len(self.offline_readers) == 1 and not self.readers else None

    def may_notify(self, reader: str, client_id: str | None) -> bool:
        """Whether ``client_id`` (None: a server pool) may say that a resource read by
        ``reader`` changed: only one of the user's clients that offers it now, or the pool."""
        origin = self.origins.get(reader)
        return origin is not None and may_notify(origin[0], origin[1], client_id)

    def prompt(self, name: str) -> Prompt | None:
        return next((p for p in self.prompts if p.name == name), None)

    def completer_of(self, ref: dict[str, Any]) -> str | None:
        """The ``<server>#complete`` tool for a completion reference (a prompt or a resource template)."""
        server: str | None = None
        if ref.get("type") == "ref/prompt":
            found = self.prompt(str(ref.get("name", "")))
            server = _server(found.tool) if found else None
        elif ref.get("type") == "ref/resource":
            uri = str(ref.get("uri", ""))
            owner = next((t for tpl, _, t in self.by_template if tpl == uri), None) or self.by_uri.get(uri)
            server = _server(owner) if owner else None
        if server is None:
            return None
        tool = surface_tool(server, COMPLETE)
        return tool if tool in self.completers else None


def _server(tool: str) -> str:
    found = surface_op(tool)
    assert found is not None
    return found[0]


def template_pattern(template: str) -> re.Pattern[str]:
    """A regex for the URIs an RFC 6570 template expands to: ``{x}`` one path segment,
    ``{+x}``/``{#x}`` anything, ``{?x,y}``/``{&x}`` an optional query, ``{/x}`` a segment."""
    out, at = [], 0
    for m in re.finditer(r"\{([+#./;?&]?)([^}]*)\}", template):
        out.append(re.escape(template[at : m.start()]))
        op = m.group(1)
        if op in ("+", "#"):
            out.append(".+")
        elif op in ("?", "&"):
            out.append(r"(?:[?&].*)?")
        elif op in ("/", "."):
            out.append(r"(?:[/.][^/?#]*)*")
        else:
            out.append(r"[^/?#]+")
        at = m.end()
    out.append(re.escape(template[at:]))
    return re.compile("".join(out))


def surface_of(tools: Iterable[GatewayTool]) -> Surface:
    """The user's resources, templates and prompts from the surface tools of their catalog."""
    found = Surface()
    owners: dict[str, list[str]] = {}
    prompts: list[tuple[str, str, dict[str, Any]]] = []  # (server, name, wire)
    for tool in tools:
        parsed = surface_op(tool.name)
        if parsed is None:
            continue
        server, op = parsed
        if not tool.available:
            # The registry's entry for a workstation's server whose client is offline: what it
            # has is unknown now, but a read may still be routed there (and park or wait).
            if op == READ_RESOURCE:
                found.offline_readers.append(tool.name)
            continue
        listed = tool.surface
        if op == READ_RESOURCE:
            found.readers.append(tool.name)
            found.origins[tool.name] = (tool.location, tool.clients)
            if listed is not None and listed.truncated:
                found.truncated.append(tool.name)
            for resource in listed.resources if listed else []:
                uri = str(resource.get("uri", ""))
                owners.setdefault(uri, []).append(server)
                if uri not in found.by_uri:
                    found.by_uri[uri] = tool.name
                    found.resources.append(resource)
            for template in listed.resource_templates if listed else []:
                text = str(template.get("uriTemplate", ""))
                found.templates.append(template)
                found.by_template.append((text, template_pattern(text), tool.name))
        elif op == GET_PROMPT:
            prompts.extend((server, str(p.get("name", "")), p) for p in (listed.prompts if listed else []))
        elif op == COMPLETE:
            found.completers.add(tool.name)
    found.clashes = [
        f"resource {uri!r} is listed by MCP servers {', '.join(map(repr, who))}: it is read from {who[0]!r}"
        for uri, who in owners.items()
        if len(who) > 1
    ]
    shared: dict[str, int] = {}
    for _, name, _ in prompts:
        shared[name] = shared.get(name, 0) + 1
    for server, name, wire in prompts:
        listed_as = name if shared[name] == 1 else qualified(server, name)
        found.prompts.append(
            Prompt(listed_as, name, surface_tool(server, GET_PROMPT), {**wire, "name": listed_as})
        )
    return found


__all__ = ["Prompt", "Surface", "surface_of", "template_pattern"]
