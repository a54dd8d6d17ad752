"""Starting a run (``workers.tasks.begin_run``) is one MULTI/EXEC, one round trip, no WATCH
and no script: as a client agent's own Redis user, on a real redis-server.

A cancelled run never starts; every delivery gets its own number, even two at once; what
``then`` queues (the agent's "started" message) goes in the same transaction. The count and
the mark are written whatever the cancel check finds: nothing reads a cancelled run's count,
and readers trust a mark only for the run the store has in flight. kombu's mutex is released
without a script too (``workers.redis_lock``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.client import Pipeline
from redis.exceptions import LockNotOwnedError

from brain.runtime.enrollment import enroll, revoke
from brain.runtime.service import Brain
from brain.stack.redis_server import RedisServer
from workers.app import make_app
from workers.contracts import (
    ToolCall,
    ToolType,
    client_key,
    client_keyprefix,
    key_cancelled,
    key_deliveries,
    key_tree_running,
)
from workers.sent_ahead import SentAhead
from workers.tasks import HotState, begin_commands, begin_run, begun
from workers.transport import GuardedChannel

CLIENT = "laptop"


def call(run: str = "t-k-1", max_deliveries: int = 3) -> ToolCall:
    return ToolCall(
        run_id=run, tree_id="t", task_id="k", tool="read_local_file", tool_type=ToolType.BUILT_IN,
        timeout_s=5, max_result_bytes=1000, max_deliveries=max_deliveries, client_id=CLIENT,
    )  # fmt: skip


@pytest.fixture
def agent_url(brain_on_redis: Brain, redis_server: RedisServer) -> Iterator[str]:
    """The broker URL of an enrolled client: its own ACL user, no script, its keys only."""
    credential = enroll(brain_on_redis.scheduler.presence, CLIENT, "ada", redis_server.address_url)
    yield credential.broker_url
    revoke(brain_on_redis.clients, CLIENT)


@pytest.fixture
def hot(agent_url: str) -> Iterator[HotState]:
    app = make_app(agent_url, keyprefix=client_keyprefix(CLIENT))
    state = HotState(app)
    yield state
    state.client.close()
    app.close()


def deliveries(r: redis.Redis, run: str) -> bytes | None:
    return r.get(client_key(CLIENT, key_deliveries(run)))


def test_each_delivery_is_counted_and_marks_the_run_running(hot: HotState, redis_client: redis.Redis) -> None:
    assert hot.begin_run(call(), "w1", 10.0) == 1
    assert hot.begin_run(call(), "w2", 11.0) == 2
    mark = json.loads(redis_client.hget(client_key(CLIENT, key_tree_running("t")), "k"))
    assert mark == {"run_id": "t-k-1", "worker": "w2", "started_at": 11.0}
    for key in (key_deliveries("t-k-1"), key_tree_running("t")):
        assert 0 < redis_client.ttl(client_key(CLIENT, key)) <= 7 * 24 * 3600


def test_a_cancelled_run_does_not_start(hot: HotState, redis_client: redis.Redis) -> None:
    redis_client.sadd(client_key(CLIENT, key_cancelled()), "t-k-1")
    assert hot.begin_run(call(), "w", 1.0) is None
    assert hot.begin_run(call(), "w", 2.0) is None  # nor on any later delivery


def test_over_the_delivery_limit_the_run_is_still_counted(hot: HotState) -> None:
    # run_tool fails a run whose number is over max_deliveries as a PoisonTask.
    assert [hot.begin_run(call(max_deliveries=1), "w", 1.0) for _ in range(3)] == [1, 2, 3]


def test_deliveries_started_at_once_each_get_their_own_number(
    agent_url: str, redis_client: redis.Redis
) -> None:
    app = make_app(agent_url, keyprefix=client_keyprefix(CLIENT))
    numbers: list[int | None] = []
    barrier = threading.Barrier(8)

    def start() -> None:
        state = HotState(app)  # a connection of its own, as each worker process has
        barrier.wait()
        numbers.append(state.begin_run(call(max_deliveries=100), threading.current_thread().name, 1.0))
        state.client.close()

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    app.close()
    assert sorted(n for n in numbers if n is not None) == list(range(1, 9))
    assert deliveries(redis_client, "t-k-1") == b"8"


def test_what_then_queues_is_in_the_same_transaction_in_one_round_trip(
    hot: HotState, agent_url: str, redis_client: redis.Redis
) -> None:
    outbox = client_key(CLIENT, "outbox")
    sent: list[int] = []

    class Counting(redis.Redis):
        def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
            pipe = super().pipeline(transaction, shard_hint)
            execute = pipe.execute

            def counted(raise_on_error: bool = True) -> list[Any]:
                sent.append(len(pipe.command_stack))
                return execute(raise_on_error)

            pipe.execute = counted  # type: ignore[method-assign]
            return pipe

    client = Counting.from_url(agent_url)
    try:
        got = begin_run(
            client, client_keyprefix(CLIENT), call(), "w", 1.0, then=lambda p: p.lpush(outbox, "started")
        )
        assert got == 1
        assert sent == [6]  # one execute: the check, the count, the mark, their TTLs, and the push
        assert redis_client.lrange(outbox, 0, -1) == [b"started"]
    finally:
        client.close()


def test_kombus_mutex_is_taken_and_released_by_a_client_user_without_a_script(
    agent_url: str, redis_client: redis.Redis
) -> None:
    app = make_app(agent_url, keyprefix=client_keyprefix(CLIENT))
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        assert isinstance(channel, GuardedChannel)
        client = channel.client
        lock = client.lock("unacked_mutex", timeout=30)
        assert lock.acquire(blocking=False)
        assert redis_client.exists(client_key(CLIENT, "unacked_mutex"))
        lock.release()
        assert not redis_client.exists(client_key(CLIENT, "unacked_mutex"))
        # a lock that expired and was taken by another owner is not released by the first one
        first = client.lock("unacked_mutex", timeout=30)
        assert first.acquire(blocking=False)
        redis_client.set(client_key(CLIENT, "unacked_mutex"), b"someone else")
        with pytest.raises(LockNotOwnedError):
            first.release()
        assert redis_client.get(client_key(CLIENT, "unacked_mutex")) == b"someone else"
    app.close()


def test_the_pools_fallback_start_works_with_the_pools_own_user(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """The server pool starts a run against Redis when the store cannot be asked: vt-pool
    reaches the cancel set, the counters and the marks it needs, unprefixed."""
    app = make_app(redis_server.url_for("vt-pool"))
    state = HotState(app)
    try:
        server_call = call().model_copy(update={"client_id": None})
        assert state.begin_run(server_call, "server@x", 1.0) == 1
        assert redis_client.get(key_deliveries("t-k-1")) == b"1"
        redis_client.sadd(key_cancelled(), "t-k-2")
        assert state.begin_run(call("t-k-2").model_copy(update={"client_id": None}), "server@x", 1.0) is None
    finally:
        state.client.close()
        app.close()


def test_the_begin_sent_ahead_counts_checks_and_marks_as_begin_run_does(
    hot: HotState, redis_client: redis.Redis
) -> None:
    """``begin_commands`` through ``workers.sent_ahead`` (how a client agent begins a first
    delivery): the same transaction, as the client's own user; its future holds the answer."""
    ahead = SentAhead("test-begin")
    pool = hot.client.connection_pool
    try:
        answers = [
            ahead.send(pool, begin_commands(hot.prefix, call(), f"w{i}", 1.0 + i), begun) for i in range(2)
        ]
        assert sorted(a.result(10) or 0 for a in answers) == [1, 2]
        mark = json.loads(redis_client.hget(client_key(CLIENT, key_tree_running("t")), "k"))
        assert mark["run_id"] == "t-k-1"
        redis_client.sadd(client_key(CLIENT, key_cancelled()), "t-k-1")
        assert ahead.send(pool, begin_commands(hot.prefix, call(), "w", 3.0), begun).result(10) is None
        assert deliveries(redis_client, "t-k-1") == b"3"
    finally:
        ahead.close()


def test_a_command_redis_refuses_fails_the_future_and_the_next_transaction_still_works(
    hot: HotState, redis_client: redis.Redis
) -> None:
    ahead = SentAhead("test-begin")
    pool = hot.client.connection_pool
    try:
        redis_client.set(client_key(CLIENT, key_tree_running("t")), "not a hash")
        refused = ahead.send(pool, begin_commands(hot.prefix, call(), "w", 1.0), begun)
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            refused.result(10)
        # A command the client's user may not run at all is refused when queued.
        with pytest.raises(redis.ResponseError):
            ahead.send(pool, [("GET", "someone-elses-key")], list).result(10)
        redis_client.delete(client_key(CLIENT, key_tree_running("t")))
        assert ahead.send(pool, begin_commands(hot.prefix, call(), "w", 2.0), begun).result(10) == 2
    finally:
        ahead.close()
