"""The key that signs the workstation user's approvals (layer: client_agent, I/O).

One job: ``<data_dir>/consent/approval.key``, 32 random bytes made on first use (0600,
this user's, one link), and HMAC-SHA256 over what an approval says. Every approval
``vancetope-agent approve`` records (a server's digest, a tool's pinned definition, a
call's decision) carries the MAC of its exact content; the agent counts only entries
whose MAC verifies. So an ``approved_servers.json`` (or a decision) written by anything
but this agent and its CLI - a forged file from a tool, one copied from another
workstation or agent, a restored backup - counts as nothing: the server still waits for
``vancetope-agent approve``.

Why a MAC and not only the directory's mode: the consent directory is kept out of the
agent's tools' reach (client_agent.self_protection), and the MAC turns any way around
that which can write a file but not read this key into a refused approval instead of a
command run on the workstation. Someone who can read this key can run commands as the
user already; that is outside what the agent can defend.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from client_agent.errors import AgentError

KEY_FILE = "approval.key"
_KEY_BYTES = 32


class ApprovalKeyError(AgentError):
    """The approval key cannot be trusted (others may read it, another user owns it) or made."""


class ApprovalKey:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    @classmethod
    def load_or_create(cls, path: Path) -> ApprovalKey:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            return cls(_read(path))
        except OSError as exc:
            raise ApprovalKeyError(f"cannot create the approval key {path}: {exc.strerror or exc}") from exc
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_bytes(_KEY_BYTES))
        return cls(_read(path))

    def sign(self, *parts: str) -> str:
        message = "\x00".join(parts).encode("utf-8", "surrogatepass")
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def verify(self, mac: object, *parts: str) -> bool:
        return isinstance(mac, str) and hmac.compare_digest(mac, self.sign(*parts))


def _read(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ApprovalKeyError(f"cannot read the approval key {path}: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        problem = _untrusted(info)
        if problem:
            raise ApprovalKeyError(
                f"the approval key {path} {problem}: approvals signed with it cannot be trusted; "
                f"remove it (every MCP server and pinned tool is then asked again)"
            )
        secret = handle.read(_KEY_BYTES + 1)
    if len(secret) != _KEY_BYTES:
        raise ApprovalKeyError(
            f"the approval key {path} is not {_KEY_BYTES} bytes; remove it (approvals are asked again)"
        )
    return secret


def _untrusted(info: os.stat_result) -> str:
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_uid != os.getuid():
        return f"belongs to uid {info.st_uid}, not to this user"
    if info.st_mode & 0o077:
        return f"may be read by others (mode {stat.S_IMODE(info.st_mode):o})"
    if info.st_nlink != 1:
        return f"has {info.st_nlink} hard links"
    return ""
