"""brain.hot.cancelled on a real redis-server: the cancelled sets keep a run as long as a
worker may still meet it, then the reconciler takes it out, so they no longer grow for ever
(a client's counts against its quota)."""

from __future__ import annotations

import json
import time

import pytest
import redis

from brain.config import Settings
from brain.hot.cancelled import (
    BATCH_PREFIX,
    INDEX_KEY,
    TRIM_CHUNK,
    Trimmed,
    cancelled_set,
    index_entry,
    parse_entry,
    split_due,
    trim,
)
from brain.hot.client_quota import measure_client_usage
from brain.hot.gate import Gate
from brain.hot.state import HotState
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


def age(r: redis.Redis, seconds: float) -> None:
    """Every index entry added ``seconds`` earlier than it was: time passed."""
    for entry in r.zrange(INDEX_KEY, 0, -1):
        r.zincrby(INDEX_KEY, -seconds, entry)


def batched(r: redis.Redis) -> set[tuple[str | None, str]]:
    """(client id, member) of every member in a batch the trim will look at."""
    found: set[tuple[str | None, str]] = set()
    for entry in r.zrange(INDEX_KEY, 0, -1):
        client_id, batch_id = parse_entry(entry)
        found |= {(client_id, m.decode()) for m in r.lrange(BATCH_PREFIX + batch_id, 0, -1)}
    return found


def members(r: redis.Redis, client_id: str | None = None) -> set[str]:
    return {m.decode() for m in r.smembers(cancelled_set(client_id))}


def trim_as_the_brain(r: redis.Redis, kept_s: float = DAY) -> Trimmed:
    """The trim as the reconciler runs it (``Sweeps.trim_cancelled``): what each client's keys
    hold, read from them, and what waits at the gate."""
    hot = HotState(r)
    return trim(
        r,
        kept_s=kept_s,
        client_holds=lambda cid: hot.message_ids_held([client_queue(cid)], client_id=cid),
        waiting=Gate(r).waiting,
    )


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
    for client_id, batch in [(None, "0a1b"), ("laptop-7", "ffee")]:
        assert parse_entry(index_entry(client_id, batch).encode()) == (client_id, batch)


# --- the trim, on Redis ---------------------------------------------------------------------------


def test_runs_cancelled_longer_ago_than_kept_are_taken_out_and_the_rest_stay(
    redis_client: redis.Redis,
) -> None:
    hot = HotState(redis_client)
    hot.cancel_runs(["old-a", "old-b", "old-gated"], stop=["old-b"])
    hot.cancel_runs(["c-held", "c-gone"], "laptop", unqueue=False, stop=["c-held", "c-gone"])
    reserved(redis_client, "laptop", "c-held")  # a laptop asleep with the call reserved
    # Still at the gate behind a rate-limited backlog: out of the set, the gate's script would
    # admit it (a token and a slot spent before the store refused it).
    redis_client.hset(key_gate_waiting(), "old-gated", "lane1")
    age(redis_client, 2 * DAY)
    hot.cancel_runs(["new-a"], stop=["new-a"])
    hot.cancel_runs(["c-new"], "laptop", unqueue=False)

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

    # What it kept is looked at again only after another kept_s, then taken out once nothing
    # holds its run.
    assert trim_as_the_brain(redis_client).removed == 0
    redis_client.delete(client_key("laptop", KOMBU_UNACKED), key_gate_waiting())
    age(redis_client, 2 * DAY)
    assert trim_as_the_brain(redis_client).removed == 6
    assert redis_client.exists(cancelled_set(None), cancelled_set("laptop"), INDEX_KEY) == 0
    assert redis_client.keys(BATCH_PREFIX + "*") == []


def test_a_run_taken_back_while_its_agent_held_it_for_approval_stays_cancelled_past_the_longest_wait(
    redis_client: redis.Redis,
) -> None:
    # The agent holds the call for its user's approval (up to ask_timeout_s, at most a week) and
    # falls silent; the brain takes the call back (its message deleted from the unacked hash:
    # no look can see it any more) and cancels the old run. An approval at the end of the wait
    # must still find it cancelled: the tool would otherwise run beside the re-sent run.
    hot = HotState(redis_client)
    reserved(redis_client, "laptop", "held-for-approval")
    taken = hot.take_client_runs("laptop", ["held-for-approval"])
    assert taken == {"held-for-approval": "running"}
    hot.cancel_runs(taken, "laptop", unqueue=False)
    kept_s = Settings.model_fields["cancelled_kept_s"].default  # the default
    assert kept_s > MAX_ASK_TIMEOUT_S

    age(redis_client, MAX_ASK_TIMEOUT_S)
    assert trim_as_the_brain(redis_client, kept_s).removed == 0
    limits = {"timeout_s": 5, "max_result_bytes": 1000, "max_deliveries": 3}
    call = ToolCall(run_id="held-for-approval", tree_id="t", task_id="k", tool="read_local_file",
                    tool_type=ToolType.NATIVE, args={}, client_id="laptop", **limits)  # fmt: skip
    assert begin_run(redis_client, client_key("laptop", ""), call, "laptop", time.time()) is None

    age(redis_client, kept_s)
    assert trim_as_the_brain(redis_client, kept_s).removed == 1


def test_a_batch_is_timed_by_redis_not_by_the_brains_clock(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One brain's host clock ten days behind, another's right: the second must not find the
    # first's fresh batch ten days old (it would take out a stop member of a running call).
    real = time.time
    with monkeypatch.context() as behind:
        behind.setattr(time, "time", lambda: real() - 10 * DAY)
        HotState(redis_client).cancel_runs(["r1"], stop=["r1"])
    assert trim_as_the_brain(redis_client).removed == 0
    assert members(redis_client) == {"r1", stop_member("r1")}


def test_what_the_trim_takes_out_no_longer_counts_against_the_clients_quota(
    redis_client: redis.Redis,
) -> None:
    hot = HotState(redis_client)
    runs = [f"night-batch.task-{i}.1.{i:012x}" for i in range(5000)]
    hot.cancel_runs(runs, "laptop", unqueue=False, stop=runs)
    before = measure_client_usage(redis_client)["laptop"]
    assert before > 500_000  # 10,000 members of ~40 bytes: what a cancelled batch left behind
    age(redis_client, 2 * DAY)

    done = trim_as_the_brain(redis_client)

    assert done.removed == 10_000 > TRIM_CHUNK  # several chunks and batches in one trim
    assert measure_client_usage(redis_client).get("laptop", 0) == 0


def test_a_client_that_replaced_its_cancelled_set_stops_no_one_elses_trim(redis_client: redis.Redis) -> None:
    hot = HotState(redis_client)
    hot.cancel_runs(["mine"], "mallory", unqueue=False)
    hot.cancel_runs(["theirs"], "laptop", unqueue=False)
    hot.cancel_runs(["server-run"])
    redis_client.delete(cancelled_set("mallory"))
    redis_client.set(cancelled_set("mallory"), b"not a set")
    age(redis_client, 2 * DAY)

    done = trim_as_the_brain(redis_client)

    assert done.removed == 3
    assert members(redis_client, "laptop") == members(redis_client) == set()
    assert redis_client.get(cancelled_set("mallory")) == b"not a set"
    assert redis_client.zcard(INDEX_KEY) == 0
