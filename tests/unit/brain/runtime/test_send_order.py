"""What a submit sends, in what order, and what it reads to route. A tree's ready tasks are
sent highest priority first (brain.core.fairshare.highest_first): a high call written after
thousands of low ones is not sent behind them, where they would start while it is still being
written; within one priority, the tree's order. A tree bound to a client reads that client's
session only."""

from __future__ import annotations

from brain.core.models import SessionKind
from brain.runtime.intake import Intake
from tests.unit.brain.runtime.rig import Rig, echo, local_read, tree
from tests.unit.brain.runtime.test_retries import succeeded


def test_a_trees_high_task_is_sent_before_its_low_ones(rig: Rig) -> None:
    low = [echo(f"l{i}") for i in range(5)]
    rig.scheduler.submit(
        tree(*low, echo("urgent", priority="high"), echo("n", priority="normal"), priority="low")
    )
    assert [c.task_id for c in rig.sent.calls] == ["urgent", "n", "l0", "l1", "l2", "l3", "l4"]


def test_one_priority_keeps_the_trees_order(rig: Rig) -> None:
    rig.scheduler.submit(tree(*(echo(f"t{i}") for i in range(5))))
    assert [c.task_id for c in rig.sent.calls] == ["t0", "t1", "t2", "t3", "t4"]


def test_dependents_made_ready_together_go_highest_first(rig: Rig) -> None:
    rig.scheduler.submit(
        tree(echo("root"), echo("a", depends_on=["root"]), echo("b", depends_on=["root"], priority=9))
    )
    assert [c.task_id for c in rig.sent.calls] == ["root"]
    assert Intake(rig.scheduler).on_result(succeeded(rig.sent.of("root")[-1]))
    assert [c.task_id for c in rig.sent.calls] == ["root", "b", "a"]


def test_a_tree_reads_the_sessions_of_its_own_client_or_users_clients_only(rig: Rig) -> None:
    # Routing a bound tree looks at its own client alone (brain.core.routing): with 1,000
    # clients connected, each interactive submit read every one of their sessions.
    for cid in ("laptop", "desk"):
        rig.presence.enroll(cid, "demo")
        rig.connect(cid, session_id=f"s-{cid}")
    rig.presence.enroll("other", "someone-else")
    rig.connect("other", session_id="s-other")

    def hgetall_calls() -> int:
        return int(rig.r.info("commandstats").get("cmdstat_hgetall", {}).get("calls", 0))

    before = hgetall_calls()
    rig.scheduler.submit(tree(local_read("r")), client_id="desk", user="demo")
    assert hgetall_calls() == before
    assert [c.client_id for c in rig.sent.of("r")] == ["desk"]
    # An unbound tree of the user still chooses among all of its clients, read through the
    # user's index (brain.hot.presence.sessions_for), not every client's session either.
    rig.scheduler.submit(tree(local_read("u")), user="demo")
    assert hgetall_calls() == before
    assert rig.sent.of("u")[-1].client_id in {"laptop", "desk"}


def test_a_server_call_is_sent_at_its_priority_and_a_client_call_at_none(rig: Rig) -> None:
    # With fair share off the pool's queue orders server calls by it (workers.contracts
    # broker_priority): a person's call goes ahead of a batch already queued.
    rig.presence.enroll("laptop", "demo")
    rig.connect("laptop", session_id="s-laptop")
    # (brain.core.fairshare.queue_priority): a person's call ahead of batches, and no batch
    # ahead of people by writing high.
    night = tree(
        echo("night"), echo("sweep", priority="low"), echo("boast", priority="high"), local_read("r")
    )
    rig.scheduler.submit(night, user="demo")
    rig.scheduler.submit(tree(echo("chat"), id="talk"), session=SessionKind.INTERACTIVE, user="demo")
    sent = {c.task_id: rig.sent.priorities[c.run_id] for c in rig.sent.calls}
    assert sent == {"night": 5, "sweep": 2, "boast": 5, "r": None, "chat": 8}
