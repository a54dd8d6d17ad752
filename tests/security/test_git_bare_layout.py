"""A tree that shapes a sandbox folder into a bare git repository runs nothing (issue 20, a
finding of the attacker trial).

``HEAD``, ``objects/``, ``refs/`` and a ``config`` are no control files, so ``write_local_file``
may write them anywhere in a sandbox. GitPython (in mcp-server-git) and git (in the native
git_status) then take that folder for a repository, whose config names a program
(``core.fsmonitor``) or a working tree elsewhere (``core.worktree``). Each attack here first
shows the marker program would run, then that the agent's guard refuses the call and the marker
never appears.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from client_agent.errors import PolicyViolation
from client_agent.git_server import confine_git_servers
from client_agent.mcp_json import GuardedMCPManager
from workers.errors import ToolFailed
from workers.mcp_clients import MCPClientManager
from workers.mcp_config import MCPConfig, StdioServerSpec
from workers.tools.builtin import BuiltinContext
from workers.tools.native import Sandbox, native_tools

pytestmark = pytest.mark.integration

GIT_SERVER = str(Path(sys.executable).parent / "mcp-server-git")


def shape_bare_repository(folder: Path, marker: Path, worktree: Path | None = None) -> None:
    """What three or four write_local_file calls leave: a bare layout whose config runs ``marker``."""
    (folder / "objects" / "info").mkdir(parents=True)
    (folder / "refs" / "heads").mkdir(parents=True)
    (folder / "HEAD").write_text("ref: refs/heads/main\n")
    lines = ["[core]", "\trepositoryformatversion = 0", f'\tfsmonitor = "touch {marker}; echo"']
    if worktree is not None:
        lines += ["\tbare = false", f"\tworktree = {worktree}"]
    (folder / "config").write_text("\n".join(lines) + "\n")


def sandbox_repository(tmp_path: Path) -> Path:
    sandbox = tmp_path / "sandbox"
    subprocess.run(["git", "init", "-q", str(sandbox)], check=True)
    (sandbox / "notes.txt").write_text("mine\n")
    return sandbox


def test_mcp_server_git_runs_no_program_of_a_bare_layout_a_tree_wrote(tmp_path: Path) -> None:
    sandbox = sandbox_repository(tmp_path)
    marker = tmp_path / "PWNED"
    shape_bare_repository(sandbox / "evil", marker, worktree=sandbox / "evil")
    spec = StdioServerSpec(command=GIT_SERVER, args=["--repository", "sandbox"], cwd=str(tmp_path))
    config = MCPConfig(source="mcp.json", servers={"git": spec})

    # The attack is real: the server as released runs the bare layout's fsmonitor.
    released = MCPClientManager(config, start_timeout=120)
    try:
        released.call_tool("git", "git_status", {"repo_path": str(sandbox / "evil")}, 120)
    finally:
        released.close()
    assert marker.exists(), "the attack did not reproduce: mcp-server-git ran no fsmonitor"
    marker.unlink()

    # The agent's way: confined at start, every call held to the --repository itself.
    confined, failures = confine_git_servers(config)
    assert failures == []
    guarded = GuardedMCPManager(confined, start_timeout=120)
    try:
        guarded.discover(120)
        guarded.permit([("git", "git_status")], {})
        with pytest.raises(PolicyViolation, match="is not this MCP server's repository"):
            guarded.call_tool("git", "git_status", {"repo_path": str(sandbox / "evil")}, 120)
        with pytest.raises(PolicyViolation, match="is not this MCP server's repository"):
            guarded.call_tool("git", "git_status", {"repo_path": "sandbox/evil/../evil"}, 120)
        own = guarded.call_tool("git", "git_status", {"repo_path": "sandbox"}, 120)
    finally:
        guarded.close()
    assert "notes.txt" in str(own)  # the user's own repository still works
    assert not marker.exists()


def test_native_git_status_opens_no_bare_layout_whatever_working_tree_it_names(tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    outside = tmp_path / "outside"
    (outside / "secretdir").mkdir(parents=True)
    (outside / "secretdir" / "names.txt").write_text("x\n")
    marker = tmp_path / "PWNED"
    shape_bare_repository(sandbox / "bare", marker)
    shape_bare_repository(sandbox / "elsewhere", marker, worktree=outside)
    git_status = native_tools(Sandbox([sandbox]), shell_enabled=False, default_timeout_s=120)["git_status"]
    ctx = BuiltinContext(deadline=time.monotonic() + 30)
    for shaped in ("bare", "elsewhere"):
        with pytest.raises(ToolFailed, match="cannot use bare repository") as info:
            git_status.run({"path": shaped}, ctx)
        assert "secretdir" not in info.value.message
    assert not marker.exists()
