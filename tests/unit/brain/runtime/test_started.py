"""A run begun on a client agent (``Intake.on_started``) and its approval wait, against a real
store: ``queued_client -> running`` only for the current run, only from the client it was sent
to; held for approval and approved, it is ``running`` again, never ``queued_client``."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from brain.core.models import TaskRecord, TaskState, TaskTree, TreeRecord
from brain.core.transitions import check_move
from brain.runtime.intake import Intake
from brain.runtime.scheduler import Scheduler
from brain.store.sqlite import SQLiteStore
from workers.contracts import ToolAwaiting, ToolStarted

S = TaskState


class _Hot:
    def __init__(self) -> None:
        self.notified: list[str] = []

    def notify(self, tree_id: str) -> None:
        self.notified.append(tree_id)


class _Scheduler:
    """What Intake's start and approval doors use of the scheduler: its move, clock, wake-ups."""

    events = None

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.hot = _Hot()

    def clock(self) -> float:
        return 100.0

    def move(
        self, tree_id: str, task_id: str, state: TaskState, from_states: Collection[TaskState], **changes: Any
    ) -> TaskRecord | None:
        check_move(from_states, state)
        return self.store.transition(tree_id, task_id, from_states=from_states, state=state, **changes)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "store.db")
    tree = TaskTree.model_validate({"id": "t", "tasks": [{"id": "a", "tool": "x"}, {"id": "s", "tool": "x"}]})
    s.put_tree(
        TreeRecord(tree_id="t", tree=tree, submitted_at=0),
        [
            TaskRecord(
                tree_id="t", task_id="a", tool="x", state=S.QUEUED_CLIENT, run_id="r1", client_id="alice"
            ),
            TaskRecord(tree_id="t", task_id="s", tool="x", state=S.QUEUED_SERVER, run_id="rs"),
        ],
    )
    yield s
    s.close()


def intake(store: SQLiteStore) -> Intake:
    return Intake(cast(Scheduler, _Scheduler(store)))


def started(run_id: str = "r1", task_id: str = "a", client_id: str | None = "alice") -> ToolStarted:
    return ToolStarted(run_id=run_id, tree_id="t", task_id=task_id, started_at=42.0, client_id=client_id)


def state(store: SQLiteStore, task_id: str = "a") -> TaskState:
    rec = store.get_task("t", task_id)
    assert rec is not None
    return rec.state


def test_a_clients_start_moves_its_queued_call_to_running(store: SQLiteStore) -> None:
    door = intake(store)
    assert door.on_started(started(), from_client="alice")
    rec = store.get_task("t", "a")
    assert rec is not None and (rec.state, rec.started_at, rec.updated_at) == (S.RUNNING, 42.0, 100.0)
    assert not door.on_started(started(), from_client="alice")  # once: a repeat changes nothing


@pytest.mark.parametrize(
    ("message", "came_from"),
    [
        (started(client_id="alice"), "bob"),  # another client's outbox, claiming alice
        (started(client_id="bob"), "bob"),  # another client, honestly: not where it was sent
        (started(client_id="bob"), "alice"),  # alice's outbox, claiming bob
        (started(client_id="alice"), None),  # not through any client's outbox
        (started(run_id="r0"), "alice"),  # a run the task no longer has
        (started(task_id="nope"), "alice"),  # no such task
        (started(task_id="s", run_id="rs", client_id="alice"), "alice"),  # a server task
    ],
)
def test_a_start_counts_only_from_the_client_the_current_run_was_sent_to(
    store: SQLiteStore, message: ToolStarted, came_from: str | None
) -> None:
    assert not intake(store).on_started(message, from_client=came_from)
    assert (state(store), state(store, "s")) == (S.QUEUED_CLIENT, S.QUEUED_SERVER)


def awaiting(waiting: bool) -> ToolAwaiting:
    return ToolAwaiting(run_id="r1", tree_id="t", task_id="a", waiting=waiting, at=1.0, client_id="alice")


def test_begun_then_held_for_approval_then_approved_it_runs_again(store: SQLiteStore) -> None:
    door = intake(store)
    assert door.on_started(started(), from_client="alice")
    assert door.on_awaiting(awaiting(True), from_client="alice") and state(store) is S.AWAITING_APPROVAL
    assert not door.on_started(started(), from_client="alice")  # a late start does not release it
    assert state(store) is S.AWAITING_APPROVAL
    assert door.on_awaiting(awaiting(False), from_client="alice") and state(store) is S.RUNNING


def test_an_agent_that_never_says_it_began_still_waits_for_approval_and_runs(store: SQLiteStore) -> None:
    door = intake(store)  # an older agent: queued_client until it asks, running once approved
    assert door.on_awaiting(awaiting(True), from_client="alice") and state(store) is S.AWAITING_APPROVAL
    assert door.on_awaiting(awaiting(False), from_client="alice") and state(store) is S.RUNNING


def test_the_relay_parses_a_start_notice_and_refuses_a_malformed_one() -> None:
    from pydantic import ValidationError

    from workers.contracts import CLIENT_MESSAGE, ClientToolStarted

    body = {"run_id": "r1", "tree_id": "t", "task_id": "a", "started_at": 1.5, "client_id": "alice"}
    msg = CLIENT_MESSAGE.validate_json(
        ClientToolStarted(client_id="alice", started=ToolStarted(**body)).model_dump_json()
    )
    assert isinstance(msg, ClientToolStarted) and msg.started.started_at == 1.5
    for bad in (
        {**body, "started_at": "NaN"},
        {**body, "started_at": "Infinity"},
        {**body, "started_at": -1},
        {**body, "run_id": "r" * 129},
        {**body, "run_id": ""},
        {**body, "extra": 1},
        {k: v for k, v in body.items() if k != "task_id"},
    ):
        raw = '{"type": "tool_started", "client_id": "alice", "started": ' + _json(bad) + "}"
        with pytest.raises(ValidationError):
            CLIENT_MESSAGE.validate_json(raw)


def _json(value: Any) -> str:
    import json

    return json.dumps(value).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity")
