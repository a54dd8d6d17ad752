"""Flower is told of the calls the brain ends before a worker or agent began them (a cancel, a
``max_total_s`` past at the gate or in a queue), and of no other (brain.runtime.revoked). The
scheduler and reconciler run on a real redis-server (the rig); tests/integration/test_flower.py
sees the events in a real Flower."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import pytest
from celery import Celery
from celery.events.state import State

from brain.core.models import TaskState
from brain.runtime import revoked
from brain.runtime.events import ClientEvents
from brain.runtime.intake import Intake
from brain.runtime.revoked import CHUNK, RevokedEvents
from tests.unit.brain.runtime.rig import Rig, echo, local_read, tree
from tests.unit.brain.runtime.test_clientwork import queued_to_laptop
from tests.unit.brain.runtime.test_fan_out import fan, listed
from tests.unit.brain.runtime.test_retries import failed, succeeded


class Told:
    """Stands in for ``RevokedEvents``: the runs it was told ended unrun, with ``expired``, and
    those it was told were lost with their worker."""

    def __init__(self) -> None:
        self.runs: list[tuple[str | None, str | None, bool]] = []
        self.lost_runs: list[tuple[str | None, str | None]] = []

    def unrun(self, runs: Iterable[tuple[str | None, str | None]], *, expired: bool) -> None:
        self.runs += [(run, client, expired) for run, client in runs]

    def lost(self, runs: Iterable[tuple[str | None, str | None]], why: str) -> None:
        self.lost_runs += list(runs)


def telling(rig: Rig) -> Told:
    told = rig.scheduler.revoked = Told()  # type: ignore[assignment]
    return told


def test_a_cancel_tells_flower_of_the_calls_sent_and_not_begun_only(rig: Rig) -> None:
    told = telling(rig)
    rig.presence.enroll("laptop", "ada")
    rig.connect()
    rec = rig.scheduler.submit(
        tree(echo("queued"), echo("running"), echo("later", depends_on=["queued"]), local_read("client")),
        user="ada",
    )
    run = {t: rig.task(rec.tree_id, t).run_id for t in ("queued", "running", "client")}
    assert rig.scheduler.move(rec.tree_id, "running", TaskState.RUNNING, {TaskState.QUEUED_SERVER})

    assert sorted(rig.sweeps.cancel(rec.tree_id)) == ["client", "later", "queued", "running"]
    # "running" has a worker that tells Flower how it ends; "later" was never sent.
    assert sorted(told.runs, key=str) == sorted(
        [(run["queued"], None, False), (run["client"], "laptop", False)], key=str
    )
    assert rig.sweeps.cancel(rec.tree_id) == [] and len(told.runs) == 2  # told once


def test_a_cancel_asks_the_pools_to_drop_the_server_calls_still_queued_only(rig: Rig) -> None:
    """Celery's own revoke of the runs a pool has not begun, so its main process acks them on
    receipt instead of handing each to a pool process (Publisher.drop_queued): not a running
    one (revoke is not terminate), not a client's (its agent has no remote control)."""
    rig.presence.enroll("laptop", "ada")
    rig.connect()
    rec = rig.scheduler.submit(
        tree(echo("queued"), echo("running"), echo("later", depends_on=["queued"]), local_read("client")),
        user="ada",
    )
    queued = rig.task(rec.tree_id, "queued").run_id
    assert rig.scheduler.move(rec.tree_id, "running", TaskState.RUNNING, {TaskState.QUEUED_SERVER})
    assert sorted(rig.sweeps.cancel(rec.tree_id)) == ["client", "later", "queued", "running"]
    assert rig.sent.dropped == [queued]
    assert rig.sweeps.cancel(rec.tree_id) == [] and rig.sent.dropped == [queued]  # asked once


def test_a_cancel_whose_drop_broadcast_fails_cancels_all_the_same(rig: Rig) -> None:
    def refuse(run_ids: list[str]) -> None:
        raise ConnectionError("Redis went away")

    rig.sent.drop_queued = refuse  # type: ignore[method-assign]
    rec = rig.scheduler.submit(tree(echo("a"), echo("b")))
    assert sorted(rig.sweeps.cancel(rec.tree_id)) == ["a", "b"]
    assert {rig.task(rec.tree_id, t).state for t in "ab"} == {TaskState.SKIPPED}


def test_cancelling_one_for_each_task_tells_of_its_items(rig: Rig) -> None:
    told = telling(rig)
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(tree(echo("list"), fan()))
    listed(rig, intake)
    items = {rig.task(rec.tree_id, f"each[{i}]").run_id for i in range(3)}
    assert sorted(rig.sweeps.cancel(rec.tree_id, "each")) == ["each", "each[0]", "each[1]", "each[2]"]
    assert sorted(told.runs) == sorted((run, None, False) for run in items)


def test_an_expired_call_not_begun_is_told_expired_and_a_running_one_is_not(rig: Rig) -> None:
    told = telling(rig)
    rec = rig.scheduler.submit(
        tree(echo("waits", max_total_s=30), echo("runs", max_total_s=30), echo("free"))
    )
    waits = rig.task(rec.tree_id, "waits").run_id
    assert rig.scheduler.move(rec.tree_id, "runs", TaskState.RUNNING, {TaskState.QUEUED_SERVER})
    rig.clock.advance(29)
    assert rig.sweeps.expire_overdue() == [] and told.runs == []
    rig.clock.advance(1)
    assert sorted(rig.sweeps.expire_overdue()) == ["runs", "waits"]
    assert told.runs == [(waits, None, True)]


class Caught(ClientEvents):
    def __init__(self) -> None:
        super().__init__(Celery("test", set_as_current=False))
        self.sent: list[dict[str, Any]] = []

    def _send(self, client_id: str, event: str, **fields: Any) -> None:
        now = time.time()
        self.sent.append({"type": event, "hostname": f"client-agent@{client_id}", "timestamp": now,
                          "local_received": now, "clock": len(self.sent), **fields})  # fmt: skip


Messages = list[tuple[str, list[dict[str, Any]]]]


def telling_flower(monkeypatch: pytest.MonkeyPatch) -> tuple[RevokedEvents, Messages, Caught]:
    """``RevokedEvents`` whose server messages are kept (kind, events) and client events caught."""
    messages: Messages = []
    monkeypatch.setattr(
        revoked, "send_task_events", lambda app, kind, events: messages.append((kind, events))
    )
    client = Caught()
    return RevokedEvents(Celery("test", set_as_current=False), client), messages, client


def test_server_calls_go_a_chunk_a_message_and_a_clients_through_its_agents_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events, messages, client = telling_flower(monkeypatch)
    server = [(f"s{i}", None) for i in range(CHUNK + 1)]
    events.unrun([*server, ("c1", "laptop"), (None, "laptop")], expired=True)

    assert [(kind, len(batch)) for kind, batch in messages] == [("task-revoked", CHUNK), ("task-revoked", 1)]
    first = messages[0][1][0]
    assert (first["uuid"], first["terminated"], first["signum"], first["expired"]) == (
        "s0",
        False,
        None,
        True,
    )
    assert [(e["type"], e["uuid"], e["expired"]) for e in client.sent] == [("task-revoked", "c1", True)]
    # Celery's event state (Flower's) shows the client's call REVOKED, and its late start is dropped.
    state = State()
    state.event({"type": "task-received", "uuid": "c1", "hostname": "client-agent@laptop",
                 "timestamp": 0.0, "local_received": 0.0, "clock": 0})  # fmt: skip
    for event in client.sent:
        state.event(event)
    assert state.tasks["c1"].state == "REVOKED"
    told = len(client.sent)
    client._send_unless_ended("laptop", "c1", "task-started")
    assert len(client.sent) == told


def test_nothing_is_told_with_task_events_off(monkeypatch: pytest.MonkeyPatch) -> None:
    messages: list[Any] = []
    monkeypatch.setattr(revoked, "send_task_events", lambda *args: messages.append(args))
    client = Caught()
    RevokedEvents(Celery("test", set_as_current=False), client, task_events=False).unrun(
        [("s1", None), ("c1", "laptop")], expired=False
    )
    assert messages == [] and client.sent == []


@pytest.mark.parametrize("owner", ["server", "client"])
def test_a_lost_run_superseded_by_a_new_one_is_told_once(rig: Rig, owner: str) -> None:
    told = telling(rig)
    client = "laptop" if owner == "client" else None
    if client:
        rig.presence.enroll("laptop", "ada")
        rig.connect()
    rec = rig.scheduler.submit(tree(local_read("a") if client else echo("a")), user="ada")
    old = rig.task(rec.tree_id, "a").run_id
    rig.later()
    assert rig.sweeps.run_once() == ["a"]
    assert told.runs == [(old, client, False)]


@pytest.mark.parametrize(("where", "told_of"), [("queue", 1), ("unacked", 1), ("nowhere", 0)])
def test_a_disconnect_tells_of_the_calls_it_took_back_before_the_agent_began_them(
    rig: Rig, where: str, told_of: int
) -> None:
    told = telling(rig)
    _, run_id = queued_to_laptop(rig, where)
    rig.clients.on_disconnected("laptop", "s1", "graceful shutdown")
    assert told.runs == [(run_id, "laptop", False)] * told_of


class Refuses:
    def unrun(self, runs: Iterable[tuple[str | None, str | None]], *, expired: bool) -> None:
        raise ConnectionError("Redis went away")


def test_a_cancel_that_cannot_tell_flower_cancels_all_the_same(rig: Rig) -> None:
    rig.scheduler.revoked = Refuses()  # type: ignore[assignment]
    rec = rig.scheduler.submit(tree(echo("a"), echo("b")))
    assert sorted(rig.sweeps.cancel(rec.tree_id)) == ["a", "b"]
    assert rig.task(rec.tree_id, "a").state is TaskState.SKIPPED


RETRY_LATER = {"max_attempts": 2, "backoff_s": 600, "jitter": False}


@pytest.mark.parametrize("owner", ["server", "client"])
@pytest.mark.parametrize("end", ["cancel", "expiry"])
def test_a_failed_attempt_waiting_to_retry_is_told_revoked_when_its_task_ends(
    rig: Rig, owner: str, end: str
) -> None:
    """Issue 26: Flower shows the failed attempt RETRY; the next attempt would be a new run, so
    a task cancelled or expired while it waits would leave that run RETRY for ever."""
    told = telling(rig)
    client = "laptop" if owner == "client" else None
    if client:
        rig.presence.enroll("laptop", "ada")
        rig.connect()
    spec: dict[str, Any] = {"retry": RETRY_LATER, **({"max_total_s": 900} if end == "expiry" else {})}
    rec = rig.scheduler.submit(tree(local_read("a", **spec) if client else echo("a", **spec)), user="ada")
    call = rig.sent.of("a")[-1]
    assert Intake(rig.scheduler).take(failed(call, client_id=client), client) is TaskState.RETRYING
    if end == "cancel":
        assert rig.sweeps.cancel(rec.tree_id) == ["a"]
    else:
        rig.clock.advance(900)  # its retry is due at 600: past max_total_s before it starts
        assert rig.sweeps.expire_overdue() == ["a"]
    assert told.runs == [(call.run_id, client, end == "expiry")] and told.lost_runs == []


def test_a_disconnect_tells_of_a_call_the_agent_had_begun_as_lost(rig: Rig) -> None:
    """Issue 26: taken back after its agent said it started, the call runs again as a new run;
    its old run, STARTED in Flower, is told lost (failed, WorkerLostError)."""
    told = telling(rig)
    tree_id, run_id = queued_to_laptop(rig, "unacked")
    assert rig.scheduler.move(tree_id, "r", TaskState.RUNNING, {TaskState.QUEUED_CLIENT})
    rig.clients.on_disconnected("laptop", "s1", "graceful shutdown")
    assert rig.task(tree_id, "r").state is TaskState.PENDING_CLIENT  # waits to run again, as a new run
    assert told.lost_runs == [(run_id, "laptop")] and told.runs == []


def test_a_running_server_run_nothing_holds_is_told_lost_when_sent_again(rig: Rig) -> None:
    told = telling(rig)
    rec = rig.scheduler.submit(tree(echo("a")))
    old = rig.task(rec.tree_id, "a").run_id
    assert rig.scheduler.move(rec.tree_id, "a", TaskState.RUNNING, {TaskState.QUEUED_SERVER})
    rig.later()
    assert rig.sweeps.run_once() == ["a"]
    assert rig.task(rec.tree_id, "a").run_id != old
    assert told.lost_runs == [(old, None)] and told.runs == []


def test_a_lost_run_is_told_failed_by_worker_lost_and_shows_failure_in_celerys_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events, messages, client = telling_flower(monkeypatch)
    events.lost([("s1", None), ("c1", "laptop")], "client agent laptop went away mid-call")
    assert [(kind, [e["uuid"] for e in batch]) for kind, batch in messages] == [("task-failed", ["s1"])]
    server = messages[0][1][0]
    assert server["exception"] == "WorkerLostError('client agent laptop went away mid-call')"
    assert server["worker_lost"] is True
    state = State()
    for uuid, host in (("c1", "client-agent@laptop"), ("s1", "server@box")):
        for clock, kind in enumerate(("task-received", "task-started")):
            state.event({"type": kind, "uuid": uuid, "hostname": host, "timestamp": 0.0,
                         "local_received": 0.0, "clock": clock})  # fmt: skip
    for event in client.sent:
        state.event(event)
    state.event({**server, "type": "task-failed", "hostname": "gen1@box", "local_received": 0.0, "clock": 9})
    assert {uuid: state.tasks[uuid].state for uuid in ("c1", "s1")} == {"c1": "FAILURE", "s1": "FAILURE"}
    told = len(client.sent)
    client._send_unless_ended("laptop", "c1", "task-progress")  # its agent's late word: dropped
    assert len(client.sent) == told


def test_a_clients_retry_is_not_said_again_once_the_brain_revoked_it() -> None:
    """The RETRY said again ``RESTATE_RETRY_S`` later would replace REVOKED in Flower."""
    client = Caught()
    retried = {"exception": "ToolTimeout", "traceback": ""}
    client._send_end("laptop", "c1", [("task-retried", retried)])
    client._restate("laptop", "c1", retried)
    assert [e["type"] for e in client.sent] == ["task-retried", "task-retried"]
    client.task_revoked("laptop", "c1", terminated=False, signum=None, expired=False)
    client._restate("laptop", "c1", retried)
    assert [e["type"] for e in client.sent] == ["task-retried", "task-retried", "task-revoked"]


@pytest.mark.parametrize("told_before", [False, True])
def test_a_client_call_running_when_cancelled_is_shown_ended_as_its_agent_says(
    rig: Rig, told_before: bool
) -> None:
    """Issue 26: its result is refused (the task stays skipped), but its tool ran: Flower is
    told how it ended, as a pool worker tells of a server call, once; not over an end this
    brain already sent for the run."""
    client = rig.scheduler.events = Caught()
    rig.presence.enroll("laptop", "ada")
    rig.connect()
    rec = rig.scheduler.submit(tree(local_read("r")), user="ada")
    call = rig.sent.of("r")[-1]
    assert rig.scheduler.move(rec.tree_id, "r", TaskState.RUNNING, {TaskState.QUEUED_CLIENT})
    assert rig.sweeps.cancel(rec.tree_id) == ["r"]
    if told_before:
        client.task_revoked("laptop", call.run_id, terminated=False, signum=None, expired=False)
    before = len(client.sent)
    assert not Intake(rig.scheduler).on_result(succeeded(call, client_id="laptop"), "laptop")
    assert rig.task(rec.tree_id, "r").state is TaskState.SKIPPED
    shown = [(e["type"], e["uuid"]) for e in client.sent[before:]]
    assert shown == ([] if told_before else [("task-started", call.run_id), ("task-succeeded", call.run_id)])
    # Another run's late result (not the run the task ended under) is told nothing.
    assert not Intake(rig.scheduler).on_result(
        succeeded(call.model_copy(update={"run_id": "other"}), client_id="laptop"), "laptop"
    )
    assert len(client.sent) == before + len(shown)
