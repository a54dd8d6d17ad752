"""What the workstation's user must approve (layer: client_agent, pure).

One job: the decisions behind consent, without files, clocks or threads: does a call's
tool need approval (``ask`` patterns), what exactly identifies an MCP server's command
and a tool's definition (``server_digest``, ``tool_digest``: SHA-256 of canonical JSON),
which servers may start and which tools may be offered given what the user approved
(``split_servers``, ``split_tools``), and the requests ``vancetope-agent pending`` shows.
The state directory that keeps approvals is ``client_agent.approvals``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from fnmatch import fnmatchcase
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from client_agent.toolnames import pattern_names
from workers.contracts import ToolDescriptor
from workers.mcp_config import HttpServerSpec, MCPServerSpec, StdioServerSpec


class RequestKind(StrEnum):
    CALL = "call"  # a tool call held until approved
    SERVER = "server"  # an mcp.json server not started until its command is approved
    TOOL = "tool"  # an MCP tool whose definition changed since it was approved


class PendingRequest(BaseModel):
    """One thing waiting for the user, as ``vancetope-agent pending`` shows it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z]-[0-9a-f]{6,64}$")
    kind: RequestKind
    since: float
    tool: str = ""
    mcp_server: str | None = None
    # call
    tree_id: str = ""
    task_id: str = ""
    run_id: str = ""
    args: dict[str, Any] = Field(default_factory=dict)
    expires_at: float | None = None
    scope: str = ""
    # server: the exact command; tool: the new definition and what changed
    command: list[str] = Field(default_factory=list)
    definition: dict[str, Any] = Field(default_factory=dict)
    digest: str = ""
    diff: str = ""


class Decision(BaseModel):
    """The user's answer to one request, written by ``vancetope-agent approve/deny``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    approved: bool
    reason: str = ""
    at: float
    # HMAC by the approval key (client_agent.approval_key): a decision without it counts for nothing.
    mac: str = ""


# --- calls ----------------------------------------------------------------------------------


def asks(patterns: Iterable[str], tool: str, mcp_server: str | None) -> bool:
    """True when a call of ``tool`` (of ``mcp_server``) needs approval: a pattern matches its
    name, ``<server>.<name>`` or ``<server>/<name>`` (so ``git.*`` and ``git/*`` cover every
    tool of server ``git``: client_agent.toolnames)."""
    names = pattern_names(tool, mcp_server)
    return any(fnmatchcase(name, pattern) for pattern in patterns for name in names)


def tree_scope_key(tree_id: str, tool: str, mcp_server: str | None) -> str:
    """What one approval covers in ``ask_scope = "tree"``: this tree's calls of this tool."""
    return f"{tree_id}\x00{mcp_server or ''}\x00{tool}"


# --- digests ----------------------------------------------------------------------------------


def digest(value: Any) -> str:
    return hashlib.sha256(_canonical(value).encode("utf-8")).hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def server_definition(spec: MCPServerSpec) -> dict[str, Any]:
    """What the user approves of a server: its command, arguments, the names (not the values:
    those may be ``${VAR}`` secrets) of its environment variables and its folder; for a
    remote server its URL and header names."""
    if isinstance(spec, StdioServerSpec):
        return {
            "type": "stdio",
            "command": spec.command,
            "args": list(spec.args),
            "env": sorted(spec.env),
            "cwd": spec.cwd,
        }
    assert isinstance(spec, HttpServerSpec)
    return {"type": "http", "url": spec.url, "headers": sorted(spec.headers)}


def server_digest(spec: MCPServerSpec) -> str:
    return digest(server_definition(spec))


def server_command(spec: MCPServerSpec) -> list[str]:
    if isinstance(spec, StdioServerSpec):
        return [spec.command, *spec.args]
    assert isinstance(spec, HttpServerSpec)
    return [spec.url]


def tool_key(server: str, tool: str) -> str:
    return f"{server}/{tool}"


def tool_definition(tool: ToolDescriptor, name_on_server: str) -> dict[str, Any]:
    return {"name": name_on_server, "description": tool.description, "input_schema": tool.input_schema}


def tool_digest(definition: Mapping[str, Any]) -> str:
    return digest(dict(definition))


def definition_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """A unified diff of two definitions as indented JSON: what the user is asked to accept."""
    before = json.dumps(old, sort_keys=True, indent=2, ensure_ascii=False).splitlines()
    after = json.dumps(new, sort_keys=True, indent=2, ensure_ascii=False).splitlines()
    return "\n".join(difflib.unified_diff(before, after, "approved", "now", lineterm=""))


def as_approved(request: PendingRequest, pinned: Mapping[str, Mapping[str, Any]]) -> PendingRequest:
    """``request`` with what the user is shown derived from what approving it records: a
    server's command and digest from its definition, a tool's diff from the pinned one.
    A pending file is written by the agent, but must not be able to show one thing and
    have ``approve`` record another."""
    d = request.definition
    if request.kind is RequestKind.SERVER:
        command = (
            [d.get("url", "")] if d.get("type") == "http" else [d.get("command", ""), *d.get("args", [])]
        )
        return request.model_copy(update={"command": [str(c) for c in command], "digest": digest(d)})
    if request.kind is RequestKind.TOOL:
        old = pinned.get(tool_key(request.mcp_server or "", request.tool), {})
        return request.model_copy(update={"diff": definition_diff(old, d), "digest": tool_digest(d)})
    return request


def request_id(kind: RequestKind, what: str) -> str:
    """A stable id for a server or tool request (the same change asks under the same id)."""
    return f"{kind.value[0]}-{digest(what)[:12]}"


# --- servers and tools ------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerSplit:
    start: list[str] = field(default_factory=list)
    waiting: list[PendingRequest] = field(default_factory=list)
    # Trusted servers seen for the first time in this mcp.json, name -> digest: pinned now.
    new_pins: dict[str, str] = field(default_factory=dict)


def split_servers(
    servers: Mapping[str, MCPServerSpec],
    approved: Mapping[str, str],
    trusted: Iterable[str],
    now: float,
    trusted_pins: Mapping[str, str] | None = None,
) -> ServerSplit:
    """Which servers may start: approved with this very definition (``approved``: name ->
    digest), or trusted by name in agent.toml with the definition first seen in this
    mcp.json (``trusted_pins``; one seen for the first time is pinned in ``new_pins``):
    trust covers what the user reviewed, not a later edit. The others wait, each as one
    request."""
    trust = set(trusted)
    pins = {} if trusted_pins is None else trusted_pins
    split = ServerSplit()
    for name, spec in servers.items():
        sha = server_digest(spec)
        if approved.get(name) == sha or (name in trust and pins.get(name, sha) == sha):
            split.start.append(name)
            if name in trust and name not in pins:
                split.new_pins[name] = sha
            continue
        split.waiting.append(
            PendingRequest(
                id=request_id(RequestKind.SERVER, f"{name}\x00{sha}"),
                kind=RequestKind.SERVER,
                since=now,
                mcp_server=name,
                command=server_command(spec),
                definition=server_definition(spec),
                digest=sha,
                diff=definition_diff({}, server_definition(spec)) if name not in approved else "",
            )
        )
    return split


@dataclass(frozen=True)
class ToolSplit:
    offered: list[ToolDescriptor] = field(default_factory=list)
    changed: list[PendingRequest] = field(default_factory=list)
    # First seen: pinned now (the user approved their server), key -> definition.
    new_pins: dict[str, dict[str, Any]] = field(default_factory=dict)


def split_tools(
    discovered: Iterable[ToolDescriptor], pinned: Mapping[str, Mapping[str, Any]], now: float
) -> ToolSplit:
    """Tools whose definition is the pinned one are offered; a tool seen for the first time
    is pinned and offered; a changed one is held as a request showing the diff."""
    split = ToolSplit()
    for tool in discovered:
        server = tool.mcp_server or ""
        key = tool_key(server, tool.name)
        new = tool_definition(tool, tool.name)
        old = pinned.get(key)
        if old is None:
            split.new_pins[key] = new
            split.offered.append(tool)
        elif tool_digest(old) == tool_digest(new):
            split.offered.append(tool)
        else:
            sha = tool_digest(new)
            split.changed.append(
                PendingRequest(
                    id=request_id(RequestKind.TOOL, f"{key}\x00{sha}"),
                    kind=RequestKind.TOOL,
                    since=now,
                    tool=tool.name,
                    mcp_server=server,
                    definition=new,
                    digest=sha,
                    diff=definition_diff(old, new),
                )
            )
    return split
