"""Trigger rules (issue 23, item 2): run_if decides, from how its dependencies ended, whether a
task runs; a clean-up or notify task reads their outcome. A real scheduler and intake on
SQLite and a real redis-server; Celery is a recorder of the calls sent."""

from __future__ import annotations

from brain.core.models import TaskState, TreeStatus
from brain.runtime.intake import Intake
from tests.unit.brain.runtime.rig import Rig, echo, tree
from tests.unit.brain.runtime.test_retries import failed, succeeded

NOTIFY_ARGS = {"value": "work ${tasks.work.status}: ${tasks.work.error.message}"}


def night(*extra: dict) -> object:
    return tree(
        echo("work"),
        echo("notify", depends_on=["work"], run_if="any_failed", args=NOTIFY_ARGS),
        echo("cleanup", depends_on=["work"], run_if="all_done"),
        echo("publish", depends_on=["work"]),
        *extra,
    )


def test_after_a_failure_the_clean_up_and_the_notify_run_and_the_tree_is_still_failed(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(night())
    assert intake.take(failed(rig.sent.of("work")[-1], "ToolFailed")) is TaskState.FAILED
    assert rig.task(rec.tree_id, "publish").state is TaskState.SKIPPED
    notify = rig.sent.of("notify")[-1]
    assert notify.args == {"value": "work failed: ToolFailed on purpose"}  # the outcome, read
    assert len(rig.sent.of("cleanup")) == 1
    assert intake.on_result(succeeded(notify)) and intake.on_result(succeeded(rig.sent.of("cleanup")[-1]))
    assert rig.store.get_tree(rec.tree_id).status is TreeStatus.FAILED


def test_on_success_the_notify_is_not_triggered_and_the_tree_is_done(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    # What depends on the notify is not triggered either; none_failed runs past it.
    rec = rig.scheduler.submit(
        night(
            echo("page", depends_on=["notify"]),
            echo("report", depends_on=["notify", "cleanup"], run_if="none_failed"),
        )
    )
    assert intake.on_result(succeeded(rig.sent.of("work")[-1]))
    assert rig.sent.of("notify") == [] and rig.sent.of("page") == []
    notify = rig.task(rec.tree_id, "notify")
    assert notify.state is TaskState.NOT_TRIGGERED
    assert notify.reason == "run_if: any_failed, and no upstream task failed"
    assert rig.task(rec.tree_id, "page").state is TaskState.NOT_TRIGGERED
    for task in ("cleanup", "publish"):
        assert intake.on_result(succeeded(rig.sent.of(task)[-1]))
    assert intake.on_result(succeeded(rig.sent.of("report")[-1]))
    assert rig.store.get_tree(rec.tree_id).status is TreeStatus.DONE


def test_a_fan_in_under_all_done_waits_for_every_dependency(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    members = [f"m{i}" for i in range(40)]  # more than one probe of dependencies
    rec = rig.scheduler.submit(
        tree(*(echo(m) for m in members), echo("sum", depends_on=members, run_if="all_done"))
    )
    for m in members[:-1]:
        result = (
            failed(rig.sent.of(m)[-1], "ToolFailed") if m.endswith("3") else succeeded(rig.sent.of(m)[-1])
        )
        assert intake.on_result(result)
        assert rig.sent.of("sum") == []
    assert intake.on_result(succeeded(rig.sent.of(members[-1])[-1]))
    assert len(rig.sent.of("sum")) == 1
    assert rig.task(rec.tree_id, "sum").state is TaskState.QUEUED_SERVER


def test_the_reconcilers_full_plan_applies_the_same_rules(rig: Rig) -> None:
    """A brain that died between a result and its dependents: the idle-tree sweep plans the
    whole tree, and reaches what the result would have."""
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(night())
    work = rig.sent.of("work")[-1]
    # Recorded as a crashed brain would leave it: the result written, nothing advanced.
    rig.store.transition(rec.tree_id, "work", from_states={TaskState.QUEUED_SERVER}, state=TaskState.DONE)
    assert not intake.on_result(succeeded(work))  # already recorded
    rig.later()
    rig.sweeps.run_once()
    assert rig.task(rec.tree_id, "notify").state is TaskState.NOT_TRIGGERED
    assert len(rig.sent.of("cleanup")) == 1 and len(rig.sent.of("publish")) == 1
