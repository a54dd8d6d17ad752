"""Intake's doors for what a running call says (issue 24): each accepted progress update, log
message and ask becomes a ``TreeEvent`` on the tree's channel; only for the current run, in
flight, from where it was sent; an ask only of a one-task gateway call. Think of a hostile
workstation: another client's run, a finished run, a tree nobody follows change nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from brain.core.models import TaskRecord, TaskState, TaskTree, TreeRecord
from brain.runtime.clientwork import ClientWork
from brain.runtime.intake import Intake
from brain.runtime.relay import Relay
from brain.runtime.scheduler import Scheduler
from brain.store.sqlite import SQLiteStore
from workers.contracts import (
    MAX_ASK_BYTES,
    MAX_LOG_DATA_BYTES,
    TREE_EVENT,
    AskEvent,
    ClientToolAsk,
    ClientToolLog,
    LogEvent,
    ProgressEvent,
    ToolAsk,
    ToolLog,
    ToolProgress,
)

S = TaskState
ASK_ID = "0" * 32


class _Hot:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def publish_event(self, tree_id: str, event: str) -> None:
        self.events.append((tree_id, event))

    def notify(self, tree_id: str) -> None:
        self.events.append((tree_id, "1"))


class _Scheduler:
    events = None

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.hot = _Hot()

    def clock(self) -> float:
        return 100.0

    def tree(self, tree_id: str) -> TreeRecord | None:
        return self.store.get_tree(tree_id)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "store.db")
    one = TaskTree.model_validate({"id": "mcp-x", "tasks": [{"id": "call", "tool": "x"}]})
    s.put_tree(
        TreeRecord(tree_id="g", tree=one, submitted_at=0, gateway_call=True),
        [TaskRecord(tree_id="g", task_id="call", tool="x", state=S.RUNNING, run_id="r1", client_id="laptop")],
    )
    s.put_tree(
        TreeRecord(tree_id="p", tree=one, submitted_at=0, gateway_call=True),
        [TaskRecord(tree_id="p", task_id="call", tool="x", state=S.RUNNING, run_id="rp")],
    )
    s.put_tree(
        TreeRecord(tree_id="t", tree=one, submitted_at=0),  # a tree: nobody to ask
        [TaskRecord(tree_id="t", task_id="call", tool="x", state=S.RUNNING, run_id="rt", client_id="laptop")],
    )
    s.put_tree(
        TreeRecord(tree_id="done", tree=one, submitted_at=0, gateway_call=True),
        [TaskRecord(tree_id="done", task_id="call", tool="x", state=S.DONE, run_id="rd", client_id="laptop")],
    )
    yield s
    s.close()


def rig(store: SQLiteStore) -> tuple[Intake, _Hot]:
    scheduler = _Scheduler(store)
    return Intake(cast(Scheduler, scheduler)), scheduler.hot


def ask(tree_id: str = "g", run_id: str = "r1", client_id: str | None = "laptop", **over: Any) -> ToolAsk:
    fields = {
        "run_id": run_id,
        "tree_id": tree_id,
        "task_id": "call",
        "ask_id": ASK_ID,
        "kind": "sampling",
        "params": {"messages": [], "maxTokens": 5},
        "answer_by": 1e10,
        "client_id": client_id,
    }
    return ToolAsk.model_validate(fields | over)


def log_of(tree_id: str = "g", run_id: str = "r1", client_id: str | None = "laptop") -> ToolLog:
    return ToolLog(
        run_id=run_id, tree_id=tree_id, task_id="call", level="info", data="hi", at=1.0, client_id=client_id
    )


def test_each_accepted_progress_update_is_published_with_its_values(store: SQLiteStore) -> None:
    door, hot = rig(store)
    for step in (0, 50, 100):
        update = ToolProgress(
            run_id="r1", tree_id="g", task_id="call", progress=step, total=100, at=step, client_id="laptop"
        )
        assert door.on_progress(update, from_client="laptop")
    events = [TREE_EVENT.validate_json(e) for _, e in hot.events]
    assert [e.progress.progress for e in events if isinstance(e, ProgressEvent)] == [0, 50, 100]
    stale = ToolProgress(run_id="old", tree_id="g", task_id="call", progress=1, at=1, client_id="laptop")
    assert not door.on_progress(stale, from_client="laptop") and len(hot.events) == 3


def test_a_log_of_the_current_run_from_where_it_runs_is_published(store: SQLiteStore) -> None:
    door, hot = rig(store)
    assert door.on_log(log_of(), from_client="laptop")
    assert door.on_log(log_of("p", "rp", None), from_client=None)  # the server pool's
    (tree_id, raw), _ = hot.events
    event = TREE_EVENT.validate_json(raw)
    assert tree_id == "g" and isinstance(event, LogEvent) and event.log.data == "hi"


@pytest.mark.parametrize(
    ("update", "from_client"),
    [
        (log_of(client_id="evil"), "evil"),  # another workstation, claiming its own name
        (log_of(), "evil"),  # ... or laptop's
        (log_of(run_id="r0"), "laptop"),  # not the current run
        (log_of("done", "rd"), "laptop"),  # a finished run
        (log_of("p", "rp", "laptop"), "laptop"),  # a server run
    ],
)
def test_a_log_of_anything_else_is_dropped(store: SQLiteStore, update: ToolLog, from_client: str) -> None:
    door, hot = rig(store)
    assert not door.on_log(update, from_client=from_client) and hot.events == []


def test_an_ask_of_a_gateway_call_is_published_naming_where_it_runs(store: SQLiteStore) -> None:
    door, hot = rig(store)
    assert door.on_ask(ask(), from_client="laptop")
    assert door.on_ask(ask("p", "rp", None), from_client=None)
    events = [TREE_EVENT.validate_json(e) for _, e in hot.events]
    assert [e.ask.client_id for e in events if isinstance(e, AskEvent)] == ["laptop", None]


@pytest.mark.parametrize(
    ("forged", "from_client"),
    [
        (ask(client_id="evil"), "evil"),  # another workstation asking laptop's MCP session
        (ask(), "evil"),
        (ask("t", "rt"), "laptop"),  # a call inside a tree: no MCP client waits for it
        (ask("done", "rd"), "laptop"),  # a finished run
        (ask(run_id="r0"), "laptop"),  # an older run
        (ask("p", "rp", None), "laptop"),  # the pool's run, from a workstation
        (ask(), None),  # laptop's run, through the brain queue
    ],
)
def test_a_forged_ask_publishes_nothing(store: SQLiteStore, forged: ToolAsk, from_client: str | None) -> None:
    door, hot = rig(store)
    assert not door.on_ask(forged, from_client=from_client) and hot.events == []


def test_the_relay_takes_a_clients_log_and_ask_as_from_the_outbox_they_came_through(
    store: SQLiteStore,
) -> None:
    door, hot = rig(store)
    door.scheduler.settings = SimpleNamespace(max_result_bytes=1 << 20, outbox_max_messages=100)  # type: ignore[attr-defined]
    relay = Relay(door, cast(ClientWork, None))
    forged = ClientToolAsk(client_id="laptop", ask=ask()).model_dump_json().encode()
    relay.handle("mallory", forged)  # mallory's outbox, claiming to be laptop
    relay.handle("mallory", ClientToolLog(client_id="laptop", log=log_of()).model_dump_json().encode())
    assert hot.events == []
    relay.handle("laptop", forged)
    relay.handle("laptop", ClientToolLog(client_id="laptop", log=log_of()).model_dump_json().encode())
    kinds = [type(TREE_EVENT.validate_json(e)).__name__ for _, e in hot.events]
    assert kinds == ["AskEvent", "LogEvent"]


def test_an_ask_or_a_log_over_its_limits_does_not_parse() -> None:
    with pytest.raises(ValueError, match="over"):
        ask(params={"messages": [], "blob": "x" * (MAX_ASK_BYTES + 1)})
    with pytest.raises(ValueError, match="over"):
        ToolLog(
            run_id="r", tree_id="g", task_id="call", level="info", data="x" * (MAX_LOG_DATA_BYTES + 1), at=1
        )
    with pytest.raises(ValueError):
        ToolLog(run_id="r", tree_id="g", task_id="call", level="loud", data="x", at=1)  # type: ignore[arg-type]
