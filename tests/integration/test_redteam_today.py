"""Today's changes tried by an attacker who owns one workstation (redteam2, 2026-12-07).

Real redis-server, the client's own ACL credential (``enroll``), the brain's own app: the
per-user presence index (``vt:presence:user:<user>``), the brain's one app publishing every
client's calls under ``c:<id>:``, and a flood of calls ended unrun told to Flower as revoked.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from brain.core.models import SessionKind, TaskState, TreeStatus
from brain.runtime import events as events_module
from brain.runtime.enrollment import Credential, enroll, revoke
from brain.runtime.events import ClientEvents
from brain.runtime.relay import Relay
from brain.runtime.service import Brain
from tests.conftest import agent_with_servers, tree, wait_for_tree, wait_until, write_mcp_config
from tests.integration.test_hostile_client import as_client, two_clients
from tests.integration.test_parking import connected
from workers.contracts import (
    CLIENT_HEARTBEAT,
    CLIENT_OUTBOX,
    ToolCall,
    ToolType,
    client_key,
    client_queue,
    key_user_clients,
)

pytestmark = pytest.mark.integration

REFUSED = r"no permissions"
__all__ = ["two_clients"]  # the fixture: victim of user ada, mallory of user eve


def announce(brain: Brain, client_id: str) -> None:
    brain.hot.r.set(client_key(client_id, CLIENT_HEARTBEAT), "s1", ex=60)
    Relay(brain.intake, brain.clients).handle(client_id, connected(client_id))


# --- 1. the per-user index: no client credential reaches it ----------------------------

INDEX_PROBES: list[tuple[str, Callable[[redis.Redis], Any]]] = [
    ("read its own user's index", lambda r: r.smembers(key_user_clients("eve"))),
    ("read another user's index", lambda r: r.smembers(key_user_clients("ada"))),
    ("put itself in another user's index", lambda r: r.sadd(key_user_clients("ada"), "mallory")),
    ("take the victim out of its user's index", lambda r: r.srem(key_user_clients("ada"), "victim")),
    ("delete another user's index", lambda r: r.delete(key_user_clients("ada"))),
    ("make another user's index a string", lambda r: r.set(key_user_clients("ada"), "x")),
    ("rename its way in", lambda r: r.rename(client_key("mallory", "x"), key_user_clients("ada"))),
    (
        "copy its way in",
        lambda r: r.execute_command("COPY", client_key("mallory", "x"), key_user_clients("ada")),
    ),
    (
        "SMOVE out of the index",
        lambda r: r.smove(key_user_clients("ada"), client_key("mallory", "s"), "victim"),
    ),
    (
        "SUNIONSTORE over the index",
        lambda r: r.sunionstore(key_user_clients("ada"), [client_key("mallory", "s")]),
    ),
]


@pytest.mark.parametrize(("what", "probe"), INDEX_PROBES, ids=[p[0] for p in INDEX_PROBES])
def test_a_client_cannot_reach_any_users_index(
    what: str,
    probe: Callable[[redis.Redis], Any],
    brain_on_redis: Brain,
    two_clients: tuple[Credential, Credential],
) -> None:
    announce(brain_on_redis, "victim")
    attacker = as_client(two_clients[1])
    try:
        attacker.sadd(client_key("mallory", "s"), "mallory")  # its own keys work
        attacker.set(client_key("mallory", "x"), "x")
        with pytest.raises(redis.exceptions.ResponseError, match=REFUSED):
            probe(attacker)
    finally:
        attacker.close()
    assert brain_on_redis.hot.r.smembers(key_user_clients("ada")) == {b"victim"}


def test_another_users_tree_never_routes_to_a_hostile_client_and_still_sees_its_own(
    brain_on_redis: Brain, two_clients: tuple[Credential, Credential]
) -> None:
    brain = brain_on_redis
    announce(brain, "victim")
    announce(brain, "mallory")  # same tools as the victim's, connected later
    presence = brain.scheduler.presence
    assert set(presence.sessions_for("ada")) == {"victim"}
    assert set(presence.sessions_for("eve")) == {"mallory"}
    # Whatever mallory writes in its own keys, ada's tree goes to ada's client.
    attacker = as_client(two_clients[1])
    attacker.sadd(client_key("mallory", "presence:user:ada"), "mallory")
    attacker.close()
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "t",
                "tasks": [
                    {"id": f"r{i}", "tool": "read_local_file", "args": {"path": "x"}} for i in range(5)
                ],
            }
        ),
        session=SessionKind.INTERACTIVE,
        user="ada",
    )
    tasks = [brain.store.get_task(rec.tree_id, f"r{i}") for i in range(5)]
    assert {t.client_id for t in tasks} == {"victim"}
    assert all(t.state is TaskState.QUEUED_CLIENT for t in tasks)
    assert brain.hot.r.llen(client_key("mallory", client_queue("mallory"))) == 0


# --- 2. the brain's one app: a client's calls land under its own prefix only ----------


@pytest.mark.parametrize("client_id", ["mallory", "a.b-c", "client.victim", "client.", "server"])
def test_the_brains_publish_lands_under_the_clients_prefix_only(
    client_id: str, brain_on_redis: Brain, redis_client: redis.Redis
) -> None:
    publisher = brain_on_redis.scheduler.publisher
    assert publisher.app_for(client_id) is publisher.app  # the change under test: one app
    before = set(redis_client.keys("*"))
    call = ToolCall(
        run_id=f"t.r.1.{client_id}", tree_id="t", task_id="r", tool="read_local_file", tool_type=ToolType.NATIVE,
        args={"path": "x"}, timeout_s=30, max_result_bytes=1024, client_id=client_id,
    )  # fmt: skip
    publisher.send(call)
    new = {k.decode() for k in set(redis_client.keys("*")) - before}
    queue = client_key(client_id, client_queue(client_id))
    assert queue in new and redis_client.llen(queue) == 1
    assert new == {queue}, new  # nothing else: no unprefixed queue, binding or ack key


@pytest.mark.parametrize("client_id", ["a:b", "a*", "", "x" * 65, "_kombu.binding.x", "../x"])
def test_an_invalid_client_id_is_never_published_to(client_id: str, brain_on_redis: Brain) -> None:
    with pytest.raises(ValueError):
        call = ToolCall(
            run_id="t.r.1.x", tree_id="t", task_id="r", tool="read_local_file", tool_type=ToolType.NATIVE,
            args={"path": "x"}, timeout_s=30, max_result_bytes=1024, client_id=client_id,
        )  # fmt: skip
        brain_on_redis.scheduler.publisher.send(call)


# --- 3. a flood of one client's calls ended unrun, told to Flower -----------------------


def _events_in(data: bytes) -> int:
    envelope = json.loads(data)
    body = envelope["body"]
    if envelope.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    decoded = json.loads(body)
    return len(decoded) if isinstance(decoded, list) else 1


def test_a_flood_of_one_clients_revoked_calls_all_reach_flower(
    brain_on_redis: Brain, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree with 50,000 calls queued for its one client, cancelled: each is told to Flower as
    revoked through ``ClientEvents`` (brain.runtime.revoked). The sender sends what gathered
    while it slept as one message per client; a brain busy for a second while the cancel went
    on (here: a longer gather) put all 50,000 in one PUBLISH of ~12 MB, past Redis's
    ``proto-max-bulk-len`` (8 MB): the connection was reset and every one of them was lost,
    and Flower kept the calls sent for ever, which the change was meant to end."""
    n = 50_000
    monkeypatch.setattr(events_module, "GATHER_S", 2.0)  # a brain slower than this one
    counts: list[int] = []
    pubsub = redis_client.pubsub()
    pubsub.psubscribe("*celeryev*")
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            msg = pubsub.get_message(timeout=0.5)
            if msg and msg["type"] == "pmessage":
                counts.append(_events_in(msg["data"]))

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    events = ClientEvents(brain_on_redis.app)
    try:
        for i in range(n):
            events.task_revoked(
                "mallory", f"night.t{i:06d}.1.0123456789abcdef", terminated=False, signum=None, expired=False
            )
        wait_until(lambda: sum(counts) >= n, timeout=120, what=f"{n} revoked events (got {sum(counts)})")
    finally:
        stop.set()
        thread.join()
        events.close()
        pubsub.close()
    assert sum(counts) == n


# --- 4. the whole stack: a real agent of ada's, a hostile workstation of eve's ---------


def test_a_hostile_workstation_of_another_user_never_gets_a_real_agents_calls(
    stack_factory: Callable[..., Any], brain_factory: Callable[..., Brain], tmp_path: Path
) -> None:
    """The embedded stack's real agent "laptop" (user ada, its own ACL credential) and a
    workstation of eve's that announces the same tools and writes its own keys as it likes:
    ada's tree runs on the laptop, none of it reaches eve's queue, and eve's index is eve's."""
    stack = stack_factory(
        services=("brain", "server-pool", "client-agent"),
        agent_config=agent_with_servers(tmp_path, {}),
        mcp_config=write_mcp_config(tmp_path / "server-mcp.json", {}),
    )
    assert stack.wait_connected("laptop", 120)
    brain = brain_factory(stack)
    (tmp_path / "sandbox" / "x.txt").write_text("ada's")
    cred = enroll(brain.scheduler.presence, "mallory", "eve", stack.redis.address_url)
    attacker = as_client(cred)
    try:
        attacker.set(client_key("mallory", CLIENT_HEARTBEAT), "s1", ex=120)
        attacker.lpush(client_key("mallory", CLIENT_OUTBOX), connected("mallory"))
        wait_until(
            lambda: "mallory" in brain.scheduler.presence.sessions(), timeout=120, what="mallory announced"
        )
        with pytest.raises(redis.exceptions.ResponseError, match=REFUSED):
            attacker.sadd(key_user_clients("ada"), "mallory")
        spec = {
            "id": "t",
            "tasks": [
                {"id": f"r{i}", "tool": "read_local_file", "args": {"path": "x.txt"}} for i in range(4)
            ],
        }
        rec = brain.scheduler.submit(tree(spec), session=SessionKind.INTERACTIVE, user="ada")
        done = wait_for_tree(brain, rec.tree_id)
        assert done.status is TreeStatus.DONE
        tasks = [brain.store.get_task(rec.tree_id, f"r{i}") for i in range(4)]
        assert {t.client_id for t in tasks} == {"laptop"} and {t.result["content"] for t in tasks} == {
            "ada's"
        }
        assert attacker.llen(client_key("mallory", client_queue("mallory"))) == 0
        assert brain.hot.r.smembers(key_user_clients("eve")) == {b"mallory"}
        assert brain.hot.r.smembers(key_user_clients("ada")) == {b"laptop"}
    finally:
        attacker.close()
        revoke(brain.clients, "mallory")
