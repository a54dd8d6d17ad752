"""A hostile workstation, armed with nothing but its own enrolled credential (issue 7).

Every probe is sent to a real redis-server as that client's ACL user and must come back
NOPERM (or be harmless where the brain decides); the other client's work finishes
untouched. The threat model this proves is in docs/security.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from brain.core.models import SessionKind, TaskState
from brain.runtime.enrollment import AGENT_URL_VARIABLE, Credential, enroll, revoke
from brain.runtime.relay import Relay
from brain.runtime.service import Brain
from brain.stack.redis_server import RedisServer
from tests.conftest import EXAMPLES, result_for, tree, wait_until
from tests.integration.test_parking import READ, connected
from workers.contracts import (
    BRAIN_QUEUE,
    CLIENT_ACK,
    CLIENT_HEARTBEAT,
    CLIENT_OUTBOX,
    SERVER_QUEUE,
    ClientToolResult,
    ToolDescriptor,
    ToolType,
    client_key,
    client_queue,
    key_pool_workers,
    key_presence,
    pool_queue,
    queue_keys,
)
from workers.urls import without_credentials

pytestmark = pytest.mark.integration

VICTIM_QUEUE = client_key("victim", client_queue("victim"))
VICTIM_OUTBOX = client_key("victim", CLIENT_OUTBOX)
LUA_GET = "return redis.call('get', KEYS[1])"
LUA_PUSH_SERVER = "return redis.call('lpush', 'server', 'x')"

# (what the attacker tries, the call). Each must be refused: NOPERM.
REFUSED = r"no permissions"
PROBES: list[tuple[str, Callable[[redis.Redis], Any]]] = [
    ("read another client's queue", lambda r: r.lrange(VICTIM_QUEUE, 0, -1)),
    ("pop another client's queue", lambda r: r.rpop(VICTIM_QUEUE)),
    ("push onto another client's queue", lambda r: r.lpush(VICTIM_QUEUE, "{}")),
    ("write into another client's outbox", lambda r: r.lpush(VICTIM_OUTBOX, "{}")),
    ("read another client's in-flight messages", lambda r: r.hgetall(client_key("victim", "unacked"))),
    ("push a run_tool onto the server queue", lambda r: r.lpush(SERVER_QUEUE, "{}")),
    ("push a run_tool onto a named pool's queue", lambda r: r.lpush(pool_queue("gpu"), "{}")),
    ("pop a named pool's queue", lambda r: r.rpop(pool_queue("gpu"))),
    ("pop a pool queue's list of normal calls", lambda r: r.rpop(queue_keys(SERVER_QUEUE)[1])),
    ("push onto a pool queue's list of low calls", lambda r: r.lpush(queue_keys(pool_queue("gpu"))[2], "{}")),
    ("pretend to be a pool worker", lambda r: r.zadd(key_pool_workers("gpu"), {"server-gpu@x": 1e12})),
    ("push a forged record_result onto the brain queue", lambda r: r.lpush(BRAIN_QUEUE, "{}")),
    ("read the server pool's in-flight messages", lambda r: r.hgetall("unacked")),
    ("enroll itself under another user", lambda r: r.hset("vt:clients", "mallory", "{}")),
    ("write presence", lambda r: r.hset(key_presence(), "victim", "{}")),
    ("list every key", lambda r: r.keys("*")),
    ("scan every key", lambda r: r.scan(0)),
    ("read the server config", lambda r: r.config_get("*")),
    ("change the server config", lambda r: r.config_set("appendonly", "no")),
    ("list ACL users", lambda r: r.acl_list()),
    ("grant itself more", lambda r: r.acl_setuser("vtc-mallory", enabled=True, keys=["*"])),
    ("list connections", lambda r: r.client_list()),
    ("kill connections", lambda r: r.execute_command("CLIENT", "KILL", "TYPE", "normal")),
    ("watch every command", lambda r: r.execute_command("MONITOR")),
    ("debug", lambda r: r.execute_command("DEBUG", "SLEEP", "0")),
    ("EVAL on another key", lambda r: r.eval(LUA_GET, 1, VICTIM_OUTBOX)),
    ("EVAL reaching outside its keys", lambda r: r.eval(LUA_PUSH_SERVER, 1, client_key("mallory", "x"))),
    ("publish a task event", lambda r: r.publish("celeryev", "{}")),
    ("flush everything", lambda r: r.flushall()),
    ("flush the database", lambda r: r.flushdb()),
    ("save a snapshot over the data", lambda r: r.execute_command("SAVE")),
]


@pytest.fixture
def two_clients(brain_on_redis: Brain, redis_server: RedisServer) -> Iterator[tuple[Credential, Credential]]:
    presence = brain_on_redis.scheduler.presence
    victim = enroll(presence, "victim", "ada", redis_server.address_url)
    mallory = enroll(presence, "mallory", "eve", redis_server.address_url)
    yield victim, mallory
    for cid in ("victim", "mallory"):
        revoke(brain_on_redis.clients, cid)


def as_client(credential: Credential) -> redis.Redis:
    return redis.Redis.from_url(credential.broker_url, socket_timeout=5)


def test_enroll_issues_a_url_with_the_clients_own_user_and_no_admin_secret(
    two_clients: tuple[Credential, Credential], redis_server: RedisServer
) -> None:
    victim, _ = two_clients
    assert victim.env_line.startswith(f"{AGENT_URL_VARIABLE}=redis://vtc-victim:")
    assert redis_server.admin_secret not in victim.broker_url
    assert without_credentials(victim.broker_url) == redis_server.address_url
    r = as_client(victim)
    assert r.ping()
    # its own keys: the agent's whole protocol works
    r.lpush(VICTIM_OUTBOX, "hello")
    r.set(client_key("victim", CLIENT_HEARTBEAT), "s1", px=1000)
    assert r.get(client_key("victim", CLIENT_HEARTBEAT)) == b"s1"
    # a transaction on its own keys too (workers.tasks.HotState.begin_run); no script, even there
    pipe = r.pipeline(transaction=True)
    pipe.incrby(client_key("victim", "n"), 1).expire(client_key("victim", "n"), 10)
    assert pipe.execute() == [1, True]
    with pytest.raises(redis.exceptions.NoPermissionError):
        r.eval(LUA_GET, 1, client_key("victim", CLIENT_HEARTBEAT))
    r.close()


@pytest.mark.parametrize(("what", "probe"), PROBES, ids=[p[0] for p in PROBES])
def test_a_client_is_refused(
    what: str, probe: Callable[[redis.Redis], Any], two_clients: tuple[Credential, Credential]
) -> None:
    _, mallory = two_clients
    r = as_client(mallory)
    try:
        with pytest.raises(redis.exceptions.ResponseError, match=REFUSED):
            probe(r)
    finally:
        r.close()


@pytest.mark.parametrize("kind", ["subscribe", "psubscribe"])
def test_a_client_cannot_listen_to_any_channel(kind: str, two_clients: tuple[Credential, Credential]) -> None:
    _, mallory = two_clients
    r = as_client(mallory)
    pubsub = r.pubsub()
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            getattr(pubsub, kind)("*" if kind == "psubscribe" else "celeryev")
            pubsub.get_message(timeout=60)  # the refusal is the subscription's reply
    finally:
        pubsub.close()
        r.close()


def test_no_credentials_or_a_wrong_password_gets_nothing(redis_server: RedisServer) -> None:
    anonymous = redis.Redis.from_url(redis_server.address_url)
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.get("anything")
    anonymous.close()
    wrong = redis.Redis.from_url(redis_server.address_url, username="vtc-victim", password="guess")
    with pytest.raises(redis.exceptions.AuthenticationError):
        wrong.ping()
    wrong.close()


def test_a_revoked_credential_is_dropped_at_once_and_never_connects_again(
    brain_on_redis: Brain, redis_server: RedisServer
) -> None:
    cred = enroll(brain_on_redis.scheduler.presence, "stolen", "ada", redis_server.address_url)
    live = as_client(cred)
    assert live.ping()
    assert revoke(brain_on_redis.clients, "stolen") is True
    with pytest.raises((redis.exceptions.ConnectionError, redis.exceptions.AuthenticationError)):
        live.ping()  # its open connection was closed by ACL DELUSER; a reconnect cannot log in
    live.close()
    with pytest.raises(redis.exceptions.AuthenticationError):
        as_client(cred).ping()
    assert brain_on_redis.store.get_enrollment("stolen") is None


def test_reenrolling_replaces_the_secret(brain_on_redis: Brain, redis_server: RedisServer) -> None:
    presence = brain_on_redis.scheduler.presence
    old = enroll(presence, "laptop2", "ada", redis_server.address_url)
    new = enroll(presence, "laptop2", "ada", redis_server.address_url)
    with pytest.raises(redis.exceptions.AuthenticationError):
        as_client(old).ping()
    assert as_client(new).ping()
    revoke(brain_on_redis.clients, "laptop2")


def test_enrollments_survive_a_redis_flush_and_the_brain_restores_the_acl_users(
    brain_on_redis: Brain, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    cred = enroll(brain_on_redis.scheduler.presence, "survivor", "ada", redis_server.address_url)
    redis_client.flushall()
    redis_client.execute_command("ACL", "DELUSER", "vtc-survivor")  # as a restart without an ACL file would
    assert "survivor" in brain_on_redis.scheduler.presence.enrolled()
    brain_on_redis.sync_client_users()
    assert as_client(cred).ping()
    revoke(brain_on_redis.clients, "survivor")
    brain_on_redis.sync_client_users()
    with pytest.raises(redis.exceptions.AuthenticationError):
        as_client(cred).ping()


# --- what the brain decides: a client's own outbox is all it can write, and it is not trusted


def test_a_forged_result_for_another_clients_task_through_its_own_outbox_is_refused(
    brain_on_redis: Brain, two_clients: tuple[Credential, Credential]
) -> None:
    brain = brain_on_redis
    victim, mallory = two_clients
    relay = Relay(brain.intake, brain.clients)
    brain.hot.r.set(client_key("victim", CLIENT_HEARTBEAT), "s1", ex=60)
    relay.handle("victim", connected("victim"))
    rec = brain.scheduler.submit(
        tree({"id": "t", "tasks": [{"id": "r0", "tool": "read_local_file", "args": {"path": "diary.txt"}}]}),
        session=SessionKind.INTERACTIVE,
        client_id="victim",
    )
    attacker = as_client(mallory)
    for claimed in ("victim", "mallory"):
        forged = result_for(brain, rec.tree_id, "r0", claimed)
        attacker.lpush(
            client_key("mallory", CLIENT_OUTBOX),
            ClientToolResult(client_id=claimed, result=forged).model_dump_json(),
        )
    attacker.close()
    while relay.poll_once(["mallory"]):
        pass
    assert brain.store.get_task(rec.tree_id, "r0").state is TaskState.QUEUED_CLIENT
    # the victim's own answer still counts
    honest = result_for(brain, rec.tree_id, "r0", "victim", value="dear diary")
    as_client(victim).lpush(
        VICTIM_OUTBOX, ClientToolResult(client_id="victim", result=honest).model_dump_json()
    )
    assert relay.poll_once(["victim"])
    done = brain.store.get_task(rec.tree_id, "r0")
    assert done.state is TaskState.DONE and done.result == "dear diary"


def test_announcing_as_another_client_is_refused_and_takes_none_of_its_work(
    brain_on_redis: Brain, two_clients: tuple[Credential, Credential]
) -> None:
    brain = brain_on_redis
    _, mallory = two_clients
    attacker = as_client(mallory)
    attacker.lpush(client_key("mallory", CLIENT_OUTBOX), connected("victim"))
    attacker.close()
    relay = Relay(brain.intake, brain.clients)
    assert relay.poll_once(["mallory"])
    assert "victim" not in brain.scheduler.presence.sessions()
    ack = brain.hot.r.get(client_key("mallory", CLIENT_ACK))
    assert ack is not None and b"came through 'mallory''s outbox" in ack


def test_a_client_tool_that_shadows_a_server_tool_never_receives_its_calls(
    brain_on_redis: Brain, two_clients: tuple[Credential, Credential]
) -> None:
    brain = brain_on_redis
    shadow = ToolDescriptor(name="http_get", type=ToolType.NATIVE)
    brain.hot.r.set(client_key("mallory", CLIENT_HEARTBEAT), "s1", ex=60)
    Relay(brain.intake, brain.clients).handle("mallory", connected("mallory", tools=(READ, shadow)))
    assert "mallory" in brain.scheduler.presence.sessions()
    rec = brain.scheduler.submit(
        tree({"id": "t", "tasks": [{"id": "r0", "tool": "echo", "args": {"value": 1}}]}),
        session=SessionKind.INTERACTIVE,
        client_id="mallory",
        user="eve",
    )
    task = brain.store.get_task(rec.tree_id, "r0")
    assert task.state is TaskState.QUEUED_SERVER
    shadowed = brain.scheduler.submit(
        tree({"id": "h", "tasks": [{"id": "r0", "tool": "http_get", "args": {"url": "http://x"}}]}),
        session=SessionKind.INTERACTIVE,
        client_id="mallory",
        user="eve",
    )
    assert brain.store.get_task(shadowed.tree_id, "r0").state is TaskState.QUEUED_SERVER
    assert brain.hot.r.llen(client_key("mallory", client_queue("mallory"))) == 0


def test_a_revoked_clients_unstarted_calls_come_back_as_for_a_disconnect(
    brain_on_redis: Brain, redis_server: RedisServer
) -> None:
    brain = brain_on_redis
    enroll(brain.scheduler.presence, "lost-laptop", "ada", redis_server.address_url)
    brain.hot.r.set(client_key("lost-laptop", CLIENT_HEARTBEAT), "s1", ex=60)
    Relay(brain.intake, brain.clients).handle("lost-laptop", connected("lost-laptop"))
    rec = brain.scheduler.submit(
        tree({"id": "t", "tasks": [{"id": "r0", "tool": "read_local_file", "args": {"path": "a"}}]}),
        session=SessionKind.AUTONOMOUS,
        user="ada",
    )
    assert brain.store.get_task(rec.tree_id, "r0").state is TaskState.QUEUED_CLIENT
    revoke(brain.clients, "lost-laptop")
    wait_until(
        lambda: brain.store.get_task(rec.tree_id, "r0").state is TaskState.PENDING_CLIENT,
        timeout=60,
        what="the revoked client's call to be taken back",
    )
    assert brain.hot.r.llen(client_key("lost-laptop", client_queue("lost-laptop"))) == 0
    assert "lost-laptop" not in brain.scheduler.presence.sessions()
    assert time.time() > 0


def test_the_embedded_stacks_agent_runs_on_its_own_credential_without_the_admin_url(
    stack_factory: Callable[..., Any],
) -> None:
    stack = stack_factory(agent_config=EXAMPLES / "agent" / "agent.toml")
    agent = stack.service("client-agent")
    environ = dict(
        item.split("=", 1)
        for item in Path(f"/proc/{agent.process.pid}/environ").read_text().split("\0")
        if "=" in item
    )
    assert "VANCETOPE_REDIS_URL" not in environ
    assert environ["VANCETOPE_AGENT_BROKER_URL"].startswith("redis://vtc-laptop:")
    assert stack.redis.admin_secret not in environ["VANCETOPE_AGENT_BROKER_URL"]
    admin = redis.Redis.from_url(stack.redis_url)
    users = {c["user"] for c in admin.client_list()}
    admin.close()
    assert "vtc-laptop" in users


# --- the stack's own users: each only what it needs (brain.hot.acl.COMPONENT_RULES) ---------

COMPONENT_REFUSALS: list[tuple[str, str, Callable[[redis.Redis], Any]]] = [
    ("vt-pool", "read a client's queue", lambda r: r.lrange(VICTIM_QUEUE, 0, -1)),
    ("vt-pool", "write a client's outbox", lambda r: r.lpush(VICTIM_OUTBOX, "{}")),
    ("vt-pool", "create a Redis user", lambda r: r.acl_setuser("x", enabled=True)),
    ("vt-pool", "flush everything", lambda r: r.flushall()),
    ("vt-flower", "read a client's queue", lambda r: r.lrange(VICTIM_QUEUE, 0, -1)),
    ("vt-flower", "write presence", lambda r: r.hset(key_presence(), "x", "{}")),
    ("vt-flower", "create a Redis user", lambda r: r.acl_setuser("x", enabled=True)),
    ("vt-brain", "flush everything", lambda r: r.flushall()),
    ("vt-brain", "change the server config", lambda r: r.config_set("appendonly", "no")),
    ("vt-brain", "list every key", lambda r: r.keys("*")),
    ("vt-brain", "watch every command", lambda r: r.execute_command("MONITOR")),
    ("vt-gateway", "create a Redis user", lambda r: r.acl_setuser("x", enabled=True)),
    ("vt-gateway", "delete a client's Redis user", lambda r: r.acl_deluser("vtc-laptop")),
    ("vt-gateway", "flush everything", lambda r: r.flushall()),
    ("vt-gateway", "list every key", lambda r: r.keys("*")),
]


@pytest.mark.parametrize(
    ("user", "what", "probe"), COMPONENT_REFUSALS, ids=[f"{u}: {w}" for u, w, _ in COMPONENT_REFUSALS]
)
def test_a_stack_component_is_refused_what_it_does_not_need(
    user: str, what: str, probe: Callable[[redis.Redis], Any], redis_server: RedisServer
) -> None:
    r = redis.Redis.from_url(redis_server.url_for(user))
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            probe(r)
    finally:
        r.close()


def test_the_brain_may_manage_client_users_and_the_pool_its_queues(redis_server: RedisServer) -> None:
    brain = redis.Redis.from_url(redis_server.url_for("vt-brain"))
    pool = redis.Redis.from_url(redis_server.url_for("vt-pool"))
    try:
        brain.execute_command("ACL", "SETUSER", "vtc-probe", "reset", "off")
        assert brain.execute_command("ACL", "DELUSER", "vtc-probe") == 1
        assert brain.lpush(VICTIM_QUEUE, "x") and brain.delete(VICTIM_QUEUE)
        assert pool.lpush(SERVER_QUEUE + "-probe", "x") == 1 and pool.delete(SERVER_QUEUE + "-probe")
        # A named pool's queue and presence are the pool user's too (vancetope worker --pool NAME).
        assert pool.lpush(pool_queue("gpu"), "x") == 1 and pool.rpop(pool_queue("gpu")) == b"x"
        assert pool.zadd(key_pool_workers("gpu"), {"probe": 1.0}) == 1 and pool.delete(
            key_pool_workers("gpu")
        )
    finally:
        brain.close()
        pool.close()
