"""client_agent.policy: what is offered and what runs, decided from the config alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from client_agent.policy import Policy
from workers.contracts import ToolCall, ToolDescriptor, ToolType
from workers.execute import execute
from workers.tools.native import Sandbox


def mcp_tool(name: str, server: str) -> ToolDescriptor:
    return ToolDescriptor(name=name, type=ToolType.MCP, mcp_server=server)


def native_tool(name: str) -> ToolDescriptor:
    return ToolDescriptor(name=name, type=ToolType.NATIVE)


@pytest.mark.parametrize(
    ("allowed", "tool", "expected"),
    [
        (None, native_tool("shell_execute"), True),
        ((), native_tool("read_local_file"), False),
        (("read_*",), native_tool("read_local_file"), True),
        (("read_*",), native_tool("write_local_file"), False),
        (("git/*",), mcp_tool("git_log", "git"), True),
        (("git/*",), mcp_tool("git_log", "other"), False),
        (("git_log",), mcp_tool("git_log", "other"), True),
        (("git/*",), native_tool("git_status"), False),
    ],
)
def test_allowlist_matches_names_and_server_slash_name(
    tmp_path: Path, allowed: tuple[str, ...] | None, tool: ToolDescriptor, expected: bool
) -> None:
    assert Policy(Sandbox([tmp_path]), allowed_tools=allowed).allows(tool) is expected


@pytest.mark.parametrize(
    ("shell", "allowed", "announced"),
    [
        (False, None, ["read_local_file", "write_local_file", "list_directory", "git_status"]),
        (
            True,
            None,
            ["read_local_file", "write_local_file", "list_directory", "git_status", "shell_execute"],
        ),
        (True, ("read_local_file", "shell_*"), ["read_local_file", "shell_execute"]),
        (False, ("shell_execute",), []),
    ],
)
def test_announced_native_tools_follow_shell_flag_and_allowlist(
    tmp_path: Path, shell: bool, allowed: tuple[str, ...] | None, announced: list[str]
) -> None:
    policy = Policy(Sandbox([tmp_path]), shell_enabled=shell, allowed_tools=allowed)
    assert [t.name for t in policy.announced_native()] == announced


def test_a_call_to_a_tool_outside_the_allowlist_fails_naming_the_policy(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    policy = Policy(Sandbox([tmp_path]), allowed_tools=("list_directory",))
    call = ToolCall(
        run_id="r", tree_id="t", task_id="k", tool="read_local_file", tool_type=ToolType.NATIVE,
        args={"path": "notes.txt"}, timeout_s=5, max_result_bytes=1000, client_id="laptop",
    )  # fmt: skip
    result = execute(call, mcp=None, worker="w", native=policy.native(), client_id="laptop")
    assert not result.ok and result.error is not None
    assert result.error.type == "PolicyViolation"
    why = "tool is not allowed on this client agent (allowed_tools: [list_directory])"
    assert result.error.message == f"read_local_file: {why}"
    assert result.error.data == {"tool": "read_local_file", "path": None, "why": why}
