"""Fan-out over a result (issue 23, item 3): for_each makes one task per item of a
dependency's list at run time. A real scheduler and intake on SQLite and a real redis-server;
Celery is a recorder of the calls sent; the clock is injected."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from brain.core import fanout
from brain.core.models import TaskState, TreeStatus
from brain.runtime.intake import Intake
from brain.runtime.retries import start_due
from tests.unit.brain.runtime.rig import Rig, echo, tree
from tests.unit.brain.runtime.test_retries import failed, succeeded

LIST = {"files": [{"name": "a.txt"}, {"name": "b.txt"}, {"name": "c.txt"}]}


def fan(**fields: object) -> dict:
    return echo(
        "each",
        depends_on=["list"],
        for_each="${tasks.list.result.files}",
        args={"value": "file ${item.name}"},
        **fields,
    )


def gather(**fields: object) -> dict:
    return echo("all", depends_on=["each"], args={"value": "${tasks.each.results}"}, **fields)


def listed(rig: Rig, intake: Intake, value: object = LIST) -> None:
    assert intake.on_result(succeeded(rig.sent.of("list")[-1], value))


def test_one_task_per_item_in_order_and_the_next_task_gets_their_results(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(tree(echo("list"), fan(), gather()))
    listed(rig, intake)
    sent = {c.task_id: c for c in rig.sent.calls}
    assert [sent[f"each[{i}]"].args for i in range(3)] == [{"value": f"file {n}.txt"} for n in "abc"]
    parent = rig.task(rec.tree_id, "each")
    assert parent.state is TaskState.FANNED_OUT and parent.fan_out == 3
    for i in (2, 0, 1):  # whatever order they end in
        assert intake.on_result(succeeded(sent[f"each[{i}]"], f"r{i}"))
    assert rig.task(rec.tree_id, "each").result == ["r0", "r1", "r2"]
    assert rig.sent.of("all")[-1].args == {"value": ["r0", "r1", "r2"]}
    assert intake.on_result(succeeded(rig.sent.of("all")[-1]))
    assert rig.store.get_tree(rec.tree_id).status is TreeStatus.DONE


def test_a_failed_item_fails_its_fan_out_and_run_if_decides_what_that_means(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(
        tree(echo("list"), fan(), gather(), echo("report", depends_on=["each"], run_if="all_done",
                                                 args={"value": "${tasks.each.results}"}))
    )  # fmt: skip
    listed(rig, intake)
    for i in range(3):
        call = rig.sent.of(f"each[{i}]")[-1]
        assert intake.on_result(failed(call, "ToolFailed") if i == 1 else succeeded(call, f"r{i}"))
    parent = rig.task(rec.tree_id, "each")
    assert parent.state is TaskState.FAILED
    assert parent.reason == "1 of 3 items not done: each[1] failed"
    assert rig.task(rec.tree_id, "all").state is TaskState.SKIPPED
    assert rig.sent.of("report")[-1].args == {"value": ["r0", None, "r2"]}


def test_a_result_that_is_not_a_list_or_too_long_fails_the_task_saying_so(rigs: Callable[..., Rig]) -> None:
    rig = rigs(max_fan_out=2)
    intake = Intake(rig.scheduler)
    not_list = rig.scheduler.submit(tree(echo("list"), fan()))
    listed(rig, intake, {"files": {"a": 1}})
    rec = rig.task(not_list.tree_id, "each")
    assert rec.state is TaskState.FAILED and rec.error.type == "FanOutFailed"
    assert rec.reason.startswith("task 'each': for_each ${tasks.list.result.files} is dict, not a list")
    too_long = rig.scheduler.submit(tree(echo("list"), fan()))
    listed(rig, intake)
    assert "has 3 items, over max_fan_out 2" in rig.task(too_long.tree_id, "each").reason
    assert not any(c.task_id.startswith("each[") for c in rig.sent.calls)


def test_an_item_missing_what_its_arguments_ask_fails_the_fan_out_naming_it(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(tree(echo("list"), fan()))
    listed(rig, intake, {"files": [{"name": "a"}, {"size": 3}]})
    assert rig.task(rec.tree_id, "each").reason == "task 'each[1]': ${item.name}: item has no 'name'"


def test_recording_an_item_names_a_few_of_its_siblings_not_all_of_them(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each item's result asks whether a sibling is still unfinished, the last listed first.
    Listing every item's id for each result made a fan-out of N items O(N²) in the pool
    (bench/README.md, ``fan_out_1000``): 1,000 items, a million ids."""
    n = 400
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(tree(echo("list"), fan(), gather()))
    listed(rig, intake, {"files": [{"name": f"f{i}"} for i in range(n)]})
    sent = {c.task_id: c for c in rig.sent.calls}
    named: list[int] = []

    def counted(parent: str, index: int) -> str:
        named.append(index)
        return f"{parent}[{index}]"

    monkeypatch.setattr(fanout, "item_id", counted)  # ItemIds makes each id through it
    for i in range(n):  # in the order they were sent, as a pool mostly ends them
        assert intake.on_result(succeeded(sent[f"each[{i}]"], i))
    assert rig.task(rec.tree_id, "each").result == list(range(n))
    # A probe of 32 per result, and the whole list twice at the end: ~34 per item (was 400).
    assert len(named) <= 40 * n


def test_an_empty_list_ends_the_fan_out_done_at_once(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(tree(echo("list"), fan(), gather()))
    listed(rig, intake, {"files": []})
    assert rig.task(rec.tree_id, "each").state is TaskState.DONE
    assert rig.sent.of("all")[-1].args == {"value": []}


def test_each_item_retries_on_its_own(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(
        tree(echo("list"), fan(retry={"max_attempts": 2, "backoff_s": 5, "jitter": False}))
    )
    listed(rig, intake)
    assert intake.take(failed(rig.sent.of("each[1]")[-1])) is TaskState.RETRYING
    for i in (0, 2):
        assert intake.on_result(succeeded(rig.sent.of(f"each[{i}]")[-1]))
    assert rig.task(rec.tree_id, "each").state is TaskState.FANNED_OUT  # each[1] will try again
    rig.clock.advance(5)
    assert start_due(rig.scheduler) == 1
    assert intake.on_result(succeeded(rig.sent.of("each[1]")[-1], "second"))
    assert rig.task(rec.tree_id, "each").state is TaskState.DONE


def test_items_a_crash_left_unsent_are_sent_by_the_reconcilers_plan(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(tree(echo("list"), fan()))
    sent_before = len(rig.sent.calls)
    rig.sent.send = lambda call, pool=None, priority=None: None  # type: ignore[method-assign] # the broker lost them
    listed(rig, intake)
    del rig.sent.send
    assert len(rig.sent.calls) == sent_before
    assert rig.task(rec.tree_id, "each[0]").state is TaskState.QUEUED_SERVER
    rig.later()
    rig.sweeps.run_once()  # re-sends the lost runs: the items are tasks like any other
    assert {f"each[{i}]" for i in range(3)} <= {c.task_id for c in rig.sent.calls}


def test_cancelling_a_for_each_task_cancels_its_items(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(tree(echo("list"), fan()))
    listed(rig, intake)
    done = rig.sweeps.cancel(rec.tree_id, "each")  # `vancetope cancel TREE each`
    assert sorted(done) == ["each", "each[0]", "each[1]", "each[2]"]
    assert not intake.on_result(succeeded(rig.sent.of("each[0]")[-1]))  # a late item: refused
    assert rig.store.get_tree(rec.tree_id).status is TreeStatus.FAILED


def test_cancelling_a_for_each_task_alone_ends_its_items_in_a_few_store_calls(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two statements for all its items, not two per item (1,000 items were 2,000 writes)."""
    n = 300
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(tree(echo("list"), fan(), gather()))
    listed(rig, intake, {"files": [{"name": f"f{i}"} for i in range(n)]})
    assert intake.on_result(succeeded(rig.sent.of("each[0]")[-1], "r0"))  # one item done already
    calls: list[object] = []
    real = rig.store.end_tasks

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(kwargs.get("among"))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(rig.store, "end_tasks", counted)
    done = rig.sweeps.cancel(rec.tree_id, "each")
    assert sorted(done) == sorted(["each", *(f"each[{i}]" for i in range(1, n))])
    assert len(calls) == 4  # the for_each task (two), its items (two)
    assert rig.task(rec.tree_id, "each[0]").state is TaskState.DONE  # an item that ended stays so
    assert {rig.task(rec.tree_id, f"each[{i}]").state for i in range(1, n)} == {TaskState.SKIPPED}


def test_a_tree_whose_fan_out_ended_early_finishes_when_its_last_item_ends(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(tree(echo("list"), fan()))
    listed(rig, intake)
    # Ended with its items still out (as a crash between the two would leave it).
    rig.store.end_tasks(
        rec.tree_id, from_states={TaskState.FANNED_OUT}, state=TaskState.EXPIRED, reason="x", finished_at=1,
        task_id="each",
    )  # fmt: skip
    for i in range(3):
        assert intake.on_result(succeeded(rig.sent.of(f"each[{i}]")[-1]))
    assert rig.store.get_tree(rec.tree_id).status is TreeStatus.FAILED
