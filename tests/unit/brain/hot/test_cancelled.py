"""brain.hot.cancelled on a real redis-server: the cancelled sets keep a run as long as a
worker may still meet it, then the reconciler takes it out, so they no longer grow for ever
(a client's counts against its quota)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import redis

from brain.hot import cancelled, state
from brain.hot.cancelled import (
    INDEX_KEY,
    TAKEN_BACK_KEPT_S,
    TRIM_CHUNK,
    Trimmed,
    batch_key,
    cancelled_set,
    index_entry,
    parse_entry,
    split_due,
    trim,
)
from brain.hot.client_quota import measure_client_usage
from brain.hot.gate import Gate
from brain.hot.state import HotState
from tests.redis_commands import command_counts, reset_counts
from tests.unit.brain.runtime.rig import kombu_message
from workers.contracts import (
    KOMBU_UNACKED,
    MAX_ASK_TIMEOUT_S,
    ToolCall,
    ToolType,
    client_key,
    client_queue,
    key_gate_waiting,
    stop_member,
)
from workers.tasks import begin_run

DAY = 86_400.0


class Later:
    """Redis's clock as the cancels and the trim read it (``redis_now``), moved on by
    ``passes``: a later cancel writes a batch of a later minute, as it would days later."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.offset = 0.0
        read = cancelled.redis_now

        def now(r: redis.Redis) -> float:
            return read(r) + self.offset

        monkeypatch.setattr(cancelled, "redis_now", now)
        monkeypatch.setattr(state, "redis_now", now)

    def passes(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def later(monkeypatch: pytest.MonkeyPatch) -> Later:
    return Later(monkeypatch)


def batched(r: redis.Redis) -> set[tuple[str | None, str]]:
    """(client id, member) of every member in a batch the trim will look at."""
    found: set[tuple[str | None, str]] = set()
    for entry in r.zrange(INDEX_KEY, 0, -1):
        client_id, batch_id = parse_entry(entry)
        found |= {(client_id, m.decode()) for m in r.lrange(batch_key(client_id, batch_id), 0, -1)}
    return found


def members(r: redis.Redis, client_id: str | None = None) -> set[str]:
    return {m.decode() for m in r.smembers(cancelled_set(client_id))}


def trim_as_the_brain(r: redis.Redis, **overrides: object) -> Trimmed:
    """The trim as the reconciler runs it (``Sweeps.trim_cancelled``): what each client's keys
    hold, read from them both ways round, and what waits at the gate."""
    hot = HotState(r)
    options: dict[str, object] = {
        "again_s": DAY,
        "client_holds": lambda cid: hot.message_ids_held([client_queue(cid)], client_id=cid, both_ways=True),
        "waiting": Gate(r).waiting,
        **overrides,
    }
    return trim(r, **options)  # type: ignore[arg-type]


def reserved(r: redis.Redis, client_id: str, run_id: str) -> None:
    """The agent has popped ``run_id`` and not acked it (in kombu's unacked hash)."""
    message = json.dumps([json.loads(kombu_message(run_id)), "", client_queue(client_id)])
    r.hset(client_key(client_id, KOMBU_UNACKED), f"tag-{run_id}", message)


# --- which members go, table ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("member", "held", "taken_out"),
    [
        # Its run met by no look (no client holds its message, it waits at no gate).
        ("run-a", set(), True),
        (stop_member("run-a"), set(), True),
        # Its run still held by its client, or waiting at the gate: kept.
        ("run-a", {"run-a"}, False),
        (stop_member("run-a"), {"run-a"}, False),
        ("run-a", {"run-b"}, True),
        # Keys that cannot be read: kept, looked at again later.
        ("run-a", None, False),
    ],
)
def test_a_member_past_its_time_is_taken_out_unless_its_run_may_still_meet_a_worker(
    member: str, held: set[str] | None, taken_out: bool
) -> None:
    assert split_due([member], held) == (([member], []) if taken_out else ([], [member]))


def test_an_index_entry_names_its_set_and_batch() -> None:
    for client_id, batch in [(None, "29000000:86400"), ("laptop-7", "29000001:691200")]:
        assert parse_entry(index_entry(client_id, batch).encode()) == (client_id, batch)


# --- the trim, on Redis ---------------------------------------------------------------------------


def test_runs_cancelled_longer_ago_than_kept_are_taken_out_and_the_rest_stay(
    redis_client: redis.Redis,
    later: Later,
) -> None:
    hot = HotState(redis_client)
    hot.cancel_runs(["old-a", "old-b", "old-gated"], stop=["old-b"], kept_s=DAY)
    hot.cancel_runs(["c-held", "c-gone"], "laptop", unqueue=False, stop=["c-held", "c-gone"], kept_s=DAY)
    reserved(redis_client, "laptop", "c-held")  # a laptop asleep with the call reserved
    # Still at the gate behind a rate-limited backlog: out of the set, the gate's script would
    # admit it (a token and a slot spent before the store refused it).
    redis_client.hset(key_gate_waiting(), "old-gated", "lane1")
    later.passes(2 * DAY)
    hot.cancel_runs(["new-a"], stop=["new-a"], kept_s=DAY)
    hot.cancel_runs(["c-new"], "laptop", unqueue=False, kept_s=DAY)

    done = trim_as_the_brain(redis_client)

    assert (done.removed, done.kept) == (5, 3)
    assert members(redis_client) == {"old-gated", "new-a", stop_member("new-a")}
    assert members(redis_client, "laptop") == {"c-held", stop_member("c-held"), "c-new"}
    assert batched(redis_client) == {
        (None, "old-gated"),
        (None, "new-a"),
        (None, stop_member("new-a")),
        ("laptop", "c-held"),
        ("laptop", stop_member("c-held")),
        ("laptop", "c-new"),
    }

    # What it kept is looked at again only after another day, then taken out once nothing
    # holds its run.
    assert trim_as_the_brain(redis_client).removed == 0
    redis_client.delete(client_key("laptop", KOMBU_UNACKED), key_gate_waiting())
    later.passes(2 * DAY)
    assert trim_as_the_brain(redis_client).removed == 6
    assert redis_client.exists(cancelled_set(None), cancelled_set("laptop"), INDEX_KEY) == 0
    assert redis_client.keys(batch_key(None, "*")) == redis_client.keys(batch_key("laptop", "*")) == []


def test_a_run_taken_back_while_its_agent_held_it_for_approval_stays_cancelled_past_the_longest_wait(
    redis_client: redis.Redis,
    later: Later,
) -> None:
    # The agent holds the call for its user's approval (up to ask_timeout_s, at most a week by
    # the wall clock) and falls silent; the brain takes the call back (its message deleted from
    # the unacked hash: no look can see it any more) and cancels the old run. An approval at
    # the end of the wait must still find it cancelled: the tool would run beside the re-sent run.
    hot = HotState(redis_client)
    reserved(redis_client, "laptop", "held-for-approval")
    taken = hot.take_client_runs("laptop", ["held-for-approval"])
    assert taken == {"held-for-approval": "running"}
    hot.cancel_runs(taken, "laptop", unqueue=False)  # a take-back's: kept the longest
    assert TAKEN_BACK_KEPT_S > MAX_ASK_TIMEOUT_S

    later.passes(MAX_ASK_TIMEOUT_S)
    assert trim_as_the_brain(redis_client).removed == 0
    limits = {"timeout_s": 5, "max_result_bytes": 1000, "max_deliveries": 3}
    call = ToolCall(run_id="held-for-approval", tree_id="t", task_id="k", tool="read_local_file",
                    tool_type=ToolType.NATIVE, args={}, client_id="laptop", **limits)  # fmt: skip
    assert begin_run(redis_client, client_key("laptop", ""), call, "laptop", time.time()) is None

    later.passes(TAKEN_BACK_KEPT_S)
    assert trim_as_the_brain(redis_client).removed == 1


def test_a_batch_is_timed_by_redis_not_by_the_brains_clock(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One brain's host clock ten days behind, another's right: the second must not find the
    # first's fresh batch ten days old (it would take out a stop member of a running call).
    real = time.time
    with monkeypatch.context() as behind:
        behind.setattr(time, "time", lambda: real() - 10 * DAY)
        HotState(redis_client).cancel_runs(["r1"], stop=["r1"], kept_s=DAY)
    assert trim_as_the_brain(redis_client).removed == 0
    assert members(redis_client) == {"r1", stop_member("r1")}


def test_runs_cancelled_one_by_one_share_a_batch_and_are_trimmed_in_a_few_round_trips(
    redis_client: redis.Redis,
    later: Later,
) -> None:
    # The sweeps cancel expired and lost runs one call each: a batch per call was 9 Redis
    # commands per member to trim (25,000 expired runs: 450,000 commands, 23-36 s of the
    # reconciler) and three times the set's memory. A batch per set, minute and retention.
    hot = HotState(redis_client)
    runs = [f"expired.t{i}.1.{i:012x}" for i in range(3_000)]
    for run in runs:
        hot.cancel_runs([run], stop=[run], kept_s=DAY)
    assert redis_client.zcard(INDEX_KEY) <= 2  # a minute's boundary may fall among them
    later.passes(2 * DAY)
    reset_counts(redis_client)

    assert trim_as_the_brain(redis_client).removed == 6_000

    assert sum(command_counts(redis_client).values()) < 100
    assert members(redis_client) == set()


def test_a_brain_whose_round_another_brain_trimmed_meanwhile_stops_and_loses_nothing(
    redis_client: redis.Redis,
    later: Later,
) -> None:
    # Two brains trim at once (a turn is a lease; a slow trim outlives it): both read the same
    # first chunk of a batch, the other brain takes it out and cuts it from the batch; this
    # one's cut would then drop the next chunk, never looked at, from the batch for good.
    hot = HotState(redis_client)
    runs = [f"night.t{i}.1.{i:012x}" for i in range(3 * TRIM_CHUNK)]
    hot.cancel_runs(runs, kept_s=DAY)
    later.passes(2 * DAY)
    (entry,) = redis_client.zrange(INDEX_KEY, 0, -1)
    key = batch_key(*parse_entry(entry))

    def the_other_brains_round(run_ids: list[str]) -> set[str]:
        first = [m.decode() for m in redis_client.lrange(key, 0, TRIM_CHUNK - 1)]
        if not first:
            return set()
        with redis_client.pipeline(transaction=True) as tx:
            tx.srem(cancelled_set(None), *first)
            tx.ltrim(key, len(first), -1)
            tx.execute()
        return set()

    assert trim_as_the_brain(redis_client, waiting=the_other_brains_round).removed == 0  # it stopped

    assert trim_as_the_brain(redis_client).removed == 2 * TRIM_CHUNK  # the next turn: the rest
    assert members(redis_client) == set()
    assert redis_client.zcard(INDEX_KEY) == 0


def test_the_look_sees_a_message_kombu_restores_from_the_unacked_hash_to_the_queue_meanwhile(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Read queue then hash, a restore between the two reads (a laptop waking: kombu moves the
    # reserved message back to the queue) was in neither: the trim took out a run its client
    # was about to run again.
    hot = HotState(redis_client)
    reserved(redis_client, "laptop", "r1")
    queue = client_key("laptop", client_queue("laptop"))
    unacked = client_key("laptop", KOMBU_UNACKED)
    read = HotState._list_chunks

    def read_then_restore(self: HotState, key: str) -> Iterator[list[bytes]]:
        yield from read(self, key)
        if key == queue and redis_client.hlen(unacked):
            raw = json.loads(redis_client.hget(unacked, "tag-r1"))
            redis_client.hdel(unacked, "tag-r1")
            redis_client.lpush(queue, json.dumps(raw[0]))

    monkeypatch.setattr(HotState, "_list_chunks", read_then_restore)
    assert "r1" not in hot.message_ids_held([client_queue("laptop")], client_id="laptop")
    reserved(redis_client, "laptop", "r1")
    redis_client.delete(queue)
    assert "r1" in hot.message_ids_held([client_queue("laptop")], client_id="laptop", both_ways=True)


def test_what_the_trim_takes_out_no_longer_counts_against_the_clients_quota(
    redis_client: redis.Redis,
    later: Later,
) -> None:
    hot = HotState(redis_client)
    runs = [f"night-batch.task-{i}.1.{i:012x}" for i in range(5000)]
    hot.cancel_runs(runs, "laptop", unqueue=False, stop=runs, kept_s=DAY)
    before = measure_client_usage(redis_client)["laptop"]
    assert before > 500_000  # 10,000 members of ~40 bytes: what a cancelled batch left behind
    later.passes(2 * DAY)

    done = trim_as_the_brain(redis_client)

    assert done.removed == 10_000 > TRIM_CHUNK  # several rounds of one batch
    assert measure_client_usage(redis_client).get("laptop", 0) == 0


def test_a_client_that_replaced_its_cancelled_set_stops_no_one_elses_trim(
    redis_client: redis.Redis, later: Later
) -> None:
    hot = HotState(redis_client)
    hot.cancel_runs(["mine"], "mallory", unqueue=False, kept_s=DAY)
    hot.cancel_runs(["theirs"], "laptop", unqueue=False, kept_s=DAY)
    hot.cancel_runs(["server-run"], kept_s=DAY)
    redis_client.delete(cancelled_set("mallory"))
    redis_client.set(cancelled_set("mallory"), b"not a set")
    later.passes(2 * DAY)

    done = trim_as_the_brain(redis_client)

    assert done.removed == 3
    assert members(redis_client, "laptop") == members(redis_client) == set()
    assert redis_client.get(cancelled_set("mallory")) == b"not a set"
    assert redis_client.zcard(INDEX_KEY) == 0
