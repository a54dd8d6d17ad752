"""The workstation user's approvals, kept on the workstation (layer: client_agent, I/O).

One job: the consent state directory ``<data_dir>/consent`` (mode 0700, owned by the
user running the agent) through which ``vancetope-agent pending/approve/deny`` talk to the
running agent (the gate that holds a call of an ``ask`` tool is client_agent.consent_gate).
Nothing here goes through Redis: the brain (and anyone who can write the agent's
``c:<id>:`` keys) can forge a message, not a file in this directory.

Layout: ``pending/<id>.json`` (what waits, written by the agent), ``decisions/<id>.json``
(the user's answer to a call, written by the CLI), ``approved_servers.json`` (server name
-> digest of its approved command), ``trusted_servers.json`` (mcp.json path -> trusted
server -> the digest first seen), ``pinned_tools.json`` (``server/tool`` -> its approved
definition), ``approvals.stamp`` (touched on every approval; the agent reloads its MCP
servers when it changes). Writes are atomic (a temporary file renamed into place).

Each server approval, tool pin and call decision carries a MAC by ``approval.key``
(client_agent.approval_key): one the key does not verify is ignored, so a forged file
makes nothing start, and the stamp only makes the agent check again.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import stat
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from client_agent.approval_key import KEY_FILE, ApprovalKey
from client_agent.config import AgentConfig
from client_agent.consent import (
    Decision,
    PendingRequest,
    RequestKind,
    as_approved,
    digest,
    split_servers,
    split_tools,
    tool_digest,
    tool_key,
)
from client_agent.errors import AgentError
from workers.contracts import MCPServerFailure, ToolDescriptor
from workers.mcp_config import MCPConfig

log = logging.getLogger("vancetope.agent.consent")


class ConsentStateError(AgentError):
    """The consent state directory cannot be trusted or used (wrong owner, unwritable)."""


class ConsentDir:
    """``<data_dir>/consent``: pending requests, decisions, approved servers and tool pins."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pending_dir = root / "pending"
        self.decisions_dir = root / "decisions"
        self.servers_file = root / "approved_servers.json"
        self.tools_file = root / "pinned_tools.json"
        self.stamp = root / "approvals.stamp"
        self.key_file = root / KEY_FILE
        self.trusted_file = root / "trusted_servers.json"
        self._key: ApprovalKey | None = None
        self._ignored: set[str] = set()

    @classmethod
    def for_config(cls, config: AgentConfig) -> ConsentDir:
        return cls(config.data_dir / "consent").open()

    def open(self) -> ConsentDir:
        """Create the directory 0700 if missing; refuse one another user owns, and close one
        that others may enter (only this user may approve what this agent runs)."""
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = self.root.stat()
            if st.st_uid != os.getuid():
                raise ConsentStateError(
                    f"the consent state directory {self.root} belongs to uid {st.st_uid}, not to this user "
                    f"(uid {os.getuid()}): approvals kept there cannot be trusted; remove it or fix its owner"
                )
            if stat.S_IMODE(st.st_mode) != 0o700:
                os.chmod(self.root, 0o700)
            for sub in (self.pending_dir, self.decisions_dir):
                sub.mkdir(mode=0o700, exist_ok=True)
            with self._locked():  # the agent and its CLI may both make the key at once
                self._key = ApprovalKey.load_or_create(self.key_file)
        except OSError as exc:
            raise ConsentStateError(f"cannot use the consent state directory {self.root}: {exc}") from exc
        return self

    @property
    def key(self) -> ApprovalKey:
        if self._key is None:
            raise ConsentStateError(f"the consent state directory {self.root} was not opened")
        return self._key

    def _forged(self, what: str, path: Path) -> None:
        """Log once per entry: something other than vancetope-agent approve wrote it."""
        if what not in self._ignored:
            self._ignored.add(what)
            log.error(
                "ignoring the approval of %s in %s: it is not signed by this agent's approval key, so it "
                "was not written by vancetope-agent approve; it counts as not approved",
                what,
                path,
            )

    # --- files -----------------------------------------------------------------------------
    def _write(self, path: Path, data: Any) -> None:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data if isinstance(data, str) else json.dumps(data, indent=2, sort_keys=True))
        os.replace(tmp, path)

    def _read(self, path: Path) -> Any:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.error("ignoring unreadable %s: %s", path, exc)
            return None

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    # --- pending requests and decisions ---------------------------------------------------
    def pending(self) -> list[PendingRequest]:
        """What waits, each shown as approving it would record it (consent.as_approved)."""
        found = []
        paths = sorted(self.pending_dir.glob("*.json"))
        pinned = self.pinned_tools() if paths else {}
        for path in paths:
            raw = self._read(path)
            try:
                found.append(as_approved(PendingRequest.model_validate(raw), pinned))
            except ValidationError:
                log.error("ignoring a malformed pending request %s", path)
        return sorted(found, key=lambda r: (r.since, r.id))

    def get(self, request_id: str) -> PendingRequest | None:
        return next((r for r in self.pending() if r.id == request_id), None)

    def add_pending(self, request: PendingRequest) -> None:
        self._write(self.pending_dir / f"{request.id}.json", request.model_dump_json(indent=2))

    def remove_pending(self, request_id: str) -> None:
        (self.pending_dir / f"{request_id}.json").unlink(missing_ok=True)

    def sync_pending(self, kinds: Iterable[RequestKind], requests: Iterable[PendingRequest]) -> None:
        """The requests of ``kinds`` become exactly ``requests`` (an older one keeps its ``since``)."""
        wanted = {r.id: r for r in requests}
        kinds = set(kinds)
        for old in self.pending():
            if old.kind in kinds and old.id not in wanted:
                self.remove_pending(old.id)
            elif old.id in wanted:
                wanted[old.id] = wanted[old.id].model_copy(update={"since": old.since})
        for request in wanted.values():
            self.add_pending(request)

    def decide(self, request_id: str, approved: bool, reason: str = "") -> None:
        mac = self.key.sign("decision", request_id, str(approved))
        decision = Decision(id=request_id, approved=approved, reason=reason, at=time.time(), mac=mac)
        self._write(self.decisions_dir / f"{request_id}.json", decision.model_dump_json())

    def decision(self, request_id: str) -> Decision | None:
        path = self.decisions_dir / f"{request_id}.json"
        raw = self._read(path)
        try:
            decision = None if raw is None else Decision.model_validate(raw)
        except ValidationError:
            return None
        if decision is None or decision.id != request_id:
            return None
        if not self.key.verify(decision.mac, "decision", request_id, str(decision.approved)):
            self._forged(f"call {request_id}", path)
            return None
        return decision

    def forget_decision(self, request_id: str) -> None:
        (self.decisions_dir / f"{request_id}.json").unlink(missing_ok=True)

    # --- servers and tools --------------------------------------------------------------------
    def approved_servers(self) -> dict[str, str]:
        """Server name -> the digest the user approved (entries whose MAC verifies only)."""
        raw = self._read(self.servers_file)
        approved: dict[str, str] = {}
        for name, entry in raw.items() if isinstance(raw, dict) else ():
            sha = entry.get("digest") if isinstance(entry, dict) else None
            if isinstance(sha, str) and self.key.verify(entry.get("mac"), "server", str(name), sha):
                approved[str(name)] = sha
            else:
                self._forged(f"MCP server {name!r}", self.servers_file)
        return approved

    def trusted_pins(self, source: str) -> dict[str, str]:
        """Trusted server name -> the digest first seen in mcp.json ``source``. An entry the key
        does not verify maps to "" (matches no definition): a tampered pin asks, it does not
        start the server as seen for the first time."""
        raw = self._read(self.trusted_file)
        entries = raw.get(source) if isinstance(raw, dict) else None
        pins: dict[str, str] = {}
        for name, entry in entries.items() if isinstance(entries, dict) else ():
            sha = entry.get("digest") if isinstance(entry, dict) else None
            if isinstance(sha, str) and self.key.verify(entry.get("mac"), "trusted", source, str(name), sha):
                pins[str(name)] = sha
            else:
                pins[str(name)] = ""
                self._forged(f"trusted MCP server {name!r} of {source}", self.trusted_file)
        return pins

    def pin_trusted(self, source: str, digests: Mapping[str, str]) -> None:
        with self._locked():
            raw = self._read(self.trusted_file)
            kept = {k: v for k, v in raw.items() if k != source} if isinstance(raw, dict) else {}
            merged = {**self.trusted_pins(source), **digests}
            kept[source] = {
                name: {"digest": sha, "mac": self.key.sign("trusted", source, name, sha)}
                for name, sha in merged.items()
            }
            self._write(self.trusted_file, kept)

    def pinned_tools(self) -> dict[str, dict[str, Any]]:
        """``server/tool`` -> its approved definition (entries whose MAC verifies only)."""
        raw = self._read(self.tools_file)
        pinned: dict[str, dict[str, Any]] = {}
        for key, entry in raw.items() if isinstance(raw, dict) else ():
            definition = entry.get("definition") if isinstance(entry, dict) else None
            if isinstance(definition, dict) and self.key.verify(
                entry.get("mac"), "tool", str(key), tool_digest(definition)
            ):
                pinned[str(key)] = definition
            else:
                self._forged(f"MCP tool {key!r}", self.tools_file)
        return pinned

    def approve_servers(self, digests: Mapping[str, str], notify: bool = True) -> None:
        with self._locked():
            merged = {**self.approved_servers(), **digests}
            signed = {
                name: {"digest": sha, "mac": self.key.sign("server", name, sha)}
                for name, sha in merged.items()
            }
            self._write(self.servers_file, signed)
        if notify:
            self.touch()

    def pin_tools(self, definitions: Mapping[str, Mapping[str, Any]], notify: bool = True) -> None:
        with self._locked():
            merged = {**self.pinned_tools(), **{k: dict(v) for k, v in definitions.items()}}
            signed = {
                key: {"definition": d, "mac": self.key.sign("tool", key, tool_digest(d))}
                for key, d in merged.items()
            }
            self._write(self.tools_file, signed)
        if notify:
            self.touch()

    def touch(self) -> None:
        """Tell a running agent that approvals changed (it watches this file)."""
        self._write(self.stamp, f"{time.time()}\n")

    def approve(self, request: PendingRequest) -> None:
        """Apply the user's approval of one request."""
        if request.kind is RequestKind.CALL:
            self.decide(request.id, True)
            return
        if request.kind is RequestKind.SERVER:
            # The digest of the definition the user was shown, not the one the file claims.
            self.approve_servers({request.mcp_server or "": digest(request.definition)})
        else:
            self.pin_tools({tool_key(request.mcp_server or "", request.tool): request.definition})
        self.remove_pending(request.id)

    # --- what the agent may start and offer ----------------------------------------------------
    def gate_servers(
        self, config: MCPConfig, trusted: Iterable[str], now: float
    ) -> tuple[MCPConfig, list[MCPServerFailure]]:
        """The servers that may start; the others become requests (and failures saying why)."""
        source = os.path.realpath(config.source)
        split = split_servers(
            config.servers, self.approved_servers(), trusted, now, self.trusted_pins(source)
        )
        if split.new_pins:  # trusted servers seen for the first time: a later change is asked
            self.pin_trusted(source, split.new_pins)
        self.sync_pending([RequestKind.SERVER], split.waiting)
        failures = [
            MCPServerFailure(
                server=r.mcp_server or "",
                message=f"not started: waiting for the workstation's user to approve its command "
                f"({' '.join(r.command)}): vancetope-agent approve {r.id}",
            )
            for r in split.waiting
        ]
        for r in split.waiting:
            log.warning(
                "MCP server %r is not started until you approve its command: %s  (run: vancetope-agent "
                "pending, then vancetope-agent approve %s)",
                r.mcp_server,
                " ".join(r.command),
                r.id,
            )
        allowed = {name: config.servers[name] for name in split.start}
        return config.model_copy(update={"servers": allowed}), failures

    def gate_tools(
        self, discovered: list[ToolDescriptor], now: float
    ) -> tuple[list[ToolDescriptor], dict[tuple[str, str], str]]:
        """Tools as pinned are offered; first seen ones are pinned; changed ones wait."""
        split = split_tools(discovered, self.pinned_tools(), now)
        if split.new_pins:
            self.pin_tools(split.new_pins, notify=False)
        self.sync_pending([RequestKind.TOOL], split.changed)
        held: dict[tuple[str, str], str] = {}
        for r in split.changed:
            why = (
                f"its definition changed since it was approved; not offered until the workstation's user "
                f"runs vancetope-agent approve {r.id}"
            )
            held[(r.mcp_server or "", r.tool)] = why
            log.warning("MCP tool %r of server %r: %s\n%s", r.tool, r.mcp_server, why, r.diff)
        return split.offered, held


__all__ = ["ConsentDir", "ConsentStateError"]
