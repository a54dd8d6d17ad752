"""What `vancetope run` and `status` show for a running task with progress (brain.display)."""

from __future__ import annotations

import pytest
from rich.console import Console

from brain.display import progress_text, task_table
from brain.models import Progress, TaskRecord, TaskState, TaskTree, TreeRecord


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
