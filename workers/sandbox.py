"""Server-side MCP servers in a sandbox of their own (layer: workers; pure argv, then one probe).

An MCP server of the brain's ``mcpServers`` file is third-party code run by the brain (to
discover its tools) and by every server pool worker. ``workers.proc_guard`` keeps the stack's
credentials out of its environment and its parent's memory, but as the stack's own OS user
it could still open the stack's 0600 files: ``<data_dir>/redis/admin.secret`` (every Redis
user's password derives from it), ``vault.key``, the SQLite store, ``flower.secret``.

With ``mcp_sandbox = "auto"`` (the default) and bubblewrap (``bwrap``) on the machine, each
such server starts inside ``bwrap``:

- ``--ro-bind / /``: the same filesystem, read-only, so the server runs as it would but cannot
  rewrite what the stack runs next (the ``mcpServers`` file, whose ``env`` may name any
  ``${vault:…}``; ``vancetope.toml``; the registry; a ``.pth`` file in site-packages);
  ``--dev /dev`` and ``--bind /tmp /tmp``: devices, and ``/tmp`` writable as usual;
- ``--tmpfs`` over each hidden folder (the data dir: an empty folder in its place) and
  ``/dev/null`` over each hidden file (the vault key file, ``vancetope.toml``, a SQLite store
  kept elsewhere), so none of them can be read;
- ``--unshare-pid --proc /proc``: it sees its own processes only, not the pool's
  ``/proc/<pid>/environ`` or ``mem``;
- ``--die-with-parent`` (it ends with its worker) and ``--new-session`` (it cannot push
  keystrokes into a terminal).

A server that must write somewhere writes under ``/tmp`` (``TMPDIR``); keep the stack's own
files out of ``/tmp``, which stays writable.

``"bwrap"`` insists (a server is not started without it), ``"none"`` starts servers as they
are. ``auto`` uses bwrap only if it runs here (one probe at start: unprivileged user
namespaces may be off), else logs once that servers run unconfined. The client agent's
``mcp.json`` servers are the workstation user's own and never pass through here.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from workers.errors import WorkerError

log = logging.getLogger("vancetope.worker")

SandboxMode = Literal["auto", "bwrap", "none"]
PROBE_TIMEOUT_S = 10.0


class SandboxUnavailable(WorkerError):
    """``mcp_sandbox = "bwrap"``, and bubblewrap is missing or does not run here."""


@dataclass(frozen=True)
class Sandbox:
    """How to start a server-side MCP server: inside ``bwrap``, with ``hidden`` folders empty
    and ``masked`` files unreadable."""

    bwrap: str
    hidden: tuple[str, ...]
    masked: tuple[str, ...] = ()

    def wrap(self, command: str, args: Sequence[str]) -> tuple[str, list[str]]:
        """The command line that runs ``command args`` in the sandbox."""
        return self.bwrap, [*bwrap_options(self.hidden, self.masked), "--", command, *args]


def bwrap_options(hidden: Sequence[str], masked: Sequence[str] = ()) -> list[str]:
    """bubblewrap's options: the whole filesystem read-only but devices and /tmp, an empty tmpfs
    over each hidden folder, /dev/null over each masked file, a PID namespace with its own /proc,
    gone with its parent, in a session of its own."""
    options = ["--ro-bind", "/", "/", "--dev", "/dev", "--bind", "/tmp", "/tmp"]
    for folder in hidden:
        options += ["--tmpfs", folder]
    for file in masked:
        options += ["--ro-bind", "/dev/null", file]
    return [*options, "--unshare-pid", "--proc", "/proc", "--die-with-parent", "--new-session"]


def probe(bwrap: str, hidden: Sequence[str], masked: Sequence[str] = ()) -> str | None:
    """None if ``bwrap`` runs a command with these options here, else why not."""
    try:
        proc = subprocess.run(
            [bwrap, *bwrap_options(hidden, masked), "--", "true"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} did not run: {exc}"
    if proc.returncode != 0:
        return f"{bwrap} exited {proc.returncode}: {proc.stderr.strip()[-300:]}"
    return None


def choose(
    mode: SandboxMode,
    hidden: Sequence[Path],
    which: Callable[[str], str | None] = shutil.which,
    try_it: Callable[[str, Sequence[str], Sequence[str]], str | None] = probe,
) -> tuple[Sandbox | None, str]:
    """The sandbox for ``mode`` and a line saying what was decided. ``hidden`` folders become
    empty, ``hidden`` files unreadable; only what exists is hidden (bwrap mounts over a path, it
    does not make one, and what does not exist holds no secret)."""
    if mode == "none":
        return None, "server-side MCP servers run without a sandbox (mcp_sandbox = none)"
    folders = tuple(dict.fromkeys(str(p.resolve()) for p in hidden if p.is_dir()))
    # A file inside a hidden folder is gone with it already.
    files = tuple(
        dict.fromkeys(
            str(p.resolve())
            for p in hidden
            if p.is_file() and not any(p.resolve().is_relative_to(folder) for folder in folders)
        )
    )
    found = which("bwrap")
    why = "bubblewrap (bwrap) is not installed" if found is None else try_it(found, folders, files)
    if found is not None and why is None:
        unseen = ", ".join((*folders, *files)) or "nothing hidden"
        line = (
            f"server-side MCP servers run in bubblewrap, the filesystem read-only but /tmp, without {unseen}"
        )
        return Sandbox(found, folders, files), line
    if mode == "bwrap":
        raise SandboxUnavailable(
            f"mcp_sandbox = bwrap, but {why}: install bubblewrap (apt-get install bubblewrap), allow "
            "unprivileged user namespaces, or set mcp_sandbox = auto"
        )
    return None, (
        f"server-side MCP servers run without a sandbox: {why}; as the stack's user they can open "
        "its data dir (docs/security.md, 'Server-side MCP servers')"
    )


_installed: list[Sandbox | None] = [None]


def install(sandbox: Sandbox | None) -> None:
    """What every server-side MCP server this process starts from now on runs in."""
    _installed[0] = sandbox


def current() -> Sandbox | None:
    return _installed[0]


def install_chosen(mode: SandboxMode, hidden: Sequence[Path]) -> Sandbox | None:
    """``choose`` and ``install``, logging the decision (a warning when servers run unconfined
    though a sandbox was wanted); SandboxUnavailable for ``bwrap`` without one."""
    sandbox, line = choose(mode, hidden)
    (log.info if sandbox is not None or mode == "none" else log.warning)("%s", line)
    install(sandbox)
    return sandbox


__all__ = [
    "Sandbox",
    "SandboxMode",
    "SandboxUnavailable",
    "bwrap_options",
    "choose",
    "current",
    "install",
    "install_chosen",
    "probe",
]
