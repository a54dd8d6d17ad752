"""Fan-out end to end (issue 23, item 3): a real stack with a real client agent. A list from
a server task fans out over a client tool (the workstation reads each file) and a server
tool, item by item; a last task reads every result, in order."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from brain.core.models import SessionKind, TaskState, TreeStatus
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack
from tests.conftest import brain_with_client, tree, wait_for_tree

pytestmark = pytest.mark.integration

N = 50


def test_fifty_items_over_a_client_tool_and_a_server_tool_end_with_fifty_results_in_order(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    brain = brain_with_client(stack_factory, brain_factory, tmp_path, {})
    names = [f"note-{i:02d}.txt" for i in range(N)]
    for name in names:
        (tmp_path / "sandbox" / name).write_text(f"text of {name}")
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "fan",
                "tasks": [
                    {"id": "list", "tool": "echo", "args": {"value": {"files": names}}},
                    {
                        "id": "read",  # on the workstation, one call per file
                        "tool": "read_local_file",
                        "depends_on": ["list"],
                        "for_each": "${tasks.list.result.files}",
                        "as": "file",
                        "args": {"path": "${file}"},
                    },
                    {
                        "id": "shout",  # on the server, one call per file read
                        "tool": "text_transform",
                        "depends_on": ["read"],
                        "for_each": "${tasks.read.results}",
                        "args": {"op": "upper", "text": "${item.content}"},
                    },
                    {
                        "id": "all",
                        "tool": "echo",
                        "depends_on": ["shout"],
                        "args": {"value": "${tasks.shout.results}"},
                    },
                ],
            }
        ),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )
    done = wait_for_tree(brain, rec.tree_id, timeout=180)
    tasks = {t.task_id: t for t in brain.store.get_tasks(rec.tree_id)}
    assert done.status is TreeStatus.DONE, {
        k: (t.state.value, t.reason) for k, t in tasks.items() if t.state is not TaskState.DONE
    }
    assert tasks["all"].result == [f"TEXT OF {name.upper()}" for name in names]
    assert {tasks[f"read[{i}]"].route for i in range(N)} == {"client:laptop"}
    assert {tasks[f"shout[{i}]"].route for i in range(N)} == {"server"}
    assert tasks["read"].fan_out == N and tasks["shout"].state is TaskState.DONE
    assert len(tasks) == 4 + 2 * N  # every item recorded once


def test_a_list_over_max_fan_out_fails_its_task_and_makes_no_item(
    stack_factory: Callable[..., EmbeddedStack], brain_factory: Callable[[EmbeddedStack], Brain]
) -> None:
    brain = brain_factory(stack_factory(services=("brain", "server-pool")))
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "too-many",
                "tasks": [
                    {"id": "list", "tool": "echo", "args": {"value": list(range(1001))}},
                    {"id": "each", "tool": "echo", "depends_on": ["list"], "for_each": "${tasks.list.result}",
                     "args": {"value": "${item}"}},
                ],
            }
        )
    )  # fmt: skip
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.FAILED
    each = brain.store.get_task(rec.tree_id, "each")
    assert each.error.type == "FanOutFailed" and "has 1001 items, over max_fan_out 1000" in each.error.message
    assert [t.task_id for t in brain.store.get_tasks(rec.tree_id)] == ["list", "each"]
