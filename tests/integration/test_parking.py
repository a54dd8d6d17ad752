"""Blocked and pending-client work in a real Redis: parking, requeue on connect, take-back
on disconnect, expiry, cancel, and what the brain refuses from clients.

The brain runs in-process here (no Celery worker): the test plays the client agent by
writing to its outbox the way the agent does, and reads the client's queue the way
kombu stores it. The real agent subprocess is exercised in test_client_path.py.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from brain.core.models import SessionKind, TaskState
from brain.runtime.relay import Relay
from brain.runtime.service import Brain
from tests.conftest import result_for, tree, waiting_on
from workers.contracts import (
    CLIENT_ACK,
    CLIENT_HEARTBEAT,
    CLIENT_OUTBOX,
    SERVER_QUEUE,
    AnnouncementAck,
    ClientConnected,
    ClientToolResult,
    ToolDescriptor,
    ToolResult,
    ToolType,
    client_key,
    client_queue,
    key_cancelled,
)

pytestmark = pytest.mark.integration

READ = ToolDescriptor(
    name="read_local_file",
    type=ToolType.NATIVE,
    input_schema={"type": "object", "properties": {"path": {"type": "string"}}},
)
LIST = ToolDescriptor(name="list_directory", type=ToolType.NATIVE)


def connected(client_id: str, session: str = "s1", tools: tuple[ToolDescriptor, ...] = (READ, LIST)) -> bytes:
    return (
        ClientConnected(
            client_id=client_id, session_id=session, available_tools=list(tools), sent_at=time.time()
        )
        .model_dump_json()
        .encode()
    )


def connect(
    brain: Brain, client_id: str, session: str = "s1", read_ack: bool = True
) -> AnnouncementAck | None:
    brain.hot.r.set(client_key(client_id, CLIENT_HEARTBEAT), session, ex=60)
    Relay(brain.intake, brain.clients).handle(client_id, connected(client_id, session))
    if not read_ack:  # another thread's disconnect may already have deleted it
        return None
    return AnnouncementAck.model_validate_json(brain.hot.r.get(client_key(client_id, CLIENT_ACK)))


def queued_task_ids(brain: Brain, client_id: str) -> list[str]:
    """Task ids in the client's queue, in the order the agent will take them (kombu pops the tail)."""
    raw = brain.hot.r.lrange(client_key(client_id, client_queue(client_id)), 0, -1)
    return [json.loads(m)["headers"]["id"].split(".")[-3] for m in reversed(raw)]


def reads(n: int, tree_id: str = "t") -> dict:
    return {
        "id": tree_id,
        "tasks": [{"id": f"r{i}", "tool": "read_local_file", "args": {"path": f"f{i}"}} for i in range(n)],
    }


def states(brain: Brain, tree_id: str) -> dict[str, TaskState]:
    return {t.task_id: t.state for t in brain.store.get_tasks(tree_id)}


def test_client_tool_blocks_in_an_interactive_session_while_server_tasks_go_on(brain_on_redis: Brain) -> None:
    brain = brain_on_redis
    brain.scheduler.presence.enroll("laptop", "ada")
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "mix",
                "tasks": [
                    {"id": "read", "tool": "read_local_file", "args": {"path": "notes.txt"}},
                    {"id": "shout", "tool": "text_transform", "args": {"op": "upper", "text": "hi"}},
                ],
            }
        ),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )
    read = brain.store.get_task(rec.tree_id, "read")
    assert read.state is TaskState.BLOCKED
    assert read.reason == "Waiting for Client for Tool: read_local_file"
    assert brain.store.get_task(rec.tree_id, "shout").state is TaskState.QUEUED_SERVER
    assert waiting_on(brain.hot.r, SERVER_QUEUE) == 1


def test_client_tool_is_pending_client_in_an_autonomous_session(brain_on_redis: Brain) -> None:
    brain = brain_on_redis
    rec = brain.scheduler.submit(tree(reads(1)), session=SessionKind.AUTONOMOUS, user="ada")
    task = brain.store.get_task(rec.tree_id, "r0")
    assert task.state is TaskState.PENDING_CLIENT
    assert task.reason.startswith("Queued for Client: read_local_file")


def test_connect_requeues_parked_tasks_in_order_on_the_clients_own_queue(brain_on_redis: Brain) -> None:
    brain = brain_on_redis
    brain.scheduler.presence.enroll("laptop", "ada")
    rec = brain.scheduler.submit(tree(reads(5)), user="ada")
    assert set(states(brain, rec.tree_id).values()) == {TaskState.PENDING_CLIENT}
    ack = connect(brain, "laptop")
    assert ack.accepted and ack.tools == 2
    assert set(states(brain, rec.tree_id).values()) == {TaskState.QUEUED_CLIENT}
    assert queued_task_ids(brain, "laptop") == ["r0", "r1", "r2", "r3", "r4"]
    assert waiting_on(brain.hot.r, SERVER_QUEUE) == 0
    assert all(t.route == "client:laptop" for t in brain.store.get_tasks(rec.tree_id))


def test_routing_sees_a_new_announcement_and_a_gone_client_at_once(brain_on_redis: Brain) -> None:
    """The router keeps each session as it last parsed it, and only while its bytes in Redis
    are the same: a client that re-announces with other tools, or leaves, is routed by
    what Redis says now."""
    brain = brain_on_redis
    presence = brain.scheduler.presence
    presence.enroll("laptop", "ada")
    connect(brain, "laptop")
    first = presence.sessions()["laptop"]
    assert presence.sessions()["laptop"] is first  # same bytes: not parsed again
    brain.hot.r.set(client_key("laptop", CLIENT_HEARTBEAT), "s2", ex=60)
    Relay(brain.intake, brain.clients).handle("laptop", connected("laptop", "s2", tools=(LIST,)))
    again = presence.sessions()["laptop"]
    assert again.session_id == "s2" and again.tool("read_local_file") is None
    rec = brain.scheduler.submit(tree(reads(1)), session=SessionKind.INTERACTIVE, client_id="laptop")
    assert brain.store.get_task(rec.tree_id, "r0").state is TaskState.BLOCKED  # it no longer has the tool
    brain.clients.on_disconnected("laptop", "s2", "test")
    assert presence.sessions() == {}


def test_unbound_work_goes_to_any_client_of_the_user_never_to_another_users(brain_on_redis: Brain) -> None:
    brain = brain_on_redis
    for cid, user in (("desk", "ada"), ("cli", "ada"), ("bobs", "bob")):
        brain.scheduler.presence.enroll(cid, user)
    connect(brain, "bobs")
    rec = brain.scheduler.submit(tree(reads(1)), session=SessionKind.AUTONOMOUS, user="ada")
    assert (
        brain.store.get_task(rec.tree_id, "r0").state is TaskState.PENDING_CLIENT
    )  # bob's client is not ada's
    assert brain.scheduler.parked.waiting() == {"user:ada": 1}
    connect(brain, "cli")  # one of ada's clients
    assert brain.store.get_task(rec.tree_id, "r0").route == "client:cli"
    assert queued_task_ids(brain, "cli") == ["r0"] and queued_task_ids(brain, "bobs") == []


def test_bound_work_waits_for_its_client_only_never_another_client_of_the_user(brain_on_redis: Brain) -> None:
    """Issue 22 item 2: `run --client laptop2` ran on laptop (the user's other client) and failed."""
    brain = brain_on_redis
    for cid in ("laptop", "laptop2"):
        brain.scheduler.presence.enroll(cid, "ada")
    connect(brain, "laptop")
    rec = brain.scheduler.submit(
        tree(reads(2)), session=SessionKind.INTERACTIVE, client_id="laptop2", user="ada"
    )
    assert states(brain, rec.tree_id) == {"r0": TaskState.BLOCKED, "r1": TaskState.BLOCKED}
    assert brain.store.get_task(rec.tree_id, "r0").reason == "Waiting for Client for Tool: read_local_file"
    assert queued_task_ids(brain, "laptop") == []
    assert brain.scheduler.parked.waiting() == {"client:laptop2": 2}  # listed for laptop2 alone
    connect(brain, "laptop", session="s2")  # the other client coming back takes none of it
    assert queued_task_ids(brain, "laptop") == []
    connect(brain, "laptop2")
    assert sorted(queued_task_ids(brain, "laptop2")) == ["r0", "r1"]
    assert {t.route for t in brain.store.get_tasks(rec.tree_id)} == {"client:laptop2"}


def test_disconnect_takes_back_unstarted_calls_as_pending_client_and_running_ones_by_strategy(
    brain_on_redis: Brain,
) -> None:
    brain = brain_on_redis
    brain.scheduler.presence.enroll("laptop", "ada")
    connect(brain, "laptop")
    rec = brain.scheduler.submit(tree(reads(2)), session=SessionKind.INTERACTIVE, client_id="laptop")
    # Play kombu: the agent reserved r0 (moved to its unacked hash) and then vanished.
    qkey = client_key("laptop", client_queue("laptop"))
    raw = brain.hot.r.rpop(qkey)
    brain.hot.r.hset(client_key("laptop", "unacked"), "tag1", json.dumps([json.loads(raw), "", "x"]))
    r0_run = brain.store.get_task(rec.tree_id, "r0").run_id
    brain.clients.on_disconnected("laptop", "s1", "test")
    assert states(brain, rec.tree_id) == {"r0": TaskState.BLOCKED, "r1": TaskState.PENDING_CLIENT}
    assert brain.hot.r.llen(qkey) == 0 and brain.hot.r.hlen(client_key("laptop", "unacked")) == 0
    assert brain.hot.r.sismember(client_key("laptop", key_cancelled()), r0_run)
    connect(brain, "laptop", session="s2")
    assert sorted(queued_task_ids(brain, "laptop")) == ["r0", "r1"]
    r0 = brain.store.get_task(rec.tree_id, "r0")
    assert r0.attempt == 2 and r0.run_id != r0_run
    # the old run's late result is ignored; the new one is recorded once
    late = ToolResult(
        run_id=r0_run,
        tree_id=rec.tree_id,
        task_id="r0",
        tool="read_local_file",
        ok=True,
        value="old",
        client_id="laptop",
        started_at=0,
        finished_at=0,
    )
    assert brain.intake.on_result(late, from_client="laptop") is False
    fresh = late.model_copy(update={"run_id": r0.run_id, "value": "new"})
    assert brain.intake.on_result(fresh, from_client="laptop") is True
    assert brain.intake.on_result(fresh, from_client="laptop") is False
    assert brain.store.get_task(rec.tree_id, "r0").result == "new"


def test_an_agent_that_returns_as_a_new_session_gets_the_old_sessions_reserved_calls_back_at_once(
    brain_on_redis: Brain,
) -> None:
    brain = brain_on_redis
    brain.scheduler.presence.enroll("laptop", "ada")
    connect(brain, "laptop", session="s1")
    rec = brain.scheduler.submit(tree(reads(2)), session=SessionKind.INTERACTIVE, client_id="laptop")
    # The agent reserved r0 (kombu moved it to its unacked hash), then was killed and restarted
    # before its heartbeat lapsed: no disconnect is ever seen, only a new session.
    qkey = client_key("laptop", client_queue("laptop"))
    raw = brain.hot.r.rpop(qkey)
    brain.hot.r.hset(client_key("laptop", "unacked"), "tag1", json.dumps([json.loads(raw), "", "x"]))
    r0_run = brain.store.get_task(rec.tree_id, "r0").run_id
    connect(brain, "laptop", session="s2")
    assert brain.hot.r.hlen(client_key("laptop", "unacked")) == 0
    assert brain.hot.r.sismember(client_key("laptop", key_cancelled()), r0_run)
    assert sorted(queued_task_ids(brain, "laptop")) == ["r0", "r1"]
    r0 = brain.store.get_task(rec.tree_id, "r0")
    assert r0.state is TaskState.QUEUED_CLIENT and r0.run_id != r0_run
    # the same session announcing again (its mcp.json changed) takes nothing back
    connect(brain, "laptop", session="s2")
    assert brain.store.get_task(rec.tree_id, "r0").run_id == r0.run_id


def test_concurrent_connects_and_disconnects_never_lose_or_duplicate_a_task(brain_on_redis: Brain) -> None:
    brain = brain_on_redis
    brain.scheduler.presence.enroll("laptop", "ada")
    rec = brain.scheduler.submit(tree(reads(40)), session=SessionKind.INTERACTIVE, client_id="laptop")
    errors: list[BaseException] = []

    def flap(n: int) -> None:
        try:
            for i in range(15):
                connect(brain, "laptop", session=f"s{n}-{i}", read_ack=False)
                brain.clients.on_disconnected("laptop", None, "flap")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=flap, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    connect(brain, "laptop", session="final")
    brain.clients.requeue("laptop")
    tasks = brain.store.get_tasks(rec.tree_id)
    assert {t.state for t in tasks} == {TaskState.QUEUED_CLIENT}
    queue = queued_task_ids(brain, "laptop")
    assert sorted(queue) == sorted(t.task_id for t in tasks)  # each exactly once
    # and each message carries the run id the store expects
    raw = brain.hot.r.lrange(client_key("laptop", client_queue("laptop")), 0, -1)
    assert {json.loads(m)["headers"]["id"] for m in raw} == {t.run_id for t in tasks}


def test_parked_work_past_max_wait_expires_with_a_clear_reason(brain_on_redis: Brain) -> None:
    brain = brain_on_redis
    rec = brain.scheduler.submit(tree(reads(1)), user="ada")
    brain.sweeps.settings = brain.sweeps.settings.model_copy(update={"max_wait_s": 0.01})
    brain.sweeps.clock = lambda: time.time() + 0.05  # the sweep runs 0.05 s later, without sleeping
    assert brain.sweeps.expire_parked() == ["r0"]
    task = brain.store.get_task(rec.tree_id, "r0")
    assert task.state is TaskState.EXPIRED
    assert "for a client with tool 'read_local_file' (max_wait_s 0.01)" in task.reason
    assert brain.store.get_tree(rec.tree_id).status.value == "failed"


def test_a_cancelled_parked_task_never_runs_after_reconnect(brain_on_redis: Brain) -> None:
    brain = brain_on_redis
    brain.scheduler.presence.enroll("laptop", "ada")
    rec = brain.scheduler.submit(tree(reads(2)), user="ada")
    assert brain.sweeps.cancel(rec.tree_id, "r0") == ["r0"]
    connect(brain, "laptop")
    assert queued_task_ids(brain, "laptop") == ["r1"]
    r0 = brain.store.get_task(rec.tree_id, "r0")
    assert (r0.state, r0.reason) == (TaskState.SKIPPED, "cancelled by user")


def test_relay_refuses_bad_announcements_with_a_reason_the_agent_can_read(brain_on_redis: Brain) -> None:
    brain = brain_on_redis
    relay = Relay(brain.intake, brain.clients)

    def ack(cid: str) -> AnnouncementAck:
        return AnnouncementAck.model_validate_json(brain.hot.r.get(client_key(cid, CLIENT_ACK)))

    relay.handle("stranger", connected("stranger"))
    assert not ack("stranger").accepted
    assert "not enrolled; run `vancetope clients enroll stranger --user NAME`" in ack("stranger").reason
    brain.scheduler.presence.enroll("laptop", "ada")
    relay.handle("laptop", connected("mallory"))  # claims another id through its own outbox
    assert ack("laptop").reason == "announcement names client 'mallory' but came through 'laptop''s outbox"
    relay.handle("laptop", b'{"type": "client_connected", "session_id": "s9", "client_id": 7}')
    assert ack("laptop").session_id == "s9" and ack("laptop").reason.startswith("malformed announcement: ")
    relay.handle("laptop", b"x" * (relay.max_bytes + 1))  # oversized: dropped
    relay.handle("laptop", b"not json")  # dropped, nothing to ack
    assert brain.scheduler.presence.sessions() == {}


def test_a_result_from_a_client_the_task_was_not_routed_to_is_refused(brain_on_redis: Brain) -> None:
    brain = brain_on_redis
    for cid in ("laptop", "other"):
        brain.scheduler.presence.enroll(cid, "ada")
    connect(brain, "laptop")
    rec = brain.scheduler.submit(tree(reads(1)), session=SessionKind.INTERACTIVE, client_id="laptop")
    forged = result_for(brain, rec.tree_id, "r0", "other")
    brain.hot.r.lpush(
        client_key("other", CLIENT_OUTBOX),
        ClientToolResult(client_id="other", result=forged).model_dump_json(),
    )
    assert Relay(brain.intake, brain.clients).poll_once(["other"])
    assert brain.store.get_task(rec.tree_id, "r0").state is TaskState.QUEUED_CLIENT


def test_under_an_engine_with_auto_fallback_an_offline_client_tool_fails_only_if_not_allowed(
    brain_on_redis: Brain,
) -> None:
    brain = brain_on_redis
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "eng",
                "engine": "eng_literature_review",
                "tasks": [
                    {"id": "allowed", "tool": "read_local_file", "args": {"path": "x"}},
                    {"id": "refused", "tool": "shell_execute", "args": {"command": "ls"}},
                ],
            }
        ),
        user="ada",
    )
    assert brain.store.get_task(rec.tree_id, "allowed").state is TaskState.PENDING_CLIENT
    refused = brain.store.get_task(rec.tree_id, "refused")
    assert refused.state is TaskState.FAILED
    assert refused.reason == "tool 'shell_execute' is not allowed by engine 'eng_literature_review'"


def test_a_task_its_route_fails_at_submit_skips_its_whole_chain_of_dependents_in_that_submit(
    brain_on_redis: Brain,
) -> None:
    # The submit plans again only after a task ended without running; a chain two deep needs
    # two more plans, and nothing else (no worker, no sweep) runs here to finish the job.
    brain = brain_on_redis
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "eng-chain",
                "engine": "eng_literature_review",
                "tasks": [
                    {"id": "refused", "tool": "shell_execute", "args": {"command": "ls"}},
                    {"id": "next", "tool": "echo", "args": {"text": "x"}, "depends_on": ["refused"]},
                    {"id": "last", "tool": "echo", "args": {"text": "y"}, "depends_on": ["next"]},
                    {"id": "parked", "tool": "read_local_file", "args": {"path": "x"}},
                ],
            }
        ),
        user="ada",
    )
    got = {t.task_id: (t.state, t.reason) for t in brain.store.get_tasks(rec.tree_id)}
    assert got["refused"][0] is TaskState.FAILED
    assert got["next"] == (TaskState.SKIPPED, "upstream task 'refused' failed")
    assert got["last"] == (TaskState.SKIPPED, "upstream task 'next' skipped")
    assert got["parked"][0] is TaskState.PENDING_CLIENT


def test_a_task_past_its_max_total_expires_wherever_it_is_and_its_run_is_cancelled(
    brain_on_redis: Brain,
) -> None:
    brain = brain_on_redis
    brain.scheduler.presence.enroll("laptop", "ada")
    connect(brain, "laptop")
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "total",
                "tasks": [{"id": "r", "tool": "read_local_file", "args": {"path": "x"}, "max_total_s": 0.01}],
            }
        ),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )
    run_id = brain.store.get_task(rec.tree_id, "r").run_id
    brain.sweeps.clock = lambda: time.time() + 0.05  # the sweep runs 0.05 s later, without sleeping
    assert brain.sweeps.expire_overdue() == ["r"]
    task = brain.store.get_task(rec.tree_id, "r")
    assert task.state is TaskState.EXPIRED
    assert task.reason == "expired: not finished within max_total_s 0.01 (state was queued_client)"
    assert brain.hot.r.sismember(client_key("laptop", key_cancelled()), run_id)


def test_a_trees_max_wait_overrides_the_default(brain_on_redis: Brain) -> None:
    brain = brain_on_redis
    rec = brain.scheduler.submit(tree({**reads(1), "max_wait_s": 0.01}), user="ada")
    brain.sweeps.clock = lambda: time.time() + 0.05  # the sweep runs 0.05 s later, without sleeping
    assert brain.sweeps.expire_parked() == ["r0"]
    assert "(max_wait_s 0.01)" in brain.store.get_task(rec.tree_id, "r0").reason


def test_a_client_whose_id_prefixes_another_neither_completes_nor_takes_back_its_work(
    brain_on_redis: Brain,
) -> None:
    brain = brain_on_redis
    for cid in ("laptop", "lap"):
        brain.scheduler.presence.enroll(cid, "ada")
    connect(brain, "laptop")
    connect(brain, "lap", session="s-lap")
    rec = brain.scheduler.submit(tree(reads(1)), session=SessionKind.INTERACTIVE, client_id="laptop")
    task = brain.store.get_task(rec.tree_id, "r0")
    assert task.route == "client:laptop"
    forged = result_for(brain, rec.tree_id, "r0", "lap")
    assert brain.intake.on_result(forged, from_client="lap") is False
    brain.clients.on_disconnected("lap", "s-lap", "test")
    assert brain.store.get_task(rec.tree_id, "r0").state is TaskState.QUEUED_CLIENT
    assert queued_task_ids(brain, "laptop") == ["r0"]


def test_two_requeues_of_one_client_at_once_queue_each_parked_task_exactly_once(
    brain_on_redis: Brain,
) -> None:
    brain = brain_on_redis
    brain.scheduler.presence.enroll("laptop", "ada")
    rec = brain.scheduler.submit(tree(reads(60)), user="ada")
    msg = ClientConnected.model_validate_json(connected("laptop"))
    brain.scheduler.presence.connect(msg, brain.scheduler.presence.enrollment("laptop"), time.time())
    errors: list[BaseException] = []

    def run(step) -> None:
        try:
            step()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    # the relay thread's connect and the reconciler (or a second brain) at the same moment
    threads = [
        threading.Thread(target=run, args=(lambda: brain.clients.requeue("laptop"),)),
        threading.Thread(target=run, args=(lambda: brain.clients.requeue("laptop"),)),
        threading.Thread(target=run, args=(brain.sweeps.finish_requeues,)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert set(states(brain, rec.tree_id).values()) == {TaskState.QUEUED_CLIENT}
    assert sorted(queued_task_ids(brain, "laptop")) == sorted(f"r{i}" for i in range(60))
    assert brain.scheduler.parked.waiting() == {} and brain.scheduler.parked.requeueing_clients() == []


def test_take_back_reads_a_long_queue_and_unacked_hash_once_and_takes_exactly_the_runs_asked_for(
    brain_on_redis: Brain,
) -> None:
    from brain.hot.state import READ_CHUNK
    from workers.contracts import KOMBU_UNACKED, KOMBU_UNACKED_INDEX

    hot = brain_on_redis.hot
    qkey, ukey = client_key("laptop", client_queue("laptop")), client_key("laptop", KOMBU_UNACKED)
    n = 2 * READ_CHUNK + 7
    hot.r.lpush(qkey, *(json.dumps({"headers": {"id": f"q{i}"}}) for i in range(n)))
    hot.r.hset(
        ukey, mapping={f"tag{i}": json.dumps([{"headers": {"id": f"u{i}"}}, "", "x"]) for i in range(n)}
    )
    hot.r.zadd(client_key("laptop", KOMBU_UNACKED_INDEX), {f"tag{i}": i for i in range(n)})
    asked = ["q0", f"q{n - 1}", f"q{READ_CHUNK}", "u3", f"u{n - 2}", "gone", ""]
    assert hot.take_client_runs("laptop", asked) == {
        "q0": "queued", f"q{n - 1}": "queued", f"q{READ_CHUNK}": "queued", "u3": "running", f"u{n - 2}": "running"
    }  # fmt: skip
    assert hot.r.llen(qkey) == n - 3 and hot.r.hlen(ukey) == n - 2
    assert hot.r.zscore(client_key("laptop", KOMBU_UNACKED_INDEX), "tag3") is None
    assert hot.take_client_runs("laptop", asked) == {}  # taken once: a second take-back wins nothing
    held = hot.message_ids_held([client_queue("laptop")], client_id="laptop")
    assert len(held) == 2 * n - 5 and "q1" in held and "u4" in held and "q0" not in held


def test_disconnect_takes_back_many_calls_at_once(brain_on_redis: Brain) -> None:
    brain = brain_on_redis
    brain.scheduler.presence.enroll("laptop", "ada")
    connect(brain, "laptop")
    rec = brain.scheduler.submit(tree(reads(30)), session=SessionKind.INTERACTIVE, client_id="laptop")
    qkey = client_key("laptop", client_queue("laptop"))
    for i in range(5):  # the agent reserved five, then vanished
        raw = brain.hot.r.rpop(qkey)
        brain.hot.r.hset(client_key("laptop", "unacked"), f"tag{i}", json.dumps([json.loads(raw), "", "x"]))
    runs = {t.run_id for t in brain.store.get_tasks(rec.tree_id)}
    assert brain.clients.on_disconnected("laptop", "s1", "test") == 30
    got = states(brain, rec.tree_id)
    assert sorted(got.values()).count(TaskState.PENDING_CLIENT) == 25
    assert sorted(got.values()).count(TaskState.BLOCKED) == 5
    assert brain.hot.r.llen(qkey) == 0 and brain.hot.r.hlen(client_key("laptop", "unacked")) == 0
    assert brain.hot.r.smembers(client_key("laptop", key_cancelled())) == {r.encode() for r in runs}
    connect(brain, "laptop", session="s2")
    assert sorted(queued_task_ids(brain, "laptop")) == sorted(f"r{i}" for i in range(30))
