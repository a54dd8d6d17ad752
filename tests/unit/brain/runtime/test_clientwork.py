"""brain.runtime.clientwork: a connect requeues parked work (the client's own list, then its
user's, oldest first); a disconnect takes back the calls the client had not started.

The same rig as the reconciler's tests: a real Scheduler on SQLite, a real redis-server, Celery
a recorder. A call "in the client's queue" is a kombu message pushed where kombu would put it."""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from brain.core.client_health import Cause
from brain.core.models import SessionKind, TaskState, TreeStatus
from brain.hot.parked import ParkedWork
from brain.hot.retries import RETRY_AT_KEY
from brain.runtime.clientwork import BEAT_DUE_S, BEATS_TURN_KEY
from brain.runtime.events import HEARTBEAT_S
from brain.runtime.intake import Intake
from brain.runtime.retries import start_due
from tests.redis_commands import command_counts, reset_counts
from tests.unit.brain.runtime.rig import Rig, kombu_message, local_read, make_rig, tree
from tests.unit.brain.runtime.test_retries import failed
from workers.contracts import (
    CLIENT_ACK,
    CLIENT_HEARTBEAT,
    KOMBU_UNACKED,
    ClientConnected,
    ClientType,
    ToolDescriptor,
    ToolType,
    client_key,
    client_queue,
    key_cancelled,
    key_parked,
)


@pytest.fixture
def rig(tmp_path: Path, redis_client: redis.Redis) -> Iterator[Rig]:
    yield from make_rig(tmp_path, redis_client)


def announcement(
    client_id: str = "laptop", session_id: str = "s1", tools: tuple[str, ...] = ("read_local_file",)
) -> ClientConnected:
    return ClientConnected(
        client_id=client_id,
        session_id=session_id,
        client_type=ClientType.CLI,
        available_tools=[ToolDescriptor(name=t, type=ToolType.NATIVE) for t in tools],
        sent_at=0.0,
    )


def ack_of(rig: Rig, client_id: str = "laptop") -> dict[str, object]:
    return json.loads(rig.r.get(client_key(client_id, CLIENT_ACK)))


# --- connect -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("enrolled_as", "through", "reason"),
    [
        (None, "laptop", "client 'laptop' is not enrolled"),
        ("ada", "desk", "announcement names client 'laptop' but came through 'desk''s outbox"),
    ],
)
def test_a_refused_announcement_is_acked_with_why_and_makes_no_session(
    rig: Rig, enrolled_as: str | None, through: str, reason: str
) -> None:
    for cid in ("laptop", "desk"):
        if enrolled_as:
            rig.presence.enroll(cid, enrolled_as)
    ack = rig.clients.on_connected(announcement(), through)
    assert not ack.accepted and ack.reason.startswith(reason)
    assert ack_of(rig, through)["accepted"] is False
    assert rig.presence.session(through) is None and rig.presence.session("laptop") is None


def test_an_accepted_announcement_is_acked_with_its_tool_count_and_makes_a_session(rig: Rig) -> None:
    rig.presence.enroll("laptop", "ada")
    ack = rig.clients.on_connected(announcement(tools=("read_local_file", "list_directory")), "laptop")
    assert (ack.accepted, ack.tools) == (True, 2)
    assert ack_of(rig) == {"session_id": "s1", "accepted": True, "reason": "", "tools": 2}
    session = rig.presence.session("laptop")
    assert session is not None and session.user == "ada"


def test_a_connect_requeues_the_clients_own_list_then_its_users_oldest_first(rig: Rig) -> None:
    # Parked while nobody was connected; the clock moves on between parks.
    bound = rig.scheduler.submit(
        tree(local_read("mine")), session=SessionKind.INTERACTIVE, client_id="laptop"
    )  # not enrolled yet: no user, so parked for client:laptop only
    rig.clock.advance(1)
    rig.presence.enroll("laptop", "ada")
    older = rig.scheduler.submit(tree(local_read("older")), user="ada")
    rig.clock.advance(1)
    newer = rig.scheduler.submit(tree(local_read("newer")), user="ada")
    assert rig.r.llen(key_parked("client:laptop")) == 1 and rig.r.llen(key_parked("user:ada")) == 2
    assert rig.sent.calls == []

    rig.clients.on_connected(announcement(), "laptop")
    assert [(c.tree_id, c.task_id) for c in rig.sent.calls] == [
        (bound.tree_id, "mine"),
        (older.tree_id, "older"),
        (newer.tree_id, "newer"),
    ]
    assert all(c.client_id == "laptop" for c in rig.sent.calls)
    assert rig.r.llen(key_parked("client:laptop")) == 0 and rig.r.llen(key_parked("user:ada")) == 0


def test_a_parked_ref_whose_task_moved_on_is_dropped_not_sent(rig: Rig) -> None:
    rig.presence.enroll("laptop", "ada")
    rec = rig.scheduler.submit(tree(local_read()), user="ada")
    rig.sweeps.cancel(rec.tree_id)
    rig.clients.on_connected(announcement(), "laptop")
    assert rig.sent.calls == []
    assert rig.r.llen(key_parked("user:ada")) == 0


def test_another_clients_connect_does_not_take_work_parked_for_a_named_client(rig: Rig) -> None:
    rig.scheduler.submit(tree(local_read()), session=SessionKind.INTERACTIVE, client_id="laptop")
    rig.presence.enroll("laptop", "ada")
    rig.presence.enroll("desk", "ada")
    assert rig.clients.on_connected(announcement("desk"), "desk").accepted
    assert rig.sent.calls == []
    assert rig.r.llen(key_parked("client:laptop")) == 1


# --- disconnect --------------------------------------------------------------------------------


def queued_to_laptop(rig: Rig, where: str) -> tuple[str, str]:
    """A connected laptop with one call queued for it; its message put ``where``. (tree, run)."""
    rig.presence.enroll("laptop", "ada")
    rig.clients.on_connected(announcement(), "laptop")
    rec = rig.scheduler.submit(tree(local_read()), user="ada")
    run_id = rig.task(rec.tree_id, "r").run_id
    if where == "queue":
        rig.r.lpush(client_key("laptop", client_queue("laptop")), kombu_message(run_id))
    elif where == "unacked":
        entry = [json.loads(kombu_message(run_id)), "", client_queue("laptop")]
        rig.r.hset(client_key("laptop", KOMBU_UNACKED), "tag1", json.dumps(entry))
    return rec.tree_id, run_id


@pytest.mark.parametrize(
    ("where", "taken", "state"),
    [
        # Never started: it keeps its place and waits for a client.
        ("queue", 1, TaskState.PENDING_CLIENT),
        # Reserved by the agent: routed again by its offline strategy (nobody else: parked).
        ("unacked", 1, TaskState.PENDING_CLIENT),
        # Neither: the agent took or finished it; its result is on the way. Left as it is.
        ("nowhere", 0, TaskState.QUEUED_CLIENT),
    ],
)
def test_a_disconnect_takes_back_only_the_calls_redis_still_held(
    rig: Rig, where: str, taken: int, state: TaskState
) -> None:
    tree_id, run_id = queued_to_laptop(rig, where)
    queued_at = rig.task(tree_id, "r").queued_at
    rig.clock.advance(5)
    assert rig.clients.on_disconnected("laptop", "s1", "graceful shutdown") == taken
    task = rig.task(tree_id, "r")
    assert task.state is state
    # A run taken back is cancelled in the client's own set: a copy it kept never starts.
    cancelled = rig.r.sismember(client_key("laptop", key_cancelled()), run_id)
    assert bool(cancelled) is (taken == 1)
    assert rig.presence.session("laptop") is None
    assert rig.r.exists(client_key("laptop", CLIENT_ACK)) == 0  # a live agent announces again
    # What was taken is gone from where the agent would find it.
    assert rig.r.llen(client_key("laptop", client_queue("laptop"))) == 0
    assert rig.r.hlen(client_key("laptop", KOMBU_UNACKED)) == 0
    # Only a call it was running counts toward the client route's poison bound.
    assert task.taken_back == (1 if where == "unacked" else 0)
    if where == "queue":
        assert (
            task.reason
            == "Queued for Client: read_local_file (client laptop went offline before starting it)"
        )
        assert task.queued_at == queued_at  # parked with its old place, not at the disconnect
        assert [r.task_id for r in ParkedWork(rig.r).refs_in(key_parked("user:ada"))] == ["r"]


def test_a_disconnect_of_another_session_changes_nothing(rig: Rig) -> None:
    tree_id, _ = queued_to_laptop(rig, "queue")
    assert rig.clients.on_disconnected("laptop", "an-old-session", "graceful shutdown") == 0
    assert rig.presence.session("laptop") is not None
    assert rig.task(tree_id, "r").state is TaskState.QUEUED_CLIENT


def test_an_agent_back_as_a_new_session_gets_its_old_sessions_calls_again_as_new_runs(rig: Rig) -> None:
    tree_id, old_run = queued_to_laptop(rig, "queue")
    rig.clock.advance(5)
    assert rig.clients.on_connected(announcement(session_id="s2"), "laptop").accepted
    task = rig.task(tree_id, "r")
    assert task.state is TaskState.QUEUED_CLIENT and task.run_id != old_run
    assert [c.run_id for c in rig.sent.of("r")] == [old_run, task.run_id]
    assert rig.r.llen(client_key("laptop", client_queue("laptop"))) == 0  # the old message taken


def held_by_laptop(rig: Rig, run_id: str) -> None:
    """The laptop's agent reserved the run (kombu's unacked hash holds it): it was running it."""
    entry = [json.loads(kombu_message(run_id)), "", client_queue("laptop")]
    rig.r.hset(client_key("laptop", KOMBU_UNACKED), f"tag-{run_id}", json.dumps(entry))


def agent_dies_running(rig: Rig, tree_id: str, session: int) -> str:
    """The laptop's agent was running the task's current run and comes back as session
    ``s<session>``: the run it took back."""
    run_id = rig.task(tree_id, "r").run_id
    assert run_id is not None
    held_by_laptop(rig, run_id)
    rig.clock.advance(5)
    assert rig.clients.on_connected(announcement(session_id=f"s{session}"), "laptop").accepted
    assert rig.r.sismember(client_key("laptop", key_cancelled()), run_id)  # its copy never starts
    return run_id


@pytest.mark.parametrize(
    "policy",
    [
        None,
        # A policy that does not cover `unavailable` changes nothing either.
        {"max_attempts": 5, "backoff_s": 0, "on": ["timeout", "tool_error"]},
    ],
)
def test_a_call_whose_agent_dies_running_it_each_time_fails_as_poison_after_max_deliveries(
    rig: Rig, policy: dict[str, Any] | None
) -> None:
    """Each restart of the agent (a new session) takes the call back from the old one and
    sends it again as a new run: counted on the task, and given up as a PoisonTask once the
    tool has lost its agent max_deliveries (3) times; with no retry policy covering
    `unavailable` that is final and the tree ends."""
    rig.presence.enroll("laptop", "ada")
    assert rig.clients.on_connected(announcement(), "laptop").accepted
    rec = rig.scheduler.submit(tree(local_read(), **({"retry": policy} if policy else {})), user="ada")
    runs = []
    for n in (1, 2, 3):
        runs.append(agent_dies_running(rig, rec.tree_id, n + 1))
        task = rig.task(rec.tree_id, "r")
        assert task.taken_back == n
        if n < 3:
            assert task.state is TaskState.QUEUED_CLIENT and task.run_id not in runs
    assert [c.run_id for c in rig.sent.of("r")] == runs  # three runs, no fourth
    assert task.state is TaskState.FAILED and task.run_id == runs[-1] and task.retry_at is None
    assert task.attempts == []
    assert task.error is not None and task.error.type == "PoisonTask"
    assert task.error.message == task.reason
    assert "its agent went away while running it 3 times" in task.reason
    assert "'read_local_file'" in task.reason and "'laptop'" in task.reason
    assert rig.scheduler.tree(rec.tree_id).status is TreeStatus.FAILED  # type: ignore[union-attr]
    assert rig.r.hlen(client_key("laptop", KOMBU_UNACKED)) == 0
    assert start_due(rig.scheduler) == 0  # no timer was set


def test_a_call_given_up_as_poison_is_retried_as_its_policy_says_each_attempt_counting_afresh(
    rig: Rig,
) -> None:
    """The same PoisonTask as a server run's: a policy covering `unavailable` makes it a failed
    attempt, `retrying` with a timer; the next attempt is a new run whose take-backs count
    from 0, and is given up after max_deliveries (3) runs of its own. The policy's last
    attempt fails the task: 2 attempts, 6 runs."""
    rig.presence.enroll("laptop", "ada")
    assert rig.clients.on_connected(announcement(), "laptop").accepted
    policy = {"max_attempts": 2, "backoff_s": 7, "jitter": False, "on": ["unavailable"]}
    rec = rig.scheduler.submit(tree(local_read(), retry=policy), user="ada")
    first = [agent_dies_running(rig, rec.tree_id, n) for n in (2, 3, 4)]
    waiting = rig.task(rec.tree_id, "r")
    assert waiting.state is TaskState.RETRYING and waiting.retry_at == rig.clock() + 7
    assert waiting.reason.startswith("attempt 1 of 2 failed (PoisonTask); next attempt at ")
    assert waiting.taken_back == 0  # the next attempt counts its own
    (attempt,) = waiting.attempts
    assert attempt.number == 1 and attempt.run_id == first[-1] and attempt.next_at == waiting.retry_at
    assert attempt.error is not None and attempt.error.type == "PoisonTask"
    assert attempt.error.data == {"taken_back": 3, "client": "laptop"}
    assert rig.r.zscore(RETRY_AT_KEY, f"{rec.tree_id}\x1fr") == waiting.retry_at
    assert rig.scheduler.tree(rec.tree_id).status is TreeStatus.RUNNING  # type: ignore[union-attr]
    assert [c.run_id for c in rig.sent.of("r")] == first  # nothing sent while it waits

    rig.clock.advance(7)
    assert start_due(rig.scheduler) == 1
    again = rig.task(rec.tree_id, "r")
    assert again.state is TaskState.QUEUED_CLIENT and again.run_id not in first
    assert (again.taken_back, again.error, again.retry_at) == (0, None, None)
    second = []
    for n in (1, 2, 3):
        second.append(agent_dies_running(rig, rec.tree_id, n + 4))
        assert rig.task(rec.tree_id, "r").taken_back == n
    failed = rig.task(rec.tree_id, "r")
    assert [c.run_id for c in rig.sent.of("r")] == first + second  # 2 x max_deliveries runs
    assert failed.state is TaskState.FAILED and failed.retry_at is None, failed.reason
    assert failed.error is not None and failed.error.type == "PoisonTask"
    assert "its agent went away while running it 3 times" in failed.reason
    assert [a.run_id for a in failed.attempts] == [first[-1]]  # the last one's outcome is the record's
    assert rig.scheduler.tree(rec.tree_id).status is TreeStatus.FAILED  # type: ignore[union-attr]


def test_a_failed_result_retried_starts_the_next_attempts_take_back_count_afresh(rig: Rig) -> None:
    """Taken back once, then its next run fails in a result its policy covers: the attempt
    ended, and the next one counts its own take-backs (it is not given up after two more)."""
    rig.presence.enroll("laptop", "ada")
    assert rig.clients.on_connected(announcement(), "laptop").accepted
    policy = {"max_attempts": 2, "backoff_s": 0, "on": ["unavailable"]}
    rec = rig.scheduler.submit(tree(local_read(), retry=policy), user="ada")
    agent_dies_running(rig, rec.tree_id, 2)
    assert rig.task(rec.tree_id, "r").taken_back == 1
    result = failed(rig.sent.of("r")[-1], "MCPServerUnavailable", "laptop")
    assert Intake(rig.scheduler).take(result, from_client="laptop") is TaskState.RETRYING
    assert rig.task(rec.tree_id, "r").taken_back == 0
    assert start_due(rig.scheduler) == 1
    for n in (1, 2):
        agent_dies_running(rig, rec.tree_id, n + 2)
        task = rig.task(rec.tree_id, "r")
        assert (task.state, task.taken_back) == (TaskState.QUEUED_CLIENT, n)


def test_a_call_taken_back_before_it_started_is_not_counted(rig: Rig) -> None:
    tree_id, _ = queued_to_laptop(rig, "queue")
    assert rig.clients.on_disconnected("laptop", "s1", "graceful shutdown") == 1
    task = rig.task(tree_id, "r")
    assert (task.state, task.taken_back) == (TaskState.PENDING_CLIENT, 0)


def test_a_call_taken_back_running_once_is_sent_again_counted(rig: Rig) -> None:
    tree_id, run_id = queued_to_laptop(rig, "unacked")
    assert rig.clients.on_connected(announcement(session_id="s2"), "laptop").accepted
    task = rig.task(tree_id, "r")
    assert (task.state, task.taken_back, task.deliveries) == (TaskState.QUEUED_CLIENT, 1, 0)
    assert task.run_id != run_id and task.attempt == 2


# --- suspension and heartbeats -----------------------------------------------------------------


def test_a_suspended_client_loses_its_session_and_is_refused_until_its_keys_are_fixed(rig: Rig) -> None:
    tree_id, _ = queued_to_laptop(rig, "queue")
    rig.r.set(client_key("laptop", KOMBU_UNACKED), "not a hash")  # what the agent wrote
    rig.clients.suspend("laptop", Cause(kind="unacked hash type", detail="its unacked hash is a string"))

    assert rig.presence.session("laptop") is None
    assert rig.task(tree_id, "r").state is not TaskState.QUEUED_CLIENT
    assert str(ack_of(rig)["reason"]).startswith("suspended by the brain: ")
    refused = rig.clients.on_connected(announcement(session_id="s2"), "laptop")
    assert not refused.accepted and refused.reason.startswith("suspended by the brain: ")

    rig.r.delete(client_key("laptop", KOMBU_UNACKED))
    assert rig.clients.on_connected(announcement(session_id="s3"), "laptop").accepted
    assert rig.clients.misbehaving.get("laptop") is None


@pytest.mark.parametrize(
    ("heartbeat", "still_connected"),
    [
        ("s1", True),  # its own session's heartbeat
        (None, False),  # expired
        ("s0", False),  # another (older) session's
    ],
)
def test_the_heartbeat_sweep_drops_clients_whose_heartbeat_stopped(
    rig: Rig, heartbeat: str | None, still_connected: bool
) -> None:
    rig.presence.enroll("laptop", "ada")
    rig.clients.on_connected(announcement(), "laptop")
    if heartbeat is not None:
        rig.r.set(client_key("laptop", CLIENT_HEARTBEAT), heartbeat)
    rig.clients.sweep_heartbeats()
    assert (rig.presence.session("laptop") is not None) is still_connected


class Flower:
    """Stands in for ClientEvents: what the heartbeat sweep told Flower."""

    def __init__(self) -> None:
        self.rounds: list[list[str]] = []
        self.offline_ids: list[str] = []

    def online(self, client_id: str) -> None:
        pass

    def offline(self, client_id: str) -> None:
        self.offline_ids.append(client_id)

    def heartbeats(self, client_ids: list[str]) -> None:
        self.rounds.append(sorted(client_ids))


def test_flower_hears_every_connected_clients_heartbeat_in_one_round_per_interval_not_per_sweep(
    rig: Rig,
) -> None:
    """A kombu publish per client per sweep (a sweep a second) was a third of the brain's CPU
    with 1,000 clients idle."""
    flower = Flower()
    rig.clients.events = flower  # type: ignore[assignment]  # the stand-in has what it uses
    ids = ["desk", "laptop", "tablet"]
    for cid in ids:
        rig.presence.enroll(cid, "ada")
        rig.clients.on_connected(announcement(client_id=cid, session_id=f"s-{cid}"), cid)
        rig.r.set(client_key(cid, CLIENT_HEARTBEAT), f"s-{cid}")

    rig.clients.sweep_heartbeats()
    assert flower.rounds == [ids]
    for _ in range(int(BEAT_DUE_S)):  # sweeps a second apart, as the relay's
        rig.clock.advance(1.0)
        rig.clients.sweep_heartbeats()
    assert flower.rounds == [ids]  # none before the next is due
    rig.clock.advance(HEARTBEAT_S - int(BEAT_DUE_S))
    rig.r.delete(client_key("tablet", CLIENT_HEARTBEAT))  # it went away
    rig.clients.sweep_heartbeats()
    assert flower.rounds == [ids, ["desk", "laptop"]]
    assert flower.offline_ids == ["tablet"]


def test_a_sweep_of_a_thousand_clients_sets_off_no_garbage_collection(rig: Rig) -> None:
    """Its thousands of objects at once set off collections that moved them to older generations,
    then full collections of the whole heap: a fifth of a sweep's time at 1,000 clients and
    none at 100, so a client cost the brain a third more at 1,000 (``idle_clients_1000``)."""
    ids = [f"desk-{i:04d}" for i in range(1000)]
    for cid in ids:
        rig.presence.enroll(cid, f"user-{cid}")
        rig.clients.on_connected(announcement(client_id=cid, session_id=f"s-{cid}"), cid)
    pipe = rig.r.pipeline(transaction=False)
    for cid in ids:
        pipe.set(client_key(cid, CLIENT_HEARTBEAT), f"s-{cid}")
    pipe.execute()
    rig.clients.sweep_heartbeats()  # the first sweep reads and caches every session
    collections: list[int] = []

    def counted(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    assert gc.isenabled()
    gc.callbacks.append(counted)
    try:
        for _ in range(3):
            rig.clock.advance(1.0)
            rig.clients.sweep_heartbeats()
    finally:
        gc.callbacks.remove(counted)
    assert collections == []
    assert gc.isenabled()  # switched back on
    assert sorted(rig.presence.sessions()) == ids  # every one swept as alive, none dropped


def test_of_two_brains_sweeping_the_same_clients_one_tells_flower_and_the_other_takes_over_when_it_stops(
    rigs: Callable[..., Rig],
) -> None:
    first, second = rigs(), rigs()  # two brains: one Redis, one store
    flowers = [Flower(), Flower()]
    for i, (brain, flower) in enumerate(zip((first, second), flowers, strict=True)):
        brain.clients.events = flower  # type: ignore[assignment]  # the stand-in has what it uses
        brain.clients._holder = f"brain-{i}"  # two brains in one process: two holders
    first.presence.enroll("laptop", "ada")
    first.clients.on_connected(announcement(client_id="laptop", session_id="s-laptop"), "laptop")
    first.r.set(client_key("laptop", CLIENT_HEARTBEAT), "s-laptop")
    first.clients.sweep_heartbeats()
    second.clients.sweep_heartbeats()
    assert (flowers[0].rounds, flowers[1].rounds) == ([["laptop"]], [])
    first.r.delete(BEATS_TURN_KEY)  # the first brain died: its lease ran out
    second.clients.sweep_heartbeats()
    first.clients.sweep_heartbeats()  # (it is back: the turn stays with the second)
    assert (flowers[0].rounds, flowers[1].rounds) == ([["laptop"]], [["laptop"]])


def test_a_requeue_reads_the_sessions_once_and_routes_with_only_the_clients_it_may_use(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 1,000 clients reconnecting at once, each requeued task read every session and built
    a view of every client: a storm was O(N²)."""
    for i in range(30):  # connected, each of another user
        rig.presence.enroll(f"other-{i:02d}", f"user-{i:02d}")
        rig.connect(f"other-{i:02d}", requeue=False)
    bound, unbound = 20, 5
    for i in range(bound):
        rig.scheduler.submit(tree(local_read(f"r{i}")), session=SessionKind.INTERACTIVE, client_id="laptop")
    rig.presence.enroll("laptop", "ada")
    for i in range(unbound):  # ada's, for any of her clients
        rig.scheduler.submit(tree(local_read(f"u{i}")), user="ada")
    seen: list[tuple[str, ...]] = []
    start = rig.scheduler.start

    def start_seeing(tree_rec: Any, rec: Any, presence: Any, *args: Any, **kwargs: Any) -> bool:
        seen.append(tuple(c.client_id for c in presence.clients))
        return start(tree_rec, rec, presence, *args, **kwargs)

    monkeypatch.setattr(rig.scheduler, "start", start_seeing)
    reset_counts(rig.r)
    assert rig.clients.on_connected(announcement(), "laptop").accepted
    assert len(rig.sent.calls) == bound + unbound
    assert seen == [("laptop",)] * (bound + unbound)
    counts = command_counts(rig.r)
    # The bound trees' views need no read; the unbound ones' one of every session for their
    # chunk of refs (it was one per task), beside the marks' read of the connect itself.
    assert counts.get("hgetall", 0) <= 2
    assert counts.get("hget", 0) < unbound
