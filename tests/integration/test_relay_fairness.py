"""The relay under a flooding client (issue 7), on a real Redis, no workers: outboxes are
served fairly, capped, and messages too deep to parse safely are refused.

Delays are counted in relay polls, not seconds.
"""

from __future__ import annotations

import logging

import pytest
import redis

from brain.core.models import SessionKind, TaskState
from brain.errors import StoreError
from brain.runtime import relay as relay_module
from brain.runtime.relay import POP_BATCH, Relay
from brain.runtime.service import Brain
from tests.conftest import InThread, result_for, tree, wait_until
from tests.integration.test_parking import connect, reads
from tests.redis_commands import command_counts, reset_counts
from workers.contracts import CLIENT_OUTBOX, ClientToolResult, client_key

pytestmark = pytest.mark.integration

FLOOD = 10_000


def flood(brain: Brain, client_id: str, n: int = FLOOD) -> None:
    pipe = brain.hot.r.pipeline(transaction=False)
    for i in range(0, n, 1000):
        pipe.lpush(
            client_key(client_id, CLIENT_OUTBOX), *[b"junk %d" % j for j in range(i, min(n, i + 1000))]
        )
    pipe.execute()


def result_message(brain: Brain, tree_id: str, task_id: str, client_id: str) -> bytes:
    result = result_for(brain, tree_id, task_id, client_id, value="from the quiet client")
    return ClientToolResult(client_id=client_id, result=result).model_dump_json().encode()


def test_a_flooding_client_delays_another_clients_result_by_at_most_one_poll_and_is_capped(
    brain_on_redis: Brain, caplog: pytest.LogCaptureFixture
) -> None:
    brain = brain_on_redis
    for cid in ("aaa-flood", "zzz-quiet"):  # the flooder sorts first: BRPOP alone would always serve it
        brain.scheduler.presence.enroll(cid, "ada")
        connect(brain, cid, session=f"s-{cid}")
    rec = brain.scheduler.submit(tree(reads(1)), session=SessionKind.INTERACTIVE, client_id="zzz-quiet")
    flood(brain, "aaa-flood")
    brain.hot.r.lpush(
        client_key("zzz-quiet", CLIENT_OUTBOX), result_message(brain, rec.tree_id, "r0", "zzz-quiet")
    )

    relay = Relay(brain.intake, brain.clients)
    enrolled = sorted(brain.scheduler.presence.enrolled())
    polls = 0
    with caplog.at_level(logging.WARNING, logger="vancetope.brain"):
        while brain.store.get_task(rec.tree_id, "r0").state is not TaskState.DONE and polls < 50:
            relay.poll_once(enrolled)
            polls += 1
    assert brain.store.get_task(rec.tree_id, "r0").state is TaskState.DONE
    assert polls <= 2
    cap = brain.settings.outbox_max_messages
    left = brain.hot.r.llen(client_key("aaa-flood", CLIENT_OUTBOX))
    assert left <= cap - POP_BATCH  # the excess went at the first poll; the brain took one batch at most
    assert any(
        f"dropped {FLOOD - cap} message(s) from client 'aaa-flood'" in r.getMessage() for r in caplog.records
    )


def test_a_message_nested_too_deep_to_parse_safely_is_dropped_and_the_relay_goes_on(
    brain_on_redis: Brain, caplog: pytest.LogCaptureFixture
) -> None:
    brain = brain_on_redis
    for cid in ("laptop", "mallory"):
        brain.scheduler.presence.enroll(cid, "ada")
        connect(brain, cid, session=f"s-{cid}")
    rec = brain.scheduler.submit(tree(reads(1)), session=SessionKind.INTERACTIVE, client_id="laptop")
    deep = (
        b'{"type": "client_connected", "session_id": "x", "available_tools": ' + b"[" * 10_000 + b"]" * 10_000
    )
    brain.hot.r.lpush(client_key("mallory", CLIENT_OUTBOX), deep + b"}")
    brain.hot.r.lpush(client_key("laptop", CLIENT_OUTBOX), result_message(brain, rec.tree_id, "r0", "laptop"))
    relay = Relay(brain.intake, brain.clients)
    with caplog.at_level(logging.WARNING, logger="vancetope.brain"):
        assert relay.poll_once(["laptop", "mallory"]) is True
    assert brain.store.get_task(rec.tree_id, "r0").state is TaskState.DONE
    # the sender is suspended for it, and only the sender
    assert any(
        "client 'mallory' misbehaves: sent a message nested 10001 deep" in r.getMessage()
        for r in caplog.records
    )
    mark = brain.clients.misbehaving.get("mallory")
    assert mark is not None and "nested 10001 deep" in mark.shown()
    assert set(brain.scheduler.presence.sessions()) == {"laptop"}


def test_a_message_whose_handling_fails_does_not_take_the_rest_of_its_batch_with_it(
    brain_on_redis: Brain, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    brain = brain_on_redis
    brain.scheduler.presence.enroll("laptop", "ada")
    connect(brain, "laptop")
    rec = brain.scheduler.submit(tree(reads(3)), session=SessionKind.INTERACTIVE, client_id="laptop")
    record = brain.intake.on_result

    def store_fails_for_r1(result, from_client=None):  # type: ignore[no-untyped-def]
        if result.task_id == "r1":
            raise StoreError("store .vancetope/store.db: transition failed: disk I/O error")
        return record(result, from_client)

    monkeypatch.setattr(brain.intake, "on_result", store_fails_for_r1)
    outbox = client_key("laptop", CLIENT_OUTBOX)
    for task_id in (
        "r0",
        "r1",
        "r2",
    ):  # one poll pops all three: the agent LPUSHes, the relay pops oldest first
        brain.hot.r.lpush(outbox, result_message(brain, rec.tree_id, task_id, "laptop"))
    relay = Relay(brain.intake, brain.clients)
    with caplog.at_level(logging.ERROR, logger="vancetope.brain"):
        assert relay.poll_once(["laptop"]) is True
    states = {t.task_id: t.state for t in brain.store.get_tasks(rec.tree_id)}
    assert states == {"r0": TaskState.DONE, "r1": TaskState.QUEUED_CLIENT, "r2": TaskState.DONE}
    assert brain.hot.r.llen(outbox) == 0
    assert any(
        "message from client 'laptop'; going on with the next" in r.getMessage() for r in caplog.records
    )


def test_idle_outboxes_cost_a_poll_no_command_of_their_own(
    brain_on_redis: Brain, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 1,000 clients idle, an LLEN, LTRIM and RPOP of every outbox at every poll were
    3,000 commands a second. Now an idle poll is two commands whatever the number of outboxes
    (which hold anything, then BRPOP), and a round touches only the outboxes that hold
    something, still trimmed to the cap."""
    monkeypatch.setattr(relay_module, "POP_TIMEOUT_S", 0.05)  # BRPOP finds nothing: no need to wait
    brain = brain_on_redis
    enrolled = [f"idle-{i:03d}" for i in range(300)]
    relay = Relay(brain.intake, brain.clients)
    reset_counts(redis_client)
    for _ in range(3):
        assert relay.poll_once(enrolled) is False
    counts = command_counts(redis_client)
    # commandstats counts the script's own EXISTS of each outbox too: inside Redis, no reply each.
    inside_script = counts.pop("exists", 0)
    assert inside_script == 3 * len(enrolled)
    sent = {k: n for k, n in counts.items() if k not in ("hello", "client")}  # the connection's setup
    assert sent.get("brpop") == 3 and sent.get("evalsha") == 3
    assert sum(sent.values()) <= 3 * 3  # (the script's first call may load it: EVAL)
    assert not {"llen", "ltrim", "rpop"} & set(sent)  # not one per outbox

    cap = brain.scheduler.settings.outbox_max_messages
    flood(brain, "idle-150", cap + 5)
    reset_counts(redis_client)
    assert relay.poll_once(enrolled) is True  # its messages are junk: dropped, the client suspended
    counts = command_counts(redis_client)
    assert counts["llen"] == counts["ltrim"] == counts["rpop"] == 1  # the one that held something
    assert redis_client.llen(client_key("idle-150", CLIENT_OUTBOX)) <= cap


def test_a_relay_woken_by_brpop_takes_the_rest_of_that_outbox_in_the_same_poll(
    brain_on_redis: Brain, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two brains race for each message: one woken for a message takes what else its outbox
    holds at once (one RPOP), not one message per round and BRPOP each."""
    brain = brain_on_redis
    brain.scheduler.presence.enroll("laptop", "ada")
    connect(brain, "laptop")
    rec = brain.scheduler.submit(tree(reads(10)), session=SessionKind.INTERACTIVE, client_id="laptop")
    messages = [result_message(brain, rec.tree_id, f"r{i}", "laptop") for i in range(10)]
    monkeypatch.setattr(relay_module, "POP_TIMEOUT_S", 60)  # the push below wakes it, never a timeout

    def push_once_blocked() -> None:
        wait_until(
            lambda: any(c.get("cmd") == "brpop" for c in brain.hot.r.client_list()), what="the relay in BRPOP"
        )
        brain.hot.r.lpush(client_key("laptop", CLIENT_OUTBOX), *messages)  # all ten at once

    pusher = InThread(push_once_blocked)
    assert Relay(brain.intake, brain.clients).poll_once(["laptop"]) is True  # one poll: round, BRPOP
    wait_until(pusher.done, what="the pusher")
    pusher.result()
    assert {t.task_id: t.state for t in brain.store.get_tasks(rec.tree_id)} == {
        f"r{i}": TaskState.DONE for i in range(10)
    }
    assert brain.hot.r.llen(client_key("laptop", CLIENT_OUTBOX)) == 0


def test_a_relay_whose_wake_emptied_the_outbox_waits_again_without_a_round(
    brain_on_redis: Brain, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Results coming one at a time (a busy agent's, two brains racing for them): a poll woken
    for one that took all its outbox held goes back to BRPOP at once. A round first (the
    script, then nothing to pop) was paid per result; ~7 % of a brain's CPU per client result
    in bench/scale_out.py, one brain or two."""
    brain = brain_on_redis
    brain.scheduler.presence.enroll("laptop", "ada")
    connect(brain, "laptop")
    rec = brain.scheduler.submit(tree(reads(2)), session=SessionKind.INTERACTIVE, client_id="laptop")
    relay = Relay(brain.intake, brain.clients)
    monkeypatch.setattr(relay_module, "POP_TIMEOUT_S", 0.05)
    assert relay.poll_once(["laptop"]) is False  # untimed: loads the round's script into Redis
    monkeypatch.setattr(relay_module, "POP_TIMEOUT_S", 60)  # the push wakes it, never a timeout

    def one_result_once_blocked(task_id: str) -> None:
        wait_until(
            lambda: any(c.get("cmd") == "brpop" for c in brain.hot.r.client_list()), what="the relay in BRPOP"
        )
        brain.hot.r.lpush(
            client_key("laptop", CLIENT_OUTBOX), result_message(brain, rec.tree_id, task_id, "laptop")
        )

    for task_id, scripts in (
        ("r0", 1),
        ("r1", 0),
    ):  # the first poll's round finds nothing; the second has none
        pusher = InThread(lambda task_id=task_id: one_result_once_blocked(task_id))
        reset_counts(redis_client)
        assert relay.poll_once(["laptop"]) is True
        wait_until(pusher.done, what="the pusher")
        pusher.result()
        counts = command_counts(redis_client)
        assert counts.get("evalsha", 0) == scripts, counts
        assert counts.get("brpop") == 1
    assert {t.task_id: t.state for t in brain.store.get_tasks(rec.tree_id)} == {
        "r0": TaskState.DONE,
        "r1": TaskState.DONE,
    }
