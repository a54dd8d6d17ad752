"""brain.runtime.scheduler and brain.runtime.intake on a real SQLite store and nothing else.

The scheduler is handed its collaborators, so here Redis and Celery are stand-ins that only
write down what the scheduler asked of them: which calls it sent, which work it parked, which
trees it woke. What is recorded is read back from the store, the record."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from brain.config import load_settings
from brain.core.models import SessionKind, TaskSpec, TaskState, TaskTree, TreeStatus
from brain.core.routing import Presence
from brain.hot.parked import ParkedRef
from brain.runtime.intake import Intake
from brain.runtime.scheduler import Scheduler
from brain.store.sqlite import SQLiteStore
from tests.unit.brain.runtime.rig import Sent, server_registry
from workers.contracts import ErrorInfo, ToolCall, ToolResult


class Hot:
    def __init__(self) -> None:
        self.woken: list[str] = []
        self.finished: list[str] = []

    def notify(self, tree_id: str) -> None:
        self.woken.append(tree_id)

    def tree_finished(self, tree_id: str) -> None:
        self.finished.append(tree_id)


class NobodyConnected:
    def enrollment(self, client_id: str) -> None:
        return None

    def sessions(self) -> dict[str, Any]:
        return {}

    def sessions_for(self, user: str | None, client_id: str | None = None) -> dict[str, Any]:
        return {}

    def session(self, client_id: str) -> None:
        return None

    def view(
        self, *, user: str | None, session_client: str | None, sessions: Any, registry: Any = None
    ) -> Presence:
        return Presence(user=user, session_client=session_client)


class Parked:
    def __init__(self) -> None:
        self.refs: list[ParkedRef] = []

    def park(self, ref: ParkedRef) -> None:
        self.refs.append(ref)


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[tuple[Scheduler, Intake, Sent, Hot, Parked]]:
    registry = server_registry()
    settings = load_settings(env={}, cwd=tmp_path, data_dir=tmp_path / "data")
    store = SQLiteStore(tmp_path / "store.db")
    sent, hot, parked = Sent(), Hot(), Parked()
    clock = iter(range(1_000, 10**6)).__next__
    scheduler = Scheduler(
        store,
        hot,  # type: ignore[arg-type]
        sent,  # type: ignore[arg-type]
        registry,
        settings,
        presence=NobodyConnected(),  # type: ignore[arg-type]
        parked=parked,  # type: ignore[arg-type]
        clock=lambda: float(clock()),
    )
    yield scheduler, Intake(scheduler), sent, hot, parked
    store.close()


def chain(*tasks: dict[str, Any]) -> TaskTree:
    return TaskTree.model_validate({"id": "t", "tasks": list(tasks)})


def result(call: ToolCall, value: Any = "ok", *, ok: bool = True) -> ToolResult:
    return ToolResult(
        run_id=call.run_id,
        tree_id=call.tree_id,
        task_id=call.task_id,
        tool=call.tool,
        ok=ok,
        value=value if ok else None,
        error=None if ok else ErrorInfo(type="ToolFailed", message="HTTP 503"),
        worker="w",
        started_at=1.0,
        finished_at=2.0,
    )


def states(scheduler: Scheduler, tree_id: str) -> dict[str, TaskState]:
    return dict(scheduler.store.task_states(tree_id))


def test_a_chain_runs_one_task_after_another_and_the_next_takes_the_last_result(parts: Any) -> None:
    scheduler, intake, sent, hot, _ = parts
    rec = scheduler.submit(
        chain(
            {"id": "a", "tool": "echo", "args": {"value": "hello"}},
            {"id": "b", "tool": "echo", "args": {"value": "${tasks.a.result}"}, "depends_on": ["a"]},
        )
    )
    assert [c.task_id for c in sent.calls] == ["a"]
    assert states(scheduler, rec.tree_id) == {"a": TaskState.QUEUED_SERVER, "b": TaskState.PENDING}

    assert intake.on_result(result(sent.of("a")[-1], "hello"))
    assert sent.of("b")[-1].args == {"value": "hello"}
    assert intake.on_result(result(sent.of("b")[-1], "hello"))
    assert states(scheduler, rec.tree_id) == {"a": TaskState.DONE, "b": TaskState.DONE}
    assert scheduler.store.get_tree(rec.tree_id).status is TreeStatus.DONE
    assert hot.finished == [rec.tree_id]


def test_a_process_recording_one_result_of_a_big_tree_validates_only_the_specs_it_uses(parts: Any) -> None:
    """Each pool child and each brain validated the whole spec of every tree it recorded a
    result of: O(N) per process per tree (bench/README.md, "The CPU rows")."""
    scheduler, _, sent, hot, parked = parts
    tasks = [{"id": f"e{i}", "tool": "echo", "args": {"value": i}} for i in range(300)]
    scheduler.submit(
        chain(*tasks, {"id": "last", "tool": "echo", "args": {"value": 0}, "depends_on": ["e0"]})
    )
    # Another process: the same store, a scheduler that has not seen the tree.
    other = Scheduler(
        scheduler.store, hot, sent, scheduler.registry, scheduler.settings,
        presence=scheduler.presence, parked=parked, clock=scheduler.clock,
    )  # fmt: skip
    before = specs_alive()
    assert Intake(other).take(result(sent.of("e0")[-1])) is TaskState.DONE
    assert sent.of("last")  # its dependent, started by the other process
    assert Intake(other).take(result(sent.of("e1")[-1])) is TaskState.DONE
    assert specs_alive() - before == 1  # "last"'s, not 301


def specs_alive() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is TaskSpec)


def test_a_result_is_recorded_once_and_a_stale_run_changes_nothing(parts: Any) -> None:
    scheduler, intake, sent, _, _ = parts
    rec = scheduler.submit(chain({"id": "a", "tool": "echo", "args": {"value": 1}}))
    call = sent.of("a")[-1]
    assert intake.on_result(result(call, 1))
    assert not intake.on_result(result(call, 2))  # redelivered: already recorded
    stale = result(call, 3).model_copy(update={"run_id": call.run_id[:-1] + "0"})
    assert not intake.on_result(stale)
    assert scheduler.store.get_task(rec.tree_id, "a").result == 1


def test_a_failure_skips_its_dependents_and_fails_the_tree(parts: Any) -> None:
    scheduler, intake, sent, _, _ = parts
    rec = scheduler.submit(
        chain(
            {"id": "a", "tool": "echo", "args": {"value": 1}},
            {"id": "b", "tool": "echo", "args": {"value": 2}, "depends_on": ["a"]},
            {"id": "c", "tool": "echo", "args": {"value": 3}, "depends_on": ["b"]},
        )
    )
    assert intake.on_result(result(sent.of("a")[-1], ok=False))
    assert states(scheduler, rec.tree_id) == {
        "a": TaskState.FAILED,
        "b": TaskState.SKIPPED,
        "c": TaskState.SKIPPED,
    }
    assert scheduler.store.get_task(rec.tree_id, "b").reason == "upstream task 'a' failed"
    assert scheduler.store.get_tree(rec.tree_id).status is TreeStatus.FAILED
    assert [c.task_id for c in sent.calls] == ["a"]


def test_a_client_tool_with_nobody_connected_is_parked_not_sent(parts: Any) -> None:
    scheduler, _, sent, _, parked = parts
    rec = scheduler.submit(
        chain({"id": "r", "tool": "read_local_file", "args": {"path": "notes.txt"}}),
        session=SessionKind.AUTONOMOUS,
        user="demo",
    )
    task = scheduler.store.get_task(rec.tree_id, "r")
    assert task.state in (TaskState.BLOCKED, TaskState.PENDING_CLIENT)
    assert sent.calls == []
    assert [(r.tree_id, r.task_id) for r in parked.refs] == [(rec.tree_id, "r")]


def test_an_unknown_tool_fails_its_task_naming_it(parts: Any) -> None:
    scheduler, _, sent, _, _ = parts
    rec = scheduler.submit(chain({"id": "x", "tool": "no_such_tool"}))
    task = scheduler.store.get_task(rec.tree_id, "x")
    assert task.state is TaskState.FAILED and "no_such_tool" in task.error.message
    assert sent.calls == []
