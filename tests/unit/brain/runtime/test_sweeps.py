"""brain.runtime.sweeps: the reconciler makes Redis agree with the store, the record.

A real Scheduler on a SQLite store and a real redis-server (the conftest's, flushed per test)
hold the state; only Celery is a recorder of the calls sent. The clock is injected: a sweep's
"after the grace" is the clock moved on, never a sleep."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from brain.core.models import TaskState, TreeStatus
from brain.core.snapshot import RegistrySnapshot
from brain.hot.cancelled import INDEX_KEY
from brain.hot.client_quota import QUOTA_TURN_KEY
from brain.hot.parked import key_requeues
from brain.runtime.sweeps import server_queues
from tests.redis_commands import command_counts, reset_counts
from tests.unit.brain.runtime.rig import GRACE, Rig, echo, kombu_message, local_read, tree
from workers.contracts import (
    CLIENT_ACK,
    CLIENT_ROUND_TRIP,
    KOMBU_UNACKED,
    client_key,
    client_queue,
    key_cancelled,
    key_parked,
    queue_keys,
    stop_member,
)
from workers.tasks import begin_run

# --- where a server run's message can be -------------------------------------------------------


@pytest.mark.parametrize(
    ("pools", "named_by_records", "expected"),
    [
        ((), (), ["brain", "server"]),
        (("gpu",), (), ["brain", "server", "server.gpu"]),
        # A pool no longer configured but named by a queued record is still looked in.
        ((), ("old",), ["brain", "server", "server.old"]),
        (("b", "a"), ("a",), ["brain", "server", "server.a", "server.b"]),
    ],
)
def test_server_queues_are_the_brains_the_default_pools_and_every_pool_named(
    pools: tuple[str, ...], named_by_records: tuple[str, ...], expected: list[str]
) -> None:
    from brain.core.models import TaskRecord

    records = [
        TaskRecord(tree_id="t", task_id=f"x{i}", tool="echo", pool=p) for i, p in enumerate(named_by_records)
    ]
    # A client's record names no server queue, whatever its pool field says.
    records.append(TaskRecord(tree_id="t", task_id="c", tool="echo", pool="clientpool", client_id="laptop"))
    # Each pool's queue is read as kombu keeps it: one list per priority step.
    assert server_queues(records, pools) == [
        expected[0],
        *(key for q in expected[1:] for key in queue_keys(q)),
    ]


def test_a_pools_queue_is_read_in_every_priority_steps_list() -> None:
    steps = ["server", "server\x06\x163", "server\x06\x166", "server\x06\x169"]
    assert server_queues([], []) == ["brain", *steps]


# --- lost messages -----------------------------------------------------------------------------


def test_a_queued_task_nothing_holds_is_resent_as_a_new_run_after_the_grace(rig: Rig) -> None:
    rec = rig.scheduler.submit(tree(echo("a")))
    first = rig.sent.of("a")[0]

    assert rig.sweeps.run_once() == []  # within the grace: not yet called lost
    rig.later()
    assert rig.sweeps.run_once() == ["a"]

    again = rig.sent.of("a")[-1]
    task = rig.task(rec.tree_id, "a")
    assert again.run_id != first.run_id
    assert task.run_id == again.run_id and task.attempt == 2 and task.state is TaskState.QUEUED_SERVER


@pytest.mark.parametrize("where", ["server queue", "unacked hash", "brain queue"])
def test_a_queued_task_whose_message_redis_holds_is_not_resent(rig: Rig, where: str) -> None:
    rec = rig.scheduler.submit(tree(echo("a")))
    run_id = rig.task(rec.tree_id, "a").run_id
    if where == "server queue":
        rig.r.lpush("server", kombu_message(run_id))
    elif where == "brain queue":
        rig.r.lpush("brain", kombu_message(run_id))
    else:
        rig.r.hset(KOMBU_UNACKED, "tag1", json.dumps([json.loads(kombu_message(run_id)), "", "server"]))
    rig.later()
    assert rig.sweeps.run_once() == []
    assert rig.task(rec.tree_id, "a").run_id == run_id
    assert len(rig.sent.of("a")) == 1


def test_a_task_lost_too_often_fails_naming_why_and_its_tree_fails(rig: Rig) -> None:
    rec = rig.scheduler.submit(tree(echo("a")))
    max_deliveries = rig.sweeps.settings.max_deliveries
    for _ in range(max_deliveries + 1):
        rig.later()
        assert rig.sweeps.run_once() == ["a"]
    rig.later()
    rig.sweeps.run_once()

    task = rig.task(rec.tree_id, "a")
    assert task.state is TaskState.FAILED
    assert task.error.type == "LostTooOften"
    assert f"was lost {max_deliveries + 2} times" in task.error.message
    assert len(rig.sent.of("a")) == max_deliveries + 2
    assert rig.store.get_tree(rec.tree_id).status is TreeStatus.FAILED


def test_a_task_on_a_later_attempt_is_resent_when_lost_not_failed_as_lost_too_often(rig: Rig) -> None:
    # The bound counts the re-sends of this attempt (``resent``), not every run the task ever
    # had (``attempt``, which retries and take-backs raise too): a task on its tenth run that is
    # lost once is sent again.
    rec = rig.scheduler.submit(tree(echo("a")))
    task = rig.task(rec.tree_id, "a")
    assert rig.store.transition(rec.tree_id, "a", from_states={task.state}, attempt=10) is not None
    rig.later()
    assert rig.sweeps.run_once() == ["a"]
    again = rig.task(rec.tree_id, "a")
    assert again.state is TaskState.QUEUED_SERVER and (again.attempt, again.resent) == (11, 1)


def test_a_task_lost_too_often_is_retried_when_its_policy_covers_unavailable(rig: Rig) -> None:
    policy = {"max_attempts": 2, "on": ["unavailable"], "backoff_s": 7, "jitter": False}
    rec = rig.scheduler.submit(tree(echo("a"), retry=policy))
    max_deliveries = rig.sweeps.settings.max_deliveries
    for _ in range(max_deliveries + 1):
        rig.later()
        assert rig.sweeps.run_once() == ["a"]
    lost_run = rig.task(rec.tree_id, "a").run_id
    rig.later()
    rig.sweeps.run_once()

    task = rig.task(rec.tree_id, "a")
    assert task.state is TaskState.RETRYING, task.reason
    assert [a.error.type for a in task.attempts if a.error] == ["LostTooOften"]
    assert task.attempts[0].run_id == lost_run and task.resent == 0
    assert rig.r.sismember(key_cancelled(), lost_run)
    # Never started again, but not stopped: it may be running on a live worker, and the next
    # run would be answered from its result (workers.recent_calls).
    assert not rig.r.sismember(key_cancelled(), stop_member(lost_run))
    assert rig.store.get_tree(rec.tree_id).status is TreeStatus.RUNNING


def test_a_lost_call_of_a_client_gone_is_parked_for_its_next_connect(rig: Rig) -> None:
    rig.presence.enroll("laptop", "ada")
    rig.connect()
    rec = rig.scheduler.submit(tree(local_read()), user="ada")
    assert rig.task(rec.tree_id, "r").state is TaskState.QUEUED_CLIENT
    rig.presence.disconnect("laptop")  # its session ended without a take-back (a crash)

    rig.later()
    rig.sweeps.run_once()
    task = rig.task(rec.tree_id, "r")
    assert task.state is TaskState.PENDING_CLIENT
    assert task.reason == "Queued for Client: read_local_file (its message to client laptop was lost)"
    assert rig.r.llen(key_parked("user:ada")) == 1
    assert len(rig.sent.of("r")) == 1  # parked, not sent again


@pytest.mark.parametrize(("round_trip_ms", "second_look_s"), [("400", GRACE), ("4000", 16.0)])
def test_a_client_run_is_called_lost_on_a_second_look_a_grace_or_four_round_trips_later(
    rig: Rig, round_trip_ms: str, second_look_s: float
) -> None:
    # kombu BRPOPs a message and writes it to its unacked hash a round trip later: a look in
    # that gap finds the run nowhere. Its agent says how far it is from Redis.
    rig.presence.enroll("laptop", "ada")
    rig.connect()
    rig.r.set(client_key("laptop", CLIENT_ROUND_TRIP), round_trip_ms)
    rec = rig.scheduler.submit(tree(local_read()), user="ada")
    first = rig.task(rec.tree_id, "r").run_id

    rig.later()
    assert rig.sweeps.run_once() == []  # nowhere, once: maybe between BRPOP and HSET
    rig.clock.advance(second_look_s - 0.1)
    assert rig.sweeps.run_once() == []  # not yet far enough apart
    rig.clock.advance(0.1)
    assert rig.sweeps.run_once() == ["r"]
    assert rig.task(rec.tree_id, "r").run_id != first
    assert len(rig.sent.of("r")) == 2


def test_a_client_run_seen_held_at_the_second_look_is_not_resent(rig: Rig) -> None:
    rig.presence.enroll("laptop", "ada")
    rig.connect()
    rig.r.set(client_key("laptop", CLIENT_ROUND_TRIP), "200")
    rec = rig.scheduler.submit(tree(local_read()), user="ada")
    run_id = rig.task(rec.tree_id, "r").run_id
    queue = client_key("laptop", client_queue("laptop"))
    rig.r.delete(queue)  # the agent popped it...

    rig.later()
    assert rig.sweeps.run_once() == []
    unacked = client_key("laptop", KOMBU_UNACKED)  # ...and wrote it to its unacked hash
    rig.r.hset(unacked, "tag1", json.dumps([json.loads(kombu_message(run_id)), "", queue]))
    rig.clock.advance(GRACE + 1)
    assert rig.sweeps.run_once() == []
    assert rig.task(rec.tree_id, "r").run_id == run_id
    assert len(rig.sent.of("r")) == 1


@pytest.mark.parametrize("owner", ["server", "client"])
def test_a_resent_run_supersedes_the_lost_one_so_a_late_delivery_of_it_never_starts(
    rig: Rig, owner: str
) -> None:
    # A message nothing held may still surface: an agent popped it just before its link was
    # cut (its unacked write lost), or kombu restores it after the agent died. That old run
    # must be refused where every run starts (workers.tasks.begin_run), not run beside the new.
    client = owner == "client"
    if client:
        rig.presence.enroll("laptop", "ada")
        rig.connect()
    rec = rig.scheduler.submit(tree(local_read("a") if client else echo("a")), user="ada")
    old = rig.sent.of("a")[0]
    rig.later()
    assert rig.sweeps.run_once() == ["a"]
    new = rig.sent.of("a")[-1]
    assert new.run_id != old.run_id and rig.task(rec.tree_id, "a").run_id == new.run_id

    prefix = client_key("laptop", "") if client else ""
    assert rig.r.smembers(prefix + key_cancelled()) == {old.run_id.encode()}
    assert begin_run(rig.r, prefix, old, "late", rig.clock()) is None
    assert begin_run(rig.r, prefix, new, "w", rig.clock()) == 1


@pytest.mark.parametrize("case", ["given up", "client gone"])
def test_a_lost_run_given_up_or_parked_is_cancelled_too(rig: Rig, case: str) -> None:
    if case == "given up":
        rec = rig.scheduler.submit(tree(echo("a")))
        for _ in range(rig.sweeps.settings.max_deliveries + 1):
            rig.later()
            rig.sweeps.run_once()
        key = key_cancelled()
    else:
        rig.presence.enroll("laptop", "ada")
        rig.connect()
        rec = rig.scheduler.submit(tree(local_read("a")), user="ada")
        rig.presence.disconnect("laptop")  # its session ended without a take-back (a crash)
        key = client_key("laptop", key_cancelled())
    last = rig.task(rec.tree_id, "a").run_id
    rig.later()
    rig.sweeps.run_once()
    assert rig.task(rec.tree_id, "a").state in (TaskState.FAILED, TaskState.PENDING_CLIENT)
    assert last.encode() in rig.r.smembers(key)


@pytest.mark.parametrize("case", ["given up", "client gone"])
def test_only_tasks_actually_resent_are_returned_as_resent(rig: Rig, case: str) -> None:
    if case == "given up":
        rig.scheduler.submit(tree(echo("a")))
        for _ in range(rig.sweeps.settings.max_deliveries + 1):
            rig.later()
            rig.sweeps.run_once()
    else:
        rig.presence.enroll("laptop", "ada")
        rig.connect()
        rig.scheduler.submit(tree(local_read("a")), user="ada")
        rig.presence.disconnect("laptop")
    sent_before = len(rig.sent.calls)
    rig.later()
    resent = rig.sweeps.run_once()
    assert len(rig.sent.calls) == sent_before  # nothing was sent...
    assert resent == []  # ...so nothing may be reported as re-sent


def test_a_client_whose_queue_cannot_be_read_is_suspended_and_its_call_taken_back(rig: Rig) -> None:
    rig.presence.enroll("laptop", "ada")
    rig.connect()
    rec = rig.scheduler.submit(tree(local_read()), user="ada")
    rig.r.set(client_key("laptop", client_queue("laptop")), "not a list")  # the agent wrote it

    rig.later()
    rig.sweeps.run_once()
    assert rig.presence.session("laptop") is None
    assert rig.clients.misbehaving.get("laptop") is not None
    ack = json.loads(rig.r.get(client_key("laptop", CLIENT_ACK)))
    assert ack["accepted"] is False and "queue" in ack["reason"]
    assert rig.task(rec.tree_id, "r").state in (TaskState.PENDING_CLIENT, TaskState.BLOCKED)


# --- parked work -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tree_max_wait", "settings_max_wait", "waited", "expired"),
    [
        (None, None, 10**6, False),  # no max_wait anywhere: waits for ever
        (None, 60.0, 59.0, False),
        (None, 60.0, 60.0, True),
        (30.0, 60.0, 31.0, True),  # the tree's own max_wait_s comes first
        (120.0, 60.0, 61.0, False),
    ],
)
def test_parked_work_expires_after_max_wait(
    rigs: Callable[..., Rig],
    tree_max_wait: float | None,
    settings_max_wait: float | None,
    waited: float,
    expired: bool,
) -> None:
    rig = rigs(max_wait_s=settings_max_wait)
    fields = {"max_wait_s": tree_max_wait} if tree_max_wait else {}
    rec = rig.scheduler.submit(tree(local_read(), **fields), user="ada")
    assert rig.task(rec.tree_id, "r").state in (TaskState.PENDING_CLIENT, TaskState.BLOCKED)

    rig.clock.advance(waited)
    assert rig.sweeps.expire_parked() == (["r"] if expired else [])
    task = rig.task(rec.tree_id, "r")
    if expired:
        limit = tree_max_wait or settings_max_wait
        assert task.state is TaskState.EXPIRED
        assert task.reason == (
            f"expired: waited {waited:.0f}s for a client with tool 'read_local_file' (max_wait_s {limit:g})"
        )
        assert rig.store.get_tree(rec.tree_id).status is TreeStatus.FAILED
    else:
        assert task.state in (TaskState.PENDING_CLIENT, TaskState.BLOCKED)


def test_a_task_past_max_total_expires_and_its_run_is_cancelled(rig: Rig) -> None:
    rec = rig.scheduler.submit(tree(echo("a", max_total_s=30), echo("b")))
    run_id = rig.task(rec.tree_id, "a").run_id
    rig.clock.advance(29)
    assert rig.sweeps.expire_overdue() == []
    rig.clock.advance(1)
    assert rig.sweeps.expire_overdue() == ["a"]

    task = rig.task(rec.tree_id, "a")
    assert task.state is TaskState.EXPIRED
    assert task.reason == "expired: not finished within max_total_s 30 (state was queued_server)"
    assert rig.r.sismember(key_cancelled(), run_id)
    assert not rig.r.sismember(key_cancelled(), stop_member(run_id))  # it never began
    assert rig.task(rec.tree_id, "b").state is TaskState.QUEUED_SERVER  # no max_total_s


def test_a_running_task_past_max_total_is_stopped_where_it_runs(rig: Rig) -> None:
    rec = rig.scheduler.submit(tree(echo("a", max_total_s=30)))
    run_id = rig.task(rec.tree_id, "a").run_id
    assert rig.store.begin_run(rec.tree_id, "a", run_id, "server@h", rig.clock()) == 1
    rig.clock.advance(30)
    assert rig.sweeps.expire_overdue() == ["a"]
    assert rig.r.smembers(key_cancelled()) == {run_id.encode(), stop_member(run_id).encode()}


def test_a_task_past_max_total_behind_a_backlog_of_other_trees_expires_all_the_same(rig: Rig) -> None:
    """The sweep once read the 1,000 stalest unfinished tasks: an interactive call with a
    ``max_total_s`` queued behind a bigger batch of another tree never expired while the batch
    waited. It reads the tasks past their deadline now (``Store.tasks_expired``)."""
    batch = rig.scheduler.submit(tree(*(echo(f"b{i}") for i in range(1_100))))
    rig.clock.advance(1)
    quick = rig.scheduler.submit(tree(echo("ask", max_total_s=30)))
    rig.clock.advance(30)
    assert rig.sweeps.expire_overdue() == ["ask"]
    assert rig.task(quick.tree_id, "ask").state is TaskState.EXPIRED
    assert rig.task(batch.tree_id, "b0").state is TaskState.QUEUED_SERVER


def test_a_task_an_older_version_queued_without_a_deadline_expires_after_the_brains_first_sweep(
    rig: Rig,
) -> None:
    """A version before the deadline index wrote no ``expires_at``: upgraded while such a task
    waited, the brain never expired it (until its next send). Its first sweep writes the
    deadline its ``max_total_s`` gives (``Store.backfill_deadlines``), once."""
    rec = rig.scheduler.submit(tree(echo("ask", max_total_s=30)))
    queued = rig.task(rec.tree_id, "ask")
    # The task as the older version left it: queued, first_queued_at, no deadline.
    rig.store.transition(rec.tree_id, "ask", from_states={queued.state}, state=queued.state, expires_at=None)
    rig.clock.advance(31)
    assert rig.sweeps.expire_overdue() == []

    rig.sweeps.run_once()

    assert rig.task(rec.tree_id, "ask").state is TaskState.EXPIRED
    assert rig.sweeps.backfill_deadlines() == 0  # once per brain process


def test_a_parked_task_no_list_names_is_listed_again_once(rig: Rig) -> None:
    listed = rig.scheduler.submit(tree(local_read("kept")), user="ada")
    lost = rig.scheduler.submit(tree(local_read("lost")), user="bob")
    rig.r.delete(key_parked("user:bob"))  # a crash between the store write and the push

    assert rig.sweeps.relist_parked() == 0  # within the grace
    rig.later()
    assert rig.sweeps.relist_parked() == 1
    assert rig.sweeps.relist_parked() == 0  # listed now: not listed twice
    refs = {key: [(r.tree_id, r.task_id) for r in rig.sweeps.parked.refs_in(key)] for key in (
        key_parked("user:ada"), key_parked("user:bob"))}  # fmt: skip
    assert refs == {
        key_parked("user:ada"): [(listed.tree_id, "kept")],
        key_parked("user:bob"): [(lost.tree_id, "lost")],
    }


def test_an_interrupted_requeue_is_finished_for_a_client_still_connected(rig: Rig) -> None:
    rec = rig.scheduler.submit(tree(local_read()), user="ada")
    rig.presence.enroll("laptop", "ada")
    rig.connect(requeue=False)  # connected, but its requeue never ran (a crash)
    rig.r.hset(key_requeues(), key_parked("user:ada"), "laptop")

    rig.sweeps.run_once()
    task = rig.task(rec.tree_id, "r")
    assert task.state is TaskState.QUEUED_CLIENT and task.client_id == "laptop"
    assert [c.client_id for c in rig.sent.of("r")] == ["laptop"]


# --- idle trees, failing steps -----------------------------------------------------------------


def test_a_tree_left_idle_by_a_crash_is_advanced(rig: Rig) -> None:
    rec = rig.scheduler.submit(tree(echo("a"), echo("b", depends_on=["a"])))
    # "a" recorded done, then the brain died before dispatching "b".
    rig.store.transition(
        rec.tree_id, "a", from_states={TaskState.QUEUED_SERVER}, state=TaskState.DONE,
        result="a", finished_at=rig.clock(), updated_at=rig.clock(),
    )  # fmt: skip
    rig.sweeps.advance_idle()
    assert rig.task(rec.tree_id, "b").state is TaskState.PENDING  # within the grace
    rig.later()
    rig.sweeps.advance_idle()
    assert rig.task(rec.tree_id, "b").state is TaskState.QUEUED_SERVER
    assert [c.args for c in rig.sent.of("b")] == [{"value": "b"}]


def test_a_step_that_fails_does_not_stop_the_rest_of_the_sweep(rig: Rig) -> None:
    rec = rig.scheduler.submit(tree(echo("a", max_total_s=5)))

    def broken() -> RegistrySnapshot:
        raise RuntimeError("registry unreadable")

    rig.sweeps.registry = broken  # re-sending reads the pools from it, and fails
    rig.later()
    assert rig.sweeps.run_once() == []
    assert rig.task(rec.tree_id, "a").state is TaskState.EXPIRED  # expire_overdue still ran


# --- quotas and cancel -------------------------------------------------------------------------


def test_a_client_over_its_quota_is_suspended_and_its_keys_freed_but_the_ack(
    rigs: Callable[..., Rig],
) -> None:
    rig = rigs(client_quota_bytes=64 * 1024)
    for cid in ("big", "small"):
        rig.presence.enroll(cid, "ada")
    rig.r.set(client_key("big", "junk"), b"x" * 200_000)
    rig.r.set(client_key("small", "note"), b"x" * 100)

    used = rig.sweeps.check_quotas()
    assert used["big"] > 64 * 1024 and used["small"] < 64 * 1024
    assert rig.r.exists(client_key("big", "junk")) == 0
    assert rig.r.exists(client_key("small", "note")) == 1
    ack = json.loads(rig.r.get(client_key("big", CLIENT_ACK)))
    assert ack["accepted"] is False and ack["reason"].startswith("suspended by the brain")
    assert rig.clients.misbehaving.get("small") is None


def test_the_quota_check_reads_the_suspension_marks_once_not_once_per_client(
    rigs: Callable[..., Rig],
) -> None:
    """A read of each enrolled client's mark every 2 s was a tenth of what 1,000 idle clients cost
    the brain; only a client marked over its quota can have that mark lifted."""
    rig = rigs(client_quota_bytes=64 * 1024)
    for i in range(40):
        rig.presence.enroll(f"c{i:02d}", "ada")
        rig.r.set(client_key(f"c{i:02d}", "note"), b"x" * 100)
    rig.r.set(client_key("c07", "junk"), b"x" * 200_000)
    rig.sweeps.check_quotas()
    assert rig.clients.misbehaving.get("c07") is not None

    rig.sweeps._quota_checked = float("-inf")  # measure again now
    rig.r.delete(QUOTA_TURN_KEY)  # (its turn again: the interval's lease over)
    reset_counts(rig.r)
    rig.sweeps.check_quotas()  # c07's keys were freed: back under its quota
    assert command_counts(rig.r).get("hget", 0) <= 2  # c07's mark, read again before it is lifted
    assert rig.clients.misbehaving.get("c07") is None


def test_of_two_brains_one_keeps_measuring_the_quotas(rigs: Callable[..., Rig]) -> None:
    """A measure is a SCAN and a MEMORY USAGE per client key: a second brain must not double it,
    nor take turns with the first (each would then find every busy client's keys changed)."""
    first, second = rigs(), rigs()
    second.sweeps._holder = "another-host:1"  # two brains of one process would be one holder
    first.presence.enroll("laptop", "ada")
    first.r.set(client_key("laptop", "note"), b"x" * 100)

    def scans() -> int:
        return int(first.r.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))

    before = scans()
    assert first.sweeps.check_quotas()["laptop"] > 0
    assert second.sweeps.check_quotas() == {}  # the first holds the turn
    first.sweeps._quota_checked = second.sweeps._quota_checked = float("-inf")  # an interval later
    assert first.sweeps.check_quotas()["laptop"] > 0  # the holder measures again
    assert second.sweeps.check_quotas() == {}  # and the second still takes no turn
    assert scans() == before + 2
    first.r.delete(QUOTA_TURN_KEY)  # the first stopped: its lease ran out
    second.sweeps._quota_checked = float("-inf")
    assert second.sweeps.check_quotas()["laptop"] > 0


def test_of_two_brains_sweeping_one_lost_task_one_resends_it(rigs: Callable[..., Rig]) -> None:
    """Both reconcilers find it queued and held nowhere; the move to a new run is a
    compare-and-set on the lost run id, so one new run is sent, by one brain."""
    first, second = rigs(), rigs()
    rec = first.scheduler.submit(tree(echo("a")))
    lost = first.task(rec.tree_id, "a").run_id
    first.later()
    second.later()
    assert first.sweeps.resend_lost() == ["a"]
    assert second.sweeps.resend_lost() == []
    # The second brain's look began before the first's move: its move of the lost run fails.
    stale = second.store.get_task(rec.tree_id, "a")
    assert stale is not None
    assert second.sweeps._resend(stale.model_copy(update={"run_id": lost, "attempt": 1}), None) is False
    assert len(first.sent.of("a")) == 2 and second.sent.of("a") == []  # the first run and one re-send
    assert first.task(rec.tree_id, "a").attempt == 2


def test_cancel_skips_every_unfinished_task_and_marks_runs_in_flight_cancelled(rig: Rig) -> None:
    rec = rig.scheduler.submit(tree(echo("a"), echo("b", depends_on=["a"])))
    run_id = rig.task(rec.tree_id, "a").run_id

    assert sorted(rig.sweeps.cancel(rec.tree_id)) == ["a", "b"]
    for task_id in ("a", "b"):
        task = rig.task(rec.tree_id, task_id)
        assert (task.state, task.reason) == (TaskState.SKIPPED, "cancelled by user")
    assert rig.r.smembers(key_cancelled()) == {run_id.encode()}  # queued: nothing runs to stop
    assert rig.store.get_tree(rec.tree_id).status is TreeStatus.FAILED


def test_cancel_stops_a_server_call_its_worker_began(rig: Rig) -> None:
    rec = rig.scheduler.submit(tree(echo("a"), echo("b")))
    runs = {t: rig.task(rec.tree_id, t).run_id for t in ("a", "b")}
    assert rig.store.begin_run(rec.tree_id, "a", runs["a"], "server@h", rig.clock()) == 1

    assert sorted(rig.sweeps.cancel(rec.tree_id)) == ["a", "b"]
    assert rig.r.smembers(key_cancelled()) == {
        runs["a"].encode(),
        stop_member(runs["a"]).encode(),
        runs["b"].encode(),
    }


def test_cancel_takes_a_clients_queued_calls_out_of_its_queue_and_leaves_the_rest(rig: Rig) -> None:
    # A workstation offline (its session not yet lapsed) or busy with a long call still has
    # the cancelled calls in its queue: it must never pop them when it comes back or frees up.
    rig.presence.enroll("laptop", "ada")
    rig.connect()
    cancelled = rig.scheduler.submit(tree(local_read("r1"), local_read("r2"), id="gone"), user="ada")
    kept = rig.scheduler.submit(tree(local_read("r3"), id="kept"), user="ada")
    runs = {t: rig.task(cancelled.tree_id, t).run_id for t in ("r1", "r2")}
    other = rig.task(kept.tree_id, "r3").run_id
    queue = client_key("laptop", client_queue("laptop"))
    # What the publisher pushed (the rig records sends instead), a foreign message among them.
    # r3 is still queued; r1 was popped by the agent (running there: its agent tells the store
    # a moment later, so the store may still say queued).
    rig.r.lpush(queue, kombu_message(other), b"not json", kombu_message(runs["r2"]))

    assert sorted(rig.sweeps.cancel(cancelled.tree_id)) == ["r1", "r2"]
    assert rig.r.lrange(queue, 0, -1) == [b"not json", kombu_message(other)]
    # Both never start; r1, not in the queue, is also stopped where it may run.
    assert rig.r.smembers(client_key("laptop", key_cancelled())) == {
        runs["r1"].encode(),
        runs["r2"].encode(),
        stop_member(runs["r1"]).encode(),
    }
    assert rig.task(kept.tree_id, "r3").state is TaskState.QUEUED_CLIENT


def test_a_cancel_whose_client_replaced_its_queue_suspends_it_and_still_cancels(rig: Rig) -> None:
    rig.presence.enroll("laptop", "ada")
    rig.connect()
    rec = rig.scheduler.submit(tree(local_read()), user="ada")
    rig.r.set(client_key("laptop", client_queue("laptop")), "not a list")  # the agent wrote it

    assert rig.sweeps.cancel(rec.tree_id) == ["r"]
    assert rig.task(rec.tree_id, "r").state is TaskState.SKIPPED
    assert rig.presence.session("laptop") is None
    assert "queue" in rig.clients.misbehaving.get("laptop").shown()


def test_cancelling_one_task_leaves_its_siblings_running(rig: Rig) -> None:
    rec = rig.scheduler.submit(tree(echo("a"), echo("b")))
    assert rig.sweeps.cancel(rec.tree_id, "a") == ["a"]
    assert rig.task(rec.tree_id, "b").state is TaskState.QUEUED_SERVER
    assert rig.store.get_tree(rec.tree_id).status is TreeStatus.RUNNING


@pytest.mark.parametrize(("kept_days", "left"), [(8, set()), (10, {"a", "stop:a", "b"})])
def test_a_cancelled_trees_runs_leave_the_cancelled_set_once_kept_for_cancelled_kept_s(
    rigs: Callable[..., Rig], kept_days: int, left: set[str]
) -> None:
    # Kept for ever, a night of cancelled batches stayed in Redis for good (a client's counted
    # against its quota). brain.hot.cancelled, tests/unit/brain/hot/test_cancelled.py.
    rig = rigs(cancelled_kept_s=kept_days * 86_400.0)
    rec = rig.scheduler.submit(tree(echo("a"), echo("b")))
    runs = {t: rig.task(rec.tree_id, t).run_id for t in ("a", "b")}
    assert rig.store.begin_run(rec.tree_id, "a", runs["a"], "server@h", rig.clock()) == 1
    rig.sweeps.cancel(rec.tree_id)
    for entry in rig.r.zrange(INDEX_KEY, 0, -1):  # nine days pass
        rig.r.zincrby(INDEX_KEY, -9 * 86_400.0, entry)

    rig.sweeps.run_once()

    named = {"a": runs["a"], "stop:a": stop_member(runs["a"]), "b": runs["b"]}
    assert rig.r.smembers(key_cancelled()) == {named[m].encode() for m in left}
