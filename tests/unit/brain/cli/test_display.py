"""What `vancetope run` and `status` show for a running task with progress (brain.cli.display)."""

from __future__ import annotations

import pytest
from rich.console import Console

from brain.cli.display import progress, progress_text, some_ids, task_table, trees_table
from brain.core.models import Progress, TaskRecord, TaskState, TaskTree, TreeRecord


@pytest.mark.parametrize(
    ("progress", "shown"),
    [
        (Progress(progress=2, total=4, message="copying", at=0), "2/4 (50%) copying"),
        (Progress(progress=3, total=None, message=None, at=0), "3"),
        (Progress(progress=0.5, total=1, message=None, at=0), "0.5/1 (50%)"),
    ],
)
def test_progress_reads_as_a_fraction_with_its_message(progress: Progress, shown: str) -> None:
    assert progress_text(progress) == shown


def test_the_task_table_shows_a_running_task_s_progress() -> None:
    tree = TaskTree.model_validate({"id": "t", "tasks": [{"id": "long", "tool": "x"}]})
    record = TreeRecord(tree_id="t-1", tree=tree, submitted_at=0)
    rec = TaskRecord(
        tree_id="t-1",
        task_id="long",
        tool="x",
        state=TaskState.QUEUED_SERVER,
        run_id="r1",
        progress=Progress(progress=1, total=4, message="step one", at=0),
    )
    console = Console(width=200, record=True)
    console.print(task_table(record, [rec], {"long": {"run_id": "r1"}}))
    assert "1/4 (25%) step one" in console.export_text()


def test_a_result_that_looks_like_markup_is_shown_as_written() -> None:
    tree = TaskTree.model_validate({"id": "t", "tasks": [{"id": "said", "tool": "echo"}]})
    record = TreeRecord(tree_id="t-1", tree=tree, submitted_at=0)
    rec = TaskRecord(
        tree_id="t-1", task_id="said", tool="echo", state=TaskState.DONE, result="see [/x] [bold]b"
    )
    console = Console(width=200, record=True)
    console.print(task_table(record, [rec], {}))  # rich.errors.MarkupError before
    assert "see [/x] [bold]b" in console.export_text()


def test_the_tree_list_never_cuts_a_tree_id_on_a_narrow_terminal() -> None:
    tree = TaskTree.model_validate({"id": "t", "tasks": [{"id": "a", "tool": "x"}]})
    tree_id = "an-unusually-long-tree-name-20261201-113649-4f2a9c"
    console = Console(width=80, record=True)
    console.print(trees_table([TreeRecord(tree_id=tree_id, tree=tree, submitted_at=0)], {}))
    text = console.export_text()
    assert "…" not in text
    assert tree_id in "".join(line.split("│")[1].strip() for line in text.splitlines() if line.count("│") > 2)


@pytest.mark.parametrize(
    ("state", "deliveries", "mark_run", "shown"),
    [
        (TaskState.QUEUED_SERVER, 0, None, "queued_server"),  # waiting in the pool's queue
        (TaskState.RUNNING, 1, None, "running"),  # a worker or agent began it (the store says)
        (TaskState.RUNNING, 2, "r0", "running"),  # ... whatever an older run's mark says
        (TaskState.AWAITING_APPROVAL, 0, "r1", "awaiting_approval"),  # begun, then held for its user
        (TaskState.QUEUED_SERVER, 1, None, "running"),  # counted by a pool that left it queued
        (TaskState.QUEUED_CLIENT, 0, "r1", "running"),  # an older agent began this run (Redis says)
        (TaskState.QUEUED_SERVER, 0, "r1", "running"),  # a worker that could not reach the store
        (TaskState.QUEUED_CLIENT, 0, "r0", "queued_client"),  # a mark of an older run
        (TaskState.DONE, 1, "r1", "done"),  # final states are shown as they are
    ],
)
def test_a_task_shows_running_once_a_worker_began_its_current_run(
    state: TaskState, deliveries: int, mark_run: str | None, shown: str
) -> None:
    from brain.cli.display import shown_state

    rec = TaskRecord(tree_id="t", task_id="a", tool="echo", state=state, run_id="r1", deliveries=deliveries)
    running = {"a": {"run_id": mark_run}} if mark_run else {}
    assert shown_state(rec, running) == shown


def test_at_80_columns_a_result_is_one_line_and_the_bar_has_a_line_of_its_own() -> None:
    """Issue 22: a result wrapped over five lines; the table's title printed on the bar's line."""
    tree = TaskTree.model_validate({"id": "t", "tasks": [{"id": "read", "tool": "read_local_file"}]})
    record = TreeRecord(tree_id="t-1", tree=tree, submitted_at=0)
    done = TaskRecord(
        tree_id="t-1",
        task_id="read",
        tool="read_local_file",
        route="client:laptop",
        state=TaskState.DONE,
        result={"content": "word " * 200},
        started_at=1,
        finished_at=2.5,
    )
    console = Console(width=80, record=True)
    console.print(progress(record, [done], {}))
    lines = console.export_text().splitlines()
    bar = next(i for i, line in enumerate(lines) if "━━━━" in line)
    assert set(lines[bar].strip()) <= {"━", "╸", "╺"}, lines[bar]
    assert lines[bar + 1].startswith("tree t-1"), lines
    preview = [line for line in lines if '{"content"' in line]
    assert len(preview) == 1 and "…" in preview[0], lines
    assert lines[-1].strip() == "whole results: vancetope status t-1 TASK (or --json)"


def test_a_long_list_of_ids_shows_the_first_twenty_and_how_many_more() -> None:
    assert some_ids(["a", "b"]) == "a, b"
    assert some_ids([]) == ""
    many = [f"each[{i}]" for i in range(5000)]
    shown = some_ids(many)
    assert shown.startswith("each[0], each[1], ") and shown.endswith("each[19] … and 4,980 more")
