"""client_agent.agent: the pure helpers behind its log lines (the process itself is tested in
tests/integration/test_client_agent.py)."""

from __future__ import annotations

import pytest

from client_agent.agent import describe_result, tool_changes
from client_agent.worker import worker_hostname
from workers.contracts import ErrorInfo, ToolDescriptor, ToolResult, ToolType
from workers.urls import redact_url


def result(ok: bool) -> ToolResult:
    error = (
        None if ok else ErrorInfo(type="SandboxViolation", message="read_local_file: path '/x' is outside")
    )
    return ToolResult(
        run_id="r1", tree_id="t", task_id="k", tool="read_local_file", ok=ok, error=error,
        started_at=10.0, finished_at=10.25, client_id="laptop",
    )  # fmt: skip


def test_each_tool_run_is_one_log_line() -> None:
    assert describe_result(result(True)) == "ran read_local_file for task k (run r1): ok in 0.25s"
    assert describe_result(result(False)) == (
        "ran read_local_file for task k (run r1): failed in 0.25s: SandboxViolation: "
        "read_local_file: path '/x' is outside"
    )


def tools(*names: str) -> list[ToolDescriptor]:
    return [ToolDescriptor(name=name, type=ToolType.MCP, mcp_server="s") for name in names]


@pytest.mark.parametrize(
    ("old", "new", "line"),
    [
        (tools("a", "b"), tools("b", "c"), "added c; removed a"),
        (tools(), tools("x"), "added x"),
        (tools("x"), tools(), "removed x"),
        (tools("a", "b"), tools("b", "a"), "same 2 MCP tools"),
    ],
)
def test_a_reload_logs_which_tools_came_and_went(
    old: list[ToolDescriptor], new: list[ToolDescriptor], line: str
) -> None:
    assert tool_changes(old, new) == line


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://laptop:s3cret@broker:6379/0", "redis://laptop:***@broker:6379/0"),
        (
            "rediss://:s3cret@broker:6380/0?ssl_cert_reqs=required",
            "rediss://:***@broker:6380/0?ssl_cert_reqs=required",
        ),
    ],
)
def test_broker_password_never_reaches_the_log(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_the_worker_is_named_after_the_client() -> None:
    assert worker_hostname("laptop") == "client-agent@laptop"
