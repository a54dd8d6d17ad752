"""The user's ``mcp.json`` on a workstation (layer: client_agent).

One job: turn the user's ``mcpServers`` file into running MCP servers and the list of
their tools this agent offers, and notice when the file changes. A bad file, a command
that does not exist or a server that dies on start never stops the agent: it is
reported (with the server's stderr tail) and the rest is offered. Given the file as it was
last loaded (``previous``), an entry whose edit cannot be used keeps its last good definition
(``workers.mcp_config``); a file that does not load at all is reported in ``MCPTools.error``,
and the agent keeps the servers it has (``client_agent.agent``).

Name clashes: a native tool keeps its name over an MCP tool of the same name, and between
MCP servers the first in file order keeps it; the other is offered as ``<server>.<tool>``
(the brain's name for a tool of a given server), so no tool disappears and none is
called by mistake. Only the (server, tool) pairs that were offered can be called
(``GuardedMCPManager``), so a refused tool is not reachable.
Relative paths inside the file (a stdio server's ``cwd``, its arguments) are taken from
the file's folder: stdio servers without a ``cwd`` start there.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import watchfiles

from client_agent import toolnames
from client_agent.errors import PolicyViolation
from client_agent.git_server import confine_git_servers, repo_path_problem
from client_agent.policy import Policy
from client_agent.toolnames import qualified, reads_qualified
from workers.contracts import MCPServerFailure, ToolDescriptor
from workers.errors import WorkerError
from workers.mcp_clients import MCPClientManager
from workers.mcp_config import MCPConfig, StdioServerSpec, load_mcp_config, skipped_servers

log = logging.getLogger("vancetope.agent.mcp")

Pair = tuple[str, str]


class GuardedMCPManager(MCPClientManager):
    """An MCP client manager that runs only the (server, tool) pairs this agent announced."""

    def __init__(self, config: MCPConfig, *, start_timeout: float) -> None:
        super().__init__(config, start_timeout=start_timeout)
        self._permitted: frozenset[Pair] = frozenset()
        self._refused: dict[Pair, str] = {}

    def permit(self, pairs: Iterable[Pair], refused: Mapping[Pair, str]) -> None:
        self._permitted = frozenset(pairs)
        self._refused = dict(refused)

    def connect(self, server: str) -> None:
        if not any(name == server for name, _ in self._permitted):
            why = (
                "MCP server is not running on this client agent "
                "(it failed to start, or all its tools were left out)"
            )
            raise PolicyViolation(server, None, why)
        super().connect(server)

    def call_tool(self, server: str, tool: str, args: dict[str, Any], timeout: float) -> Any:
        if (server, tool) not in self._permitted:
            why = self._refused.get(
                (server, tool), f"is not offered by MCP server {server!r} on this client agent"
            )
            raise PolicyViolation(tool, None, why)
        spec = self.config.servers.get(server)
        if isinstance(spec, StdioServerSpec) and (held := repo_path_problem(spec, args)) is not None:
            raise PolicyViolation(tool, None, held)
        return super().call_tool(server, tool, args, timeout)


@dataclass
class MCPTools:
    """The outcome of loading ``mcp.json``: the running servers and what they offer."""

    manager: GuardedMCPManager | None = None
    tools: list[ToolDescriptor] = field(default_factory=list)
    failures: list[MCPServerFailure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # The file as read (before consent and localize): what the next load passes as ``previous``.
    config: MCPConfig | None = None
    # Why the file could not be used at all (None: it was, or there is none).
    error: str | None = None

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()


@dataclass(frozen=True)
class Merged:
    """Pure outcome of ``merge_tools``: what is offered, and why the rest is not."""

    offered: list[ToolDescriptor]
    refused: dict[Pair, str]
    notes: list[str]


def merge_tools(native: Iterable[str], discovered: Iterable[ToolDescriptor], policy: Policy) -> Merged:
    """The policy first; then a native name keeps it, then the first MCP server (in file order)
    to offer a name; a later one is offered as ``<server>.<tool>``. So is a tool whose own name
    starts with ``<server>.``: the brain would read its bare name as qualified and strip it."""
    owner: dict[str, str] = {name: "the native tool" for name in native}
    offered: list[ToolDescriptor] = []
    refused: dict[Pair, str] = {}
    notes: list[str] = []
    for tool in discovered:
        server = tool.mcp_server or "?"
        if not policy.allows(tool):
            refused[(server, tool.name)] = str(policy.refusal(tool.name, server).why)
        elif reads_qualified(tool.name, server):
            offered.append(tool.model_copy(update={"name": qualified(server, tool.name)}))
        elif tool.name in owner:
            as_name = qualified(server, tool.name)
            notes.append(
                f"MCP tool {tool.name!r} of server {server!r} shares its name with {owner[tool.name]}; "
                f"it is offered as {as_name!r}"
            )
            offered.append(tool.model_copy(update={"name": as_name}))
        else:
            owner[tool.name] = f"MCP server {server!r}"
            offered.append(tool)
    return Merged(offered, refused, notes)


def name_on_server(tool: ToolDescriptor) -> str:
    """The name the tool's MCP server knows it by (an offered ``<server>.<tool>`` unwrapped)."""
    return toolnames.name_on_server(tool.name, tool.mcp_server)


class ServerConsent(Protocol):
    """What the user approved (client_agent.approvals.ConsentDir): which servers may start,
    which tool definitions may be offered."""

    def gate_servers(
        self, config: MCPConfig, trusted: Iterable[str], now: float
    ) -> tuple[MCPConfig, list[MCPServerFailure]]: ...

    def gate_tools(
        self, discovered: list[ToolDescriptor], now: float
    ) -> tuple[list[ToolDescriptor], dict[Pair, str]]: ...


def load_mcp_tools(
    path: Path | None,
    policy: Policy,
    native: Iterable[str],
    timeout: float,
    consent: ServerConsent | None = None,
    trusted: Iterable[str] = (),
    previous: MCPConfig | None = None,
) -> MCPTools:
    """Start the servers of ``path`` and list their tools; failures are reported, never raised.
    With ``consent``, only servers the user approved (or ``trusted``) start, and only tools
    whose definition is the approved one are offered. With ``previous`` (``MCPTools.config`` of
    the load in use), an entry whose edit cannot be used keeps its definition there. A file that
    cannot be used at all is ``error`` (the caller says what it does about it), and no servers."""
    if path is None:
        return MCPTools()
    try:
        parsed = load_mcp_config(path, previous)
    except WorkerError as exc:
        return MCPTools(failures=[MCPServerFailure(server=path.name, message=exc.message)], error=exc.message)
    for why in parsed.kept.values():
        log.error("%s", why)
    config = localize(parsed, path.parent)
    waiting: list[MCPServerFailure] = []
    if consent is not None:
        config, waiting = consent.gate_servers(config, trusted, time.time())
    config, confined = confine_git_servers(config)
    for failure in confined:
        log.error("MCP server %r %s", failure.server, failure.message)
    waiting += confined
    manager = GuardedMCPManager(config, start_timeout=timeout)
    discovered, failures = manager.discover(timeout)
    held: dict[Pair, str] = {}
    if consent is not None:
        discovered, held = consent.gate_tools(discovered, time.time())
    failures = [*skipped_servers(config), *failures]
    merged = merge_tools(native, discovered, policy)
    manager.permit(
        ((t.mcp_server or "", name_on_server(t)) for t in merged.offered), {**merged.refused, **held}
    )
    for failure in failures:
        log.error("MCP server %r failed: %s%s", failure.server, failure.message, _tail(failure.stderr_tail))
    for note in merged.notes:
        log.warning("%s", note)
    return MCPTools(manager, merged.offered, [*waiting, *failures], merged.notes, config=parsed)


def localize(config: MCPConfig, base: Path) -> MCPConfig:
    """Stdio servers start in the file's folder (unless they say otherwise), and a command that is
    not on PATH is looked up beside this interpreter (a venv's ``bin`` is often not on PATH)."""
    servers = {
        name: spec.model_copy(update={"cwd": _cwd(spec, base), "command": _command(spec.command)})
        if isinstance(spec, StdioServerSpec)
        else spec
        for name, spec in config.servers.items()
    }
    return config.model_copy(update={"servers": servers})


def _cwd(spec: StdioServerSpec, base: Path) -> str:
    return str(base / spec.cwd) if spec.cwd else str(base)


def _command(command: str) -> str:
    if os.sep in command or shutil.which(command):
        return command
    beside = Path(sys.executable).parent / command
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else command


def _tail(stderr_tail: str) -> str:
    return "; last stderr lines:\n" + stderr_tail if stderr_tail else ""


# --- watching the file ------------------------------------------------------------------------

Signature = tuple[int, int, int] | None


def signature(path: Path) -> Signature:
    """What changes when the file is edited, replaced or removed."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class FileWatcher(threading.Thread):
    """Calls ``on_change`` once an edit of a file has settled. watchfiles (inotify, FSEvents,
    ReadDirectoryChangesW) watches the file's folder, so a file replaced by an editor's rename,
    or removed and written again, is still seen; its ``step`` is the settle time. A folder that
    does not exist yet is looked for every ``interval_s``, and the file's signature is compared
    then too, so nothing depends on an event arriving."""

    def __init__(
        self, path: Path, on_change: Callable[[], None], stop: threading.Event, interval_s: float = 1.0
    ):
        super().__init__(name="vancetope-mcp-json-watch", daemon=True)
        self.path = path
        self.on_change = on_change
        self.stop = stop
        self.interval_s = interval_s

    def run(self) -> None:
        last = signature(self.path)
        while not self.stop.is_set():
            folder = self.path.parent
            if not folder.is_dir():
                self.stop.wait(self.interval_s)
                last = self._maybe_changed(last)
                continue
            try:
                for _ in watchfiles.watch(
                    folder,
                    watch_filter=lambda _change, name: Path(name).name == self.path.name,
                    recursive=False,
                    step=200,  # an editor may still be writing: wait until 200 ms pass quietly
                    rust_timeout=max(1, int(self.interval_s * 1000)),
                    yield_on_timeout=True,
                    stop_event=self.stop,
                    raise_interrupt=False,
                ):
                    last = self._maybe_changed(last)
                    if not folder.is_dir():
                        break  # the folder went away: wait for it again
            except (OSError, RuntimeError) as exc:  # the folder vanished as watching began
                log.debug("watching %s: %s; trying again", folder, exc)
                self.stop.wait(self.interval_s)

    def _maybe_changed(self, last: Signature) -> Signature:
        current = signature(self.path)
        if current != last:
            try:
                self.on_change()
            except Exception:
                log.exception("reloading %s failed; keeping the previous MCP servers", self.path)
        return current
