"""The consent state directory and the gate that holds a call (files and threads, no Redis)."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from client_agent.approvals import ConsentDir
from client_agent.config import AgentConfig
from client_agent.consent import RequestKind
from client_agent.consent_gate import ConsentGate
from workers.contracts import ToolAwaiting, ToolCall, ToolType


def config(tmp_path: Path, **overrides: object) -> AgentConfig:
    values: dict[str, object] = {
        "client_id": "laptop", "user": "ada", "broker_url": "redis://127.0.0.1:1/0", "data_dir": tmp_path,
        "ask": ["write_local_file"],
    }  # fmt: skip
    values.update(overrides)
    return AgentConfig.model_validate(values)


def call(task: str = "w", tree: str = "t1", tool: str = "write_local_file") -> ToolCall:
    return ToolCall(
        run_id=f"{tree}-{task}-1", tree_id=tree, task_id=task, tool=tool, tool_type=ToolType.NATIVE,
        args={"path": "a.txt", "content": "every byte shown"}, timeout_s=5, max_result_bytes=1000,
    )  # fmt: skip


def test_the_state_directory_is_private_to_the_user(tmp_path: Path) -> None:
    root = tmp_path / "consent"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    ConsentDir(root).open()
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


class Gate:
    def __init__(self, tmp_path: Path, **overrides: object) -> None:
        self.state = ConsentDir(tmp_path / "consent").open()
        self.reports: list[ToolAwaiting] = []
        self.stop = threading.Event()
        self.gate = ConsentGate(
            config(tmp_path, **overrides), self.state, self.reports.append, self.stop, poll_s=0.01
        )
        self.outcomes: dict[str, object] = {}
        self.threads: list[threading.Thread] = []

    def start(self, c: ToolCall) -> None:
        t = threading.Thread(target=lambda: self.outcomes.__setitem__(c.task_id, self.gate(c)), daemon=True)
        t.start()
        self.threads.append(t)

    def pending(self, n: int = 1, timeout: float = 60.0) -> list:
        # a bound in seconds, not in polls: 500 polls of 0.01 s were 5 s, short under load
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [r for r in self.state.pending() if r.kind is RequestKind.CALL]
            if len(found) >= n:
                return found
            self.stop.wait(0.01)
        raise AssertionError(f"no pending call within {timeout}s")

    def join(self) -> None:
        for t in self.threads:
            t.join(60)
            assert not t.is_alive()


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[Gate]:
    g = Gate(tmp_path)
    yield g
    g.stop.set()


def test_a_call_of_a_tool_that_does_not_ask_passes_at_once(gate: Gate) -> None:
    assert gate.gate(call(tool="read_local_file")) is None and gate.reports == []


def test_an_approved_call_runs_and_the_brain_hears_it_wait_and_resume(gate: Gate) -> None:
    gate.start(call())
    (request,) = gate.pending()
    assert request.args == {"path": "a.txt", "content": "every byte shown"} and request.task_id == "w"
    gate.state.approve(request)
    gate.join()
    assert gate.outcomes["w"] is None
    assert [(r.waiting, r.approval_id) for r in gate.reports] == [(True, request.id), (False, request.id)]
    assert gate.state.pending() == []


def test_a_denied_call_fails_naming_the_user_the_task_and_the_reason(gate: Gate) -> None:
    gate.start(call())
    (request,) = gate.pending()
    gate.state.decide(request.id, False, "not today")
    gate.join()
    error = gate.outcomes["w"]
    assert error is not None and error.type == "ApprovalDenied"
    assert "denied by the workstation's user: not today" in error.message and "'w'" in error.message
    assert [r.waiting for r in gate.reports] == [True]  # a denial reaches the brain as the failed result


def test_an_unanswered_call_is_denied_after_ask_timeout(tmp_path: Path) -> None:
    g = Gate(tmp_path, ask_timeout_s=0.2)
    error = g.gate.__call__(call())
    assert error is not None and error.type == "ApprovalTimeout"
    assert "no approval within 0.2s" in error.message
    assert g.state.pending() == []


def test_a_call_held_while_the_workstation_slept_past_ask_timeout_is_denied_on_waking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The monotonic clock stops during suspend: only the wall clock says the week went by. The
    # brain took the call back meanwhile; an approval now would run it beside its new run.
    g = Gate(tmp_path, ask_timeout_s=600)
    g.start(call())
    assert len(g.pending()) == 1
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 9 * 86_400)  # nine days asleep
    g.join()
    error = g.outcomes["w"]
    assert error is not None and error.type == "ApprovalTimeout", error
    g.stop.set()


def test_tree_scope_one_approval_covers_the_trees_later_calls_of_that_tool_only(tmp_path: Path) -> None:
    g = Gate(tmp_path, ask_scope="tree", ask_timeout_s=0.3)
    g.start(call("first"))
    (request,) = g.pending()
    g.state.approve(request)
    g.join()
    assert g.outcomes["first"] is None
    assert g.gate(call("second")) is None  # same tree, same tool: no new request
    other_tree = g.gate(call("third", tree="t2"))
    assert other_tree is not None and other_tree.type == "ApprovalTimeout"


def test_call_scope_asks_for_every_call(tmp_path: Path) -> None:
    g = Gate(tmp_path, ask_timeout_s=0.3)
    g.start(call("first"))
    g.state.approve(g.pending()[0])
    g.join()
    assert g.gate(call("second")) is not None


def test_a_stopping_agent_ends_the_wait_with_a_clear_error(gate: Gate) -> None:
    gate.start(call())
    gate.pending()
    gate.stop.set()
    gate.join()
    error = gate.outcomes["w"]
    assert error is not None and error.type == "ApprovalAborted" and "stopped" in error.message


def test_server_and_tool_approvals_are_kept_for_the_next_start(tmp_path: Path) -> None:
    state = ConsentDir(tmp_path / "consent").open()
    state.approve_servers({"git": "abc"})
    state.pin_tools({"git/commit": {"name": "commit", "description": "d", "input_schema": {}}})
    again = ConsentDir(tmp_path / "consent").open()
    assert again.approved_servers() == {"git": "abc"}
    assert again.pinned_tools()["git/commit"]["description"] == "d"
    assert stat.S_IMODE(again.servers_file.stat().st_mode) == 0o600
