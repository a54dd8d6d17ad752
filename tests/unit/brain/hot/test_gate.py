"""The admission gate's script on a real redis-server (brain.hot.gate, brain/hot/lua/gate.lua):
what it admits, in which order, what it holds back and why, what a release frees. Time is
Redis's own; nothing here asserts how fast anything ran."""

from __future__ import annotations

import json

import pytest
import redis

from brain.core.fairshare import AppliedLimit, lane_id, user_limit
from brain.hot.gate import INBOX_PREFIX, Gate, Lane, Waiting
from workers.contracts import key_cancelled, key_gate_fresh, key_gate_lanes, key_gate_pause, pool_queue
from workers.throttle import MAX_PAUSE_S


def lane(user: str, *limits: AppliedLimit, pool: str | None = None) -> Lane:
    return Lane(lane_id(pool, user, limits), pool, user, limits)


def message(run: str) -> str:
    return json.dumps({"headers": {"id": run, "task": "vancetope.run_tool"}, "body": ""})


def put(r: redis.Redis, gate: Gate, at: Lane, *runs: str) -> None:
    """Runs put at the gate as a publisher does: recorded first, then kombu's LPUSH of each into
    its pool's inbox (the script moves it to its lane's wait list)."""
    gate.enqueue([Waiting(run, at, 60_000) for run in runs])
    for run in runs:
        r.lpush(INBOX_PREFIX + at.queue, message(run))


def queued(r: redis.Redis, pool: str | None = None) -> list[str]:
    """Run ids on the pool queue, in the order workers take them (kombu pops the tail)."""
    return [json.loads(raw)["headers"]["id"] for raw in reversed(r.lrange(pool_queue(pool), 0, -1))]


@pytest.fixture
def gate(redis_client: redis.Redis) -> Gate:
    return Gate(redis_client)


CAP2 = AppliedLimit("tool", "x", None, 2)
RATE1 = AppliedLimit("tool", "slow", "1/s", None)


def test_a_cap_admits_up_to_it_in_order_and_a_release_admits_the_next(
    redis_client: redis.Redis, gate: Gate
) -> None:
    a = lane("ada", CAP2)
    put(redis_client, gate, a, "r1", "r2", "r3")
    assert gate.admit().count == 2
    assert queued(redis_client) == ["r1", "r2"]
    assert gate.throttled(["r1", "r3"]) == {"r3": "max_concurrency 2 of tool x"}
    assert gate.admit().count == 0  # nothing freed
    assert gate.admit(release=["r1"]).count == 1
    assert queued(redis_client) == ["r1", "r2", "r3"]
    assert gate.throttled(["r3"]) == {}


def test_a_rate_limit_spaces_calls_on_redis_time(redis_client: redis.Redis, gate: Gate) -> None:
    s = lane("ada", RATE1)
    put(redis_client, gate, s, "r1", "r2")
    admitted = gate.admit()
    assert admitted.count == 1 and admitted.wait_s is not None
    # The next token is one interval (1 s) later, less the 50 ms a call may go early.
    assert 0.8 < admitted.wait_s <= 0.95
    assert gate.throttled(["r2"]) == {"r2": "rate_limit 1/s of tool slow"}


def test_a_cancelled_run_is_dropped_without_spending_budget(redis_client: redis.Redis, gate: Gate) -> None:
    s = lane("ada", RATE1)
    put(redis_client, gate, s, "gone", "r2")
    redis_client.sadd(key_cancelled(), "gone")
    assert gate.admit().count == 1
    assert queued(redis_client) == ["r2"]
    assert gate.throttled(["gone"]) == {}


def test_lanes_sharing_a_cap_take_turns(redis_client: redis.Redis, gate: Gate) -> None:
    one = AppliedLimit("server", "jira", None, 1)
    ada, bob = lane("ada", one), lane("bob", one)
    put(redis_client, gate, ada, "a1", "a2", "a3")
    put(redis_client, gate, bob, "b1")
    order: list[str] = []
    for _ in range(4):
        gate.admit(release=order[-1:])
        order = queued(redis_client)
    # bob's one call does not wait behind all of ada's
    assert order.index("b1") <= 1, order


def test_a_slot_whose_run_never_gives_it_back_is_freed_by_its_lease(
    redis_client: redis.Redis, gate: Gate
) -> None:
    a = lane("ada", AppliedLimit("tool", "x", None, 1))
    gate.enqueue([Waiting("r1", a, 1), Waiting("r2", a, 60_000)])  # r1: a 1 ms lease
    for run in ("r1", "r2"):
        redis_client.lpush(a.wait_key, json.dumps({"headers": {"id": run}}))
    assert gate.admit().count == 1
    redis_client.execute_command("DEBUG", "SLEEP", "0.01")
    assert gate.admit().count == 1  # r1's lease lapsed: r2 goes without any release
    assert queued(redis_client) == ["r1", "r2"]


def test_an_empty_lane_is_kept_while_fresh_then_dropped(redis_client: redis.Redis, gate: Gate) -> None:
    a = lane("ada", CAP2)
    gate.enqueue([Waiting("r1", a, 60_000)])  # recorded; its message not written yet
    gate.admit()
    # the reconciler still looks there, after the inbox (a message moves from it to the lane)
    assert gate.wait_keys() == [INBOX_PREFIX + "server", a.wait_key]
    redis_client.delete(key_gate_fresh(a.id))
    gate.admit()
    assert redis_client.zcard(key_gate_lanes()) == 0 and gate.wait_keys() == []


def test_a_call_goes_to_its_own_pool_queue(redis_client: redis.Redis, gate: Gate) -> None:
    gpu = lane("ada", AppliedLimit("pool", "gpu", None, 3), pool="gpu")
    put(redis_client, gate, gpu, "g1")
    gate.admit()
    assert queued(redis_client, "gpu") == ["g1"] and queued(redis_client) == []


@pytest.mark.parametrize(
    ("queue", "wait"),
    [
        ("c:alice:client.alice", "vt:gate:w:x:c:alice:client.alice"),  # a client's queue
        ("brain", "vt:gate:w:x:brain"),
        ("server", "c:alice:client.alice"),  # a wait list that is not the gate's
    ],
)
def test_a_forged_lane_moves_nothing_outside_the_pool_queues(
    redis_client: redis.Redis, gate: Gate, queue: str, wait: str
) -> None:
    # A pool's Redis user may write the gate's keys; the brain runs the script with every key.
    redis_client.hset("vt:gate:lane:x", mapping={"queue": queue, "wait": wait, "limits": "[]"})
    redis_client.zadd(key_gate_lanes(), {"x": 0})
    redis_client.lpush(wait, json.dumps({"headers": {"id": "forged"}}))
    assert gate.admit().count == 0
    assert redis_client.llen(wait) == 1 and redis_client.llen(queue) == 0
    assert redis_client.zcard(key_gate_lanes()) == 0


def test_a_paused_budget_admits_nothing_until_its_end_and_other_lanes_go_on(
    redis_client: redis.Redis, gate: Gate
) -> None:
    jira, calm = AppliedLimit("server", "jira", None, None), AppliedLimit("server", "calm", None, 5)
    busy, other = lane("ada", jira), lane("ada", calm)
    end = gate.pause("server:jira", 30, "paused by HTTP 429 from server jira (Retry-After 30s)")
    put(redis_client, gate, busy, "j1")
    put(redis_client, gate, other, "c1")
    admitted = gate.admit()
    assert admitted.count == 1 and queued(redis_client) == ["c1"]
    # the gate timer is told when the pause ends (Redis time), not to poll
    assert admitted.wait_s is not None and 25 < admitted.wait_s <= 30
    assert gate.throttled(["j1"]) == {"j1": "paused by HTTP 429 from server jira (Retry-After 30s)"}
    assert set(gate.pauses()) == {"server:jira"} and gate.paused() == {"server:jira"}
    # a shorter pause asked later keeps the longer one
    assert gate.pause("server:jira", 1, "shorter") == end
    # the pause over (its key gone), the call goes
    redis_client.delete(key_gate_pause("server:jira"))
    assert gate.admit().count == 1 and queued(redis_client) == ["c1", "j1"]


def test_a_pause_ends_on_redis_time(redis_client: redis.Redis, gate: Gate) -> None:
    busy = lane("ada", AppliedLimit("tool", "http_get", None, None))
    gate.pause("tool:http_get", 0.05, "paused")
    put(redis_client, gate, busy, "h1")
    redis_client.execute_command("DEBUG", "SLEEP", "0.1")
    assert gate.admit().count == 1 and gate.pauses() == {}


def test_the_gate_view_reads_lanes_and_budgets_as_status_shows_them(
    redis_client: redis.Redis, gate: Gate
) -> None:
    s = lane("ada", RATE1, pool="gpu")
    put(redis_client, gate, s, "r1", "r2", "r3")
    gate.admit()
    gate.pause("server:jira", 30, "paused by HTTP 429 from server jira (Retry-After 30s)")
    (view,) = gate.lanes_view()
    assert (view.pool, view.user, view.keys, view.waiting) == ("gpu", "ada", ("tool:slow",), 2)
    assert (view.why, view.why_key) == ("rate_limit 1/s of tool slow", "tool:slow")
    keys, now = gate.keys_view(["tool:slow", "server:jira"])
    assert sum(keys["tool:slow"].admitted.values()) == 1 and keys["tool:slow"].paused_until is None
    jira = keys["server:jira"]
    assert jira.paused_until is not None and 25 < jira.paused_until - now <= 30
    assert jira.paused_why == "paused by HTTP 429 from server jira (Retry-After 30s)"


def test_a_pause_is_an_hour_at_most_and_a_forged_longer_one_is_ignored(
    redis_client: redis.Redis, gate: Gate
) -> None:
    seconds, micros = redis_client.time()
    now = seconds + micros / 1e6  # whole seconds made it 3,601.0008 once, the second having turned
    assert gate.pause("server:jira", 10 * MAX_PAUSE_S, "long") - now <= MAX_PAUSE_S + 1
    # A pool's Redis user may write the gate's keys: a pause days ahead is not the script's.
    busy = lane("ada", AppliedLimit("server", "forged", None, None))
    redis_client.set(key_gate_pause("server:forged"), f"{(seconds + 3 * 86_400) * 1_000_000}\tforged")
    put(redis_client, gate, busy, "f1")
    assert gate.admit().count == 1


def fair(
    user: str, tree: str, *limits: AppliedLimit, priority: int = 5, weight: int = 1, window: int = 2
) -> Lane:
    """A lane as the scheduler makes one with fair share on (``queue_window`` ``window``)."""
    return Lane(
        lane_id(None, user, limits, tree=tree, priority=priority),
        None,
        user,
        limits,
        priority=priority,
        weight=weight,
        window=window,
    )


def drain(r: redis.Redis) -> list[str]:
    """Take every call off the default pool's queue, as workers would, in their order."""
    taken = queued(r)
    r.delete(pool_queue(None))
    return taken


def test_a_window_bounds_the_pool_queue_and_users_take_turns(redis_client: redis.Redis, gate: Gate) -> None:
    big = fair("ada", "batch")
    put(redis_client, gate, big, *(f"a{i}" for i in range(6)))
    assert gate.admit().count == 2  # the window: 2 in the queue, the rest wait at the gate
    assert gate.throttled(["a2"]) == {"a2": "queue_window 2 of pool default"}
    small = fair("bob", "one")
    put(redis_client, gate, small, "b0")
    assert gate.admit().count == 0  # the queue is full
    assert drain(redis_client) == ["a0", "a1"]
    gate.admit()
    # bob's group never served before goes first; then ada's.
    assert drain(redis_client) == ["b0", "a2"]


def test_a_weight_gives_a_user_that_many_calls_per_turn(redis_client: redis.Redis, gate: Gate) -> None:
    put(redis_client, gate, fair("ada", "t1", weight=2, window=100), *(f"a{i}" for i in range(4)))
    put(redis_client, gate, fair("bob", "t2", window=100), *(f"b{i}" for i in range(4)))
    gate.admit()
    taken = drain(redis_client)
    # Turns: ada 2, bob 1 (either may start: neither was served before).
    assert sorted(taken[:3]) == ["a0", "a1", "b0"] and taken[3:6] in (["a2", "a3", "b1"], ["b1", "a2", "a3"])
    assert taken[6:] == ["b2", "b3"]


def test_trees_of_one_user_take_turns_and_a_higher_priority_goes_first(
    redis_client: redis.Redis, gate: Gate
) -> None:
    put(redis_client, gate, fair("ada", "t1", window=100), "x0", "x1", "x2")
    put(redis_client, gate, fair("ada", "t2", window=100), "y0", "y1")
    put(redis_client, gate, fair("ada", "t3", priority=2, window=100), "low")
    put(redis_client, gate, fair("ada", "t4", priority=8, window=100), "high")
    gate.admit()
    taken = drain(redis_client)
    assert taken[0] == "high" and taken[-1] == "low"
    assert sorted(taken[1:3]) == ["x0", "y0"] and sorted(taken[3:5]) == ["x1", "y1"] and taken[5] == "x2"


def test_a_high_priority_call_goes_to_the_head_of_the_pool_queue(
    redis_client: redis.Redis, gate: Gate
) -> None:
    put(redis_client, gate, fair("ada", "batch", window=3), "a0", "a1", "a2", "a3")
    gate.admit()
    put(redis_client, gate, fair("bob", "asked", priority=8, window=3), "b0", "b1")
    # bob's turn (his group was served longest ago): one past the full window, at the head ...
    assert gate.admit().count == 1
    assert queued(redis_client) == ["b0", "a0", "a1", "a2"]
    # ... one past at most: his next high call waits for the window, like ada's normal ones
    assert gate.admit().count == 0
    redis_client.rpop(pool_queue(None))  # a worker takes b0
    redis_client.rpop(pool_queue(None))  # and a0
    gate.admit()
    assert queued(redis_client) == ["a1", "a2", "a3"]  # ada's turn now: bob's went last time
    redis_client.rpop(pool_queue(None))
    gate.admit()
    assert queued(redis_client) == ["b1", "a2", "a3"]


def test_a_user_whose_every_call_is_high_still_alternates_with_the_others(
    redis_client: redis.Redis, gate: Gate
) -> None:
    put(redis_client, gate, fair("ada", "batch", window=2), *(f"a{i}" for i in range(10)))
    put(redis_client, gate, fair("bob", "flood", priority=8, window=2), *(f"b{i}" for i in range(10)))
    gate.admit()
    taken = []
    for _ in range(12):  # a worker takes the head, its run ends, the gate runs
        taken.append(json.loads(redis_client.rpop(pool_queue(None)))["headers"]["id"])
        gate.admit()
    # bob's high calls go first, but ada's still get every other turn: never more than the
    # window (plus bob's one past it) of bob's in a row.
    assert sum(1 for run in taken if run.startswith("a")) >= 5
    runs_of_bob = "".join("b" if run.startswith("b") else "." for run in taken).split(".")
    assert max(len(run) for run in runs_of_bob) <= 3


def test_max_in_flight_per_user_is_a_cap_of_its_own_per_user(redis_client: redis.Redis, gate: Gate) -> None:
    cap = user_limit(None, "ada", 1)
    put(redis_client, gate, fair("ada", "t1", cap, window=100), "a0", "a1")
    put(redis_client, gate, fair("bob", "t2", user_limit(None, "bob", 1), window=100), "b0")
    assert gate.admit().count == 2
    assert gate.throttled(["a1"]) == {"a1": "max_in_flight_per_user 1 of user ada on pool default"}
    assert gate.admit(release=["a0"]).count == 1


def test_the_inbox_sends_each_call_to_its_own_lane_in_order(redis_client: redis.Redis, gate: Gate) -> None:
    # Publishers of two trees wrote to the one inbox, interleaved: each lane keeps its order.
    a, b = lane("ada", CAP2), lane("bob", AppliedLimit("tool", "y", None, 2))
    gate.enqueue([Waiting(run, a, 60_000) for run in ("a1", "a2", "a3")])
    gate.enqueue([Waiting(run, b, 60_000) for run in ("b1", "b2", "b3")])
    for run in ("a1", "b1", "a2", "b2", "b3", "a3"):
        redis_client.lpush(INBOX_PREFIX + "server", message(run))
    # A run nobody recorded as waiting (re-sent as a new run) is dropped; a message that is no
    # task of ours goes to the pool queue, where the guarded transport drops it.
    redis_client.lpush(INBOX_PREFIX + "server", message("stale"), "garbage")
    assert gate.admit().count == 4  # two of each, a cap of 2 on each
    assert redis_client.llen(INBOX_PREFIX + "server") == 0
    assert redis_client.lrem(pool_queue(None), 0, "garbage") == 1
    assert sorted(queued(redis_client)) == ["a1", "a2", "b1", "b2"]
    assert gate.throttled(["a3", "b3", "stale"]) == {
        "a3": "max_concurrency 2 of tool x",
        "b3": "max_concurrency 2 of tool y",
    }
    assert gate.admit(release=["a1", "b1"]).count == 2
    assert sorted(queued(redis_client)[4:]) == ["a3", "b3"]
