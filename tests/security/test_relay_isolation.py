"""One hostile workstation cannot stop another user's work (issue 20, item 1; rows H1, H2,
M1 and the queue-string L item).

A real stack: redis-server, the brain and the victim's real `vancetope-agent` ("laptop",
user ada). The attacker ("mallory", user eve) holds nothing but its own enrolled
credential and writes only its own keys ``c:mallory:*``: a heartbeat that is not UTF-8,
an outbox or a queue turned into a string, more than its quota. Each time the victim's
tree still finishes with every tool call executed exactly once (the calls append their
own id to a file on the victim's workstation), the attacker is marked misbehaving with a
clear cause in `vancetope clients --json`, and the brain's log says so once.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from brain.core.client_health import QUOTA_KIND, Cause
from brain.core.models import SessionKind, TaskState, TreeStatus
from brain.errors import StoreError
from brain.hot.queues import read_queues
from brain.runtime.enrollment import Credential, enroll
from brain.runtime.relay import Relay
from brain.runtime.service import Brain
from tests.conftest import ROOT, result_for, tree, wait_for_tree, wait_until
from tests.integration.test_parking import READ, connect, connected, reads
from workers.contracts import (
    CLIENT_ACK,
    CLIENT_HEARTBEAT,
    CLIENT_OUTBOX,
    AnnouncementAck,
    ClientConnected,
    ClientToolResult,
    client_key,
    client_queue,
    key_cancelled,
)

pytestmark = pytest.mark.integration

QUOTA = 1024 * 1024  # the stack's client_quota_bytes here: 1 MiB
CALLS = 4


def victim_agent(tmp_path: Path) -> Path:
    """agent.toml of the victim "laptop" (user ada): shell_execute, so each call leaves a
    line in ``runs.txt`` saying it ran."""
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {}}))
    config = tmp_path / "agent.toml"
    config.write_text(
        "[agent]\n"
        'client_id = "laptop"\nuser = "ada"\nclient_type = "cli"\n'
        'broker_url = "redis://127.0.0.1:1/0"\n'  # replaced by the stack's VANCETOPE_AGENT_BROKER_URL
        f'sandbox_roots = ["{sandbox}"]\nmcp_json = "{tmp_path / "mcp.json"}"\n'
        "shell_enabled = true\n"
        "heartbeat_interval_s = 0.5\nheartbeat_ttl_s = 2.0\n"
    )
    return config


def as_client(credential: Credential) -> redis.Redis:
    return redis.Redis.from_url(credential.broker_url, socket_timeout=5)


def vancetope(tmp_path: Path, *args: str) -> Any:
    """The operator's CLI against the test's stack; its JSON output."""
    proc = subprocess.run(  # noqa: PLW1510 - asserted below
        [sys.executable, "-m", "brain", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "VANCETOPE_DATA_DIR": str(tmp_path / "data"), "COLUMNS": "250"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# What the attacker writes into its own keys, and what the brain must then say about it.
def bad_heartbeat(r: redis.Redis) -> None:
    r.set(client_key("mallory", CLIENT_HEARTBEAT), b"\xff\xfe not a session \xc3\x28", ex=600)


def outbox_string(r: redis.Redis) -> None:
    r.delete(client_key("mallory", CLIENT_OUTBOX))
    r.set(client_key("mallory", CLIENT_OUTBOX), "not a list")


def queue_string(r: redis.Redis) -> None:
    r.set(client_key("mallory", client_queue("mallory")), "not a list")


def over_quota(r: redis.Redis) -> None:
    for i in range(2):  # 2 x 1 MiB, each under any size limit, together over the quota
        r.set(client_key("mallory", f"junk{i}"), b"x" * QUOTA)


ATTACKS: list[tuple[str, Callable[[redis.Redis], None], str]] = [
    ("H1 heartbeat not UTF-8", bad_heartbeat, "its heartbeat is not UTF-8 text"),
    # (the relay's pop or the heartbeat sweep's TYPE check finds it first: either words it so)
    ("H2 outbox turned into a string", outbox_string, "its outbox 'c:mallory:outbox'"),
    (
        "L queue turned into a string",
        queue_string,
        "its queue 'c:mallory:client.mallory' is a string, not a list",
    ),
    ("M1 over its quota", over_quota, f"> {QUOTA} (client_quota_bytes)"),
]


@pytest.mark.parametrize(("what", "attack", "cause"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_a_client_breaking_its_own_keys_stops_nobody_else(
    what: str,
    attack: Callable[[redis.Redis], None],
    cause: str,
    tmp_path: Path,
    stack_factory: Callable[..., Any],
    brain_factory: Callable[..., Brain],
) -> None:
    registry = tmp_path / "registry.yaml"
    registry.write_text("tools:\n  - {name: shell_execute, location: client, type: native}\n")
    stack = stack_factory(
        services=("brain", "client-agent"),
        agent_config=victim_agent(tmp_path),
        registry=registry,
        client_quota_bytes=QUOTA,
    )
    brain = brain_factory(stack)
    wait_until(lambda: brain.scheduler.presence.session("laptop"), timeout=120, what="the victim's agent")
    mallory = enroll(brain.scheduler.presence, "mallory", "eve", stack.redis.address_url)
    attacker = as_client(mallory)
    attacker.set(client_key("mallory", CLIENT_HEARTBEAT), "s-m", ex=600)
    attacker.lpush(client_key("mallory", CLIENT_OUTBOX), connected("mallory", session="s-m", tools=(READ,)))
    wait_until(
        lambda: brain.scheduler.presence.session("mallory"), timeout=120, what="the attacker to connect"
    )

    attack(attacker)
    mark = wait_until(
        lambda: brain.clients.misbehaving.get("mallory"), timeout=120, what="the attacker's mark"
    )
    assert cause in mark.shown()
    # suspended: nothing is routed to it. The brain writes the mark, then ends the session
    # (ClientWork.suspend: two writes), so the session may outlive the mark a moment.
    wait_until(
        lambda: brain.scheduler.presence.session("mallory") is None,
        timeout=120,
        what="the suspended attacker's session to end",
    )

    runs = tmp_path / "sandbox" / "runs.txt"
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "victim",
                "tasks": [
                    {"id": f"c{i}", "tool": "shell_execute", "args": {"command": f"echo c{i} >> {runs}"}}
                    for i in range(CALLS)
                ],
            }
        ),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.DONE
    assert sorted(runs.read_text().split()) == [f"c{i}" for i in range(CALLS)]  # each ran once
    assert all(t.attempt == 1 and t.route == "client:laptop" for t in brain.store.get_tasks(rec.tree_id))

    # The operator sees who and why; the attacker's own ack tells it.
    shown = {c["client_id"]: c for c in vancetope(tmp_path, "clients", "--json")["clients"]}
    assert shown["laptop"]["misbehaving"] is None and shown["laptop"]["connected"]
    assert not shown["mallory"]["connected"]
    if what.startswith("M1") and shown["mallory"]["misbehaving"] is None:
        # Its keys were freed, so at the next measure (QUOTA_EVERY_S later) it was back under
        # its quota and the brain lifted the mark; the victim's tree may outlast that. The brain
        # log keeps what the operator needs: who, and why.
        logged = (stack.settings.data_dir / "logs" / "brain.log").read_text()
        assert "client 'mallory' keeps" in logged and "back under its quota" in logged, logged[-4000:]
    else:
        assert cause in shown["mallory"]["misbehaving"]
    ack = AnnouncementAck.model_validate_json(attacker.get(client_key("mallory", CLIENT_ACK)))
    assert not ack.accepted and "suspended by the brain" in ack.reason and cause in ack.reason
    if what.startswith("L"):  # `status --queues` still reads every queue, and names the broken one
        queues = {c["client_id"]: c for c in vancetope(tmp_path, "status", "--queues", "--json")["clients"]}
        assert queues["laptop"]["misbehaving"] is None
        assert cause in queues["mallory"]["misbehaving"]
    attacker.close()
    logged = (stack.settings.data_dir / "logs" / "brain.log").read_text()
    assert logged.count("client 'mallory' misbehaves") == 1, logged[-4000:]


def test_a_suspended_client_is_accepted_again_once_it_announces_cleanly(
    tmp_path: Path, stack_factory: Callable[..., Any], brain_factory: Callable[..., Brain]
) -> None:
    stack = stack_factory(services=("brain",), client_quota_bytes=QUOTA)
    brain = brain_factory(stack)
    mallory = enroll(brain.scheduler.presence, "mallory", "eve", stack.redis.address_url)
    attacker = as_client(mallory)
    attacker.set(client_key("mallory", CLIENT_HEARTBEAT), "s-m", ex=600)
    over_quota(attacker)
    mark = wait_until(lambda: brain.clients.misbehaving.get("mallory"), timeout=120, what="the quota check")
    assert f"> {QUOTA} (client_quota_bytes)" in mark.shown()

    def announce(session: str) -> AnnouncementAck | None:
        attacker.delete(client_key("mallory", CLIENT_ACK))
        attacker.lpush(
            client_key("mallory", CLIENT_OUTBOX), connected("mallory", session=session, tools=(READ,))
        )
        raw = wait_until(lambda: attacker.get(client_key("mallory", CLIENT_ACK)), timeout=120, what="an ack")
        return AnnouncementAck.model_validate_json(raw)

    # While marked, an announcement is refused. Handed to the brain's own handler: one pushed
    # to the outbox now would be freed with the over-quota keys (the brain marks, then frees).
    refused = brain.clients.on_connected(
        ClientConnected.model_validate_json(connected("mallory", session="s-m", tools=(READ,))), "mallory"
    )
    assert not refused.accepted and "over quota" in refused.reason
    wait_until(
        lambda: not attacker.exists(*(client_key("mallory", f"junk{i}") for i in range(2))),
        timeout=120,
        what="the brain to free the over-quota keys",
    )
    wait_until(lambda: brain.clients.misbehaving.get("mallory") is None, timeout=120, what="back under quota")
    assert announce("s-m").accepted
    assert brain.scheduler.presence.session("mallory") is not None
    attacker.close()


# --- the reconciler, and a message lost meanwhile (no agent: the test plays both clients)


def test_resend_lost_still_resends_other_clients_work_while_one_queue_is_a_string(
    brain_on_redis: Brain, redis_server: Any
) -> None:
    brain = brain_on_redis
    presence = brain.scheduler.presence
    enroll(presence, "victim", "ada", redis_server.address_url)
    mallory = enroll(presence, "mallory", "eve", redis_server.address_url)
    for cid in ("victim", "mallory"):
        connect(brain, cid, session=f"s-{cid}")
    mine = brain.scheduler.submit(tree(reads(1, "v")), session=SessionKind.INTERACTIVE, client_id="victim")
    theirs = brain.scheduler.submit(tree(reads(1, "m")), session=SessionKind.INTERACTIVE, client_id="mallory")
    first = brain.store.get_task(mine.tree_id, "r0")
    brain.hot.r.delete(client_key("victim", client_queue("victim")))  # the victim's call is lost
    attacker = as_client(mallory)
    attacker.delete(client_key("mallory", client_queue("mallory")))
    attacker.set(client_key("mallory", client_queue("mallory")), "not a list")
    attacker.close()
    brain.sweeps.clock = lambda: time.time() + 60  # both calls are past reconcile_grace_s

    resent = brain.sweeps.resend_lost()
    assert resent == ["r0"]
    again = brain.store.get_task(mine.tree_id, "r0")
    assert again.state is TaskState.QUEUED_CLIENT and again.run_id != first.run_id and again.attempt == 2
    assert brain.hot.r.llen(client_key("victim", client_queue("victim"))) == 1  # sent once, to the victim
    mark = brain.clients.misbehaving.get("mallory")
    assert mark is not None and "its queue 'c:mallory:client.mallory' cannot be read" in mark.shown()
    # the attacker's own call is taken back (its queue is gone), never lost in a queued state
    assert brain.store.get_task(theirs.tree_id, "r0").state is not TaskState.QUEUED_CLIENT


def test_a_failing_relay_step_never_stops_the_outboxes_and_is_logged_once(
    brain_on_redis: Brain, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    brain = brain_on_redis
    brain.scheduler.presence.enroll("laptop", "ada")
    connect(brain, "laptop")
    rec = brain.scheduler.submit(tree(reads(2)), session=SessionKind.INTERACTIVE, client_id="laptop")
    sweeps: list[float] = []

    def sweep_fails() -> None:
        sweeps.append(time.monotonic())
        raise StoreError("store .vancetope/store.db: disk I/O error")

    monkeypatch.setattr(brain.clients, "sweep_heartbeats", sweep_fails)
    stop = threading.Event()
    with caplog.at_level(logging.INFO, logger="vancetope.brain"):
        thread = Relay(brain.intake, brain.clients).run(stop)
        try:
            for task_id in ("r0", "r1"):
                result = result_for(brain, rec.tree_id, task_id, "laptop", value="read")
                brain.hot.r.lpush(
                    client_key("laptop", CLIENT_OUTBOX),
                    ClientToolResult(client_id="laptop", result=result).model_dump_json(),
                )
                wait_until(
                    lambda t=task_id: brain.store.get_task(rec.tree_id, t).state is TaskState.DONE,
                    timeout=60,
                    what=f"{task_id}'s result to be recorded while the sweep fails",
                )
            wait_until(lambda: len(sweeps) >= 3, timeout=60, what="three failed sweeps")
        finally:
            stop.set()
            thread.join(10)
    failures = [r for r in caplog.records if "the heartbeat sweep failed" in r.getMessage()]
    assert len(failures) == 1


def test_what_a_client_put_in_its_kombu_keys_never_breaks_the_reconcilers_reads(
    brain_on_redis: Brain,
) -> None:
    brain = brain_on_redis
    brain.scheduler.presence.enroll("mallory", "eve")
    connect(brain, "mallory")
    rec = brain.scheduler.submit(tree(reads(1)), session=SessionKind.INTERACTIVE, client_id="mallory")
    run_id = brain.store.get_task(rec.tree_id, "r0").run_id
    queue = client_key("mallory", client_queue("mallory"))
    garbage = [b"\xff\xfe", b"[1]", b'{"headers": [1]}', b'{"headers": "x"}', b"[" * 5000, b'{"a": 1}']
    brain.hot.r.lpush(queue, *garbage)
    unacked = client_key("mallory", "unacked")
    brain.hot.r.hset(unacked, mapping={f"t{i}": g for i, g in enumerate([*garbage, b'{"0": 1}', b"[[1]]"])})
    brain.hot.r.lpush(client_key("mallory", CLIENT_OUTBOX), *garbage)
    marks = client_key("mallory", f"vt:tree:{rec.tree_id}:running")
    brain.hot.r.hset(marks, mapping={"r0": b"\xff", "r1": b"[1]"})
    assert run_id in brain.hot.message_ids_held([client_queue("mallory")], client_id="mallory")
    assert brain.hot.running(rec.tree_id, ["mallory"]) == {}
    assert brain.hot.take_client_runs("mallory", [run_id or ""]) == {run_id: "queued"}


def test_one_poll_hands_over_what_it_popped_even_when_another_outbox_is_a_string(
    brain_on_redis: Brain, caplog: pytest.LogCaptureFixture
) -> None:
    brain = brain_on_redis
    for cid in ("aaa-mallory", "victim"):  # the attacker's outbox comes first in the round
        brain.scheduler.presence.enroll(cid, "ada")
        connect(brain, cid, session=f"s-{cid}")
    rec = brain.scheduler.submit(tree(reads(1)), session=SessionKind.INTERACTIVE, client_id="victim")
    brain.hot.r.set(client_key("aaa-mallory", CLIENT_OUTBOX), "not a list")
    result = result_for(brain, rec.tree_id, "r0", "victim", value="read")
    brain.hot.r.lpush(
        client_key("victim", CLIENT_OUTBOX),
        ClientToolResult(client_id="victim", result=result).model_dump_json(),
    )
    relay = Relay(brain.intake, brain.clients)
    with caplog.at_level(logging.WARNING, logger="vancetope.brain"):
        assert relay.poll_once(["aaa-mallory", "victim"]) is True
        assert brain.store.get_task(rec.tree_id, "r0").state is TaskState.DONE  # popped, and kept
        for _ in range(3):  # rounds with only the broken outbox: no error, no new line
            assert relay.poll_once(["aaa-mallory"]) is False
    assert brain.hot.r.llen(client_key("victim", CLIENT_OUTBOX)) == 0
    logged = [r.getMessage() for r in caplog.records if "misbehaves" in r.getMessage()]
    assert len(logged) == 1
    assert logged[0].startswith(
        "client 'aaa-mallory' misbehaves: its outbox 'c:aaa-mallory:outbox' cannot be read (WRONGTYPE"
    )
    assert set(brain.scheduler.presence.sessions()) == {"victim"}


def test_a_suspended_client_gets_one_message_a_round(brain_on_redis: Brain) -> None:
    brain = brain_on_redis
    brain.scheduler.presence.enroll("mallory", "eve")
    connect(brain, "mallory")
    outbox = client_key("mallory", CLIENT_OUTBOX)
    brain.hot.r.lpush(outbox, b"\xff not json")
    relay = Relay(brain.intake, brain.clients)
    assert relay.poll_once(["mallory"]) is True
    mark = brain.clients.misbehaving.get("mallory")
    assert mark is not None and "sent a malformed message (dropped)" in mark.shown()
    brain.hot.r.lpush(outbox, *[b"junk %d" % i for i in range(5)])
    assert relay.poll_once(["mallory"]) is True
    assert brain.hot.r.llen(outbox) == 4  # an unsuspended client's round takes up to POP_BATCH


def test_each_cause_is_logged_once_and_a_quota_mark_follows_the_measure(
    brain_on_redis: Brain, caplog: pytest.LogCaptureFixture
) -> None:
    book = brain_on_redis.clients.misbehaving
    heartbeat = Cause(kind="heartbeat encoding", detail="its heartbeat is not UTF-8 text")
    with caplog.at_level(logging.WARNING, logger="vancetope.brain"):
        assert [book.mark("mallory", heartbeat, 1.0) for _ in range(5)] == [True, False, False, False, False]
        assert book.mark("mallory", Cause(kind=QUOTA_KIND, detail="over quota: 9 bytes > 8"), 2.0)
        assert not book.mark("mallory", Cause(kind=QUOTA_KIND, detail="over quota: 10 bytes > 8"), 3.0)
    assert len([r for r in caplog.records if "client 'mallory' misbehaves" in r.getMessage()]) == 2
    mark = book.get("mallory")
    assert mark is not None and mark.since == 1.0
    assert mark.shown() == "its heartbeat is not UTF-8 text; over quota: 10 bytes > 8"
    assert book.clear("mallory", {QUOTA_KIND}) is not None
    assert book.all()["mallory"].causes == {"heartbeat encoding": "its heartbeat is not UTF-8 text"}
    assert book.clear("mallory") is not None and book.get("mallory") is None


def test_status_queues_reads_every_client_while_one_queue_is_a_string(brain_on_redis: Brain) -> None:
    brain = brain_on_redis
    for cid in ("mallory", "victim"):
        brain.scheduler.presence.enroll(cid, "ada")
        connect(brain, cid, session=f"s-{cid}")
    brain.scheduler.submit(tree(reads(2)), session=SessionKind.INTERACTIVE, client_id="victim")
    brain.hot.r.set(client_key("mallory", client_queue("mallory")), "not a list")
    report = read_queues(brain.hot.r, brain.scheduler.presence, brain.scheduler.parked, [])
    rows = {c.client_id: c for c in report.clients}
    assert (rows["victim"].waiting, rows["victim"].misbehaving) == (2, None)
    assert rows["mallory"].waiting == 0
    assert "its queue 'c:mallory:client.mallory' cannot be read (WRONGTYPE" in (
        rows["mallory"].misbehaving or ""
    )
    assert any(
        line.startswith("client 'mallory' (user 'ada') misbehaves, suspended: its queue")
        for line in report.alarms()
    )


def test_a_real_agent_over_its_quota_is_told_why_and_comes_back_once_under_it(
    tmp_path: Path, stack_factory: Callable[..., Any], brain_factory: Callable[..., Brain]
) -> None:
    stack = stack_factory(
        services=("brain", "client-agent"), agent_config=victim_agent(tmp_path), client_quota_bytes=QUOTA
    )
    brain = brain_factory(stack)
    first = wait_until(lambda: brain.scheduler.presence.session("laptop"), timeout=120, what="the agent")
    junk = client_key("laptop", "junk")
    brain.hot.r.set(junk, b"x" * (2 * QUOTA))  # as if the workstation had stored it
    agent_log = stack.service("client-agent").log_path
    assert agent_log is not None
    wait_until(
        lambda: (
            "the brain suspended this agent: suspended by the brain: over quota: " in agent_log.read_text()
        ),
        timeout=120,  # a measure every 2 s, then the agent's next read: 30 s ran out once under CI's load
        what="the agent to log why it was suspended",
    )
    assert brain.scheduler.presence.session("laptop") is None
    brain.hot.r.delete(junk)
    back = wait_until(
        lambda: brain.scheduler.presence.session("laptop"), timeout=120, what="the agent to come back"
    )
    assert back.session_id == first.session_id and brain.clients.misbehaving.get("laptop") is None


def test_cancelling_a_tree_whose_client_broke_its_cancelled_set_cancels_it_and_suspends_that_client(
    brain_on_redis: Brain, redis_server: Any
) -> None:
    brain = brain_on_redis
    mallory = enroll(brain.scheduler.presence, "mallory", "eve", redis_server.address_url)
    connect(brain, "mallory", session="s-mallory")
    theirs = brain.scheduler.submit(tree(reads(2, "m")), session=SessionKind.INTERACTIVE, client_id="mallory")
    attacker = as_client(mallory)
    attacker.set(client_key("mallory", key_cancelled()), "not a set")
    attacker.close()

    assert sorted(brain.sweeps.cancel(theirs.tree_id)) == ["r0", "r1"]
    assert {t.state for t in brain.store.get_tasks(theirs.tree_id)} == {TaskState.SKIPPED}
    mark = brain.clients.misbehaving.get("mallory")
    assert mark is not None and "cancelled set" in mark.shown()


def test_a_client_sending_many_large_results_gets_one_largest_messages_worth_of_a_round(
    brain_on_redis: Brain,
) -> None:
    """Found by the attacker trial: 64 results of ~1 MB each for no task held every round 10-13 s."""
    brain = brain_on_redis
    for cid in ("aaa-mallory", "victim"):
        brain.scheduler.presence.enroll(cid, "ada")
        connect(brain, cid, session=f"s-{cid}")
    rec = brain.scheduler.submit(tree(reads(1)), session=SessionKind.INTERACTIVE, client_id="victim")
    relay = Relay(brain.intake, brain.clients)
    big = result_for(brain, rec.tree_id, "r0", "aaa-mallory", value="x" * (relay.max_bytes // 2))
    flood = [
        ClientToolResult(client_id="aaa-mallory", result=big.model_copy(update={"run_id": f"run-{i}"}))
        .model_dump_json()
        .encode()
        for i in range(8)
    ]
    outbox = client_key("aaa-mallory", CLIENT_OUTBOX)
    brain.hot.r.lpush(outbox, *flood)  # the agent LPUSHes: the first sent is at the tail
    result = result_for(brain, rec.tree_id, "r0", "victim", value="read")
    brain.hot.r.lpush(
        client_key("victim", CLIENT_OUTBOX),
        ClientToolResult(client_id="victim", result=result).model_dump_json(),
    )
    assert relay.poll_once(["aaa-mallory", "victim"]) is True
    assert brain.store.get_task(rec.tree_id, "r0").state is TaskState.DONE
    # one largest message's worth of the attacker's was handled; the rest waits, in order
    left = brain.hot.r.lrange(outbox, 0, -1)
    assert len(left) == len(flood) - 1
    assert left[::-1] == flood[1:]
