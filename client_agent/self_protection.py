"""The agent's own files stay out of its tools' reach (layer: client_agent, pure).

One job: name the files that decide what this agent runs - its config, ``mcp.json``,
credential file, state directory (``data_dir``: consent approvals live there) and log
file - and refuse a config whose sandbox root contains (or equals) one of them, or lies
inside the state directory. A tool that can write ``mcp.json`` and the approval state
could start any command on the workstation (a forged ``approved_servers.json``, a new
server, the reload stamp): three ``write_local_file`` calls were enough before this.

The same paths are given to the native tools' ``Sandbox`` as ``protected``, so a call is
refused even if a path reaches them some other way (defence in depth).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from client_agent.errors import AgentConfigError


class AgentFiles(Protocol):
    """What this module reads of the agent's config (``client_agent.config.AgentConfig``)."""

    @property
    def mcp_json(self) -> Path | None: ...
    @property
    def credential_file(self) -> Path | None: ...
    @property
    def data_dir(self) -> Path: ...
    @property
    def log_file(self) -> Path | None: ...
    @property
    def sandbox_roots(self) -> Sequence[Path]: ...


STATE_DIR = "state directory (data_dir)"


def protected_paths(config: AgentFiles, config_file: Path | None) -> dict[str, Path]:
    """Label -> real path of every file and folder of the agent itself."""
    named: dict[str, Path | None] = {
        "config file": config_file,
        "mcp.json": config.mcp_json,
        "credential file": config.credential_file,
        STATE_DIR: config.data_dir,
        "log file": config.log_file,
    }
    return {label: _real(path) for label, path in named.items() if path is not None}


def exposure(root: Path, label: str, own: Path) -> str | None:
    """Why sandbox root ``root`` exposes the agent's ``own`` file, or None (both real paths)."""
    if own == root:
        return f"is the agent's {label} {own}"
    if own.is_relative_to(root):
        return f"contains the agent's {label} {own}"
    if label == STATE_DIR and root.is_relative_to(own):
        return f"is inside the agent's {label} {own}"
    return None


def check_sandbox_roots(config: AgentFiles, config_file: Path | None) -> None:
    """AgentConfigError naming the root and the file when a sandbox root exposes one of them."""
    own = protected_paths(config, config_file)
    for root in config.sandbox_roots:
        real_root = _real(root)
        for label, path in own.items():
            why = exposure(real_root, label, path)
            if why is not None:
                raise AgentConfigError(
                    str(config_file) if config_file is not None else "the agent config",
                    "sandbox_roots",
                    f"sandbox root {str(root)!r} {why}: the agent's tools could rewrite what it trusts "
                    f"(its MCP servers and their approval); move the {label} out of the sandbox roots "
                    "or choose a narrower root",
                )


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))
