"""A server worker records its own result and dispatches what became ready (brain.runtime.recorder).

Real redis-server, real brain and pool processes, a real client agent.
"""

from __future__ import annotations

from pathlib import Path

from brain.core.models import SessionKind, TaskState, TreeStatus
from tests.conftest import tree, wait_for_tree, wait_until
from tests.integration.test_client_path import make_agent


def _chain(tree_id: str, n: int) -> dict:
    tasks = [{"id": "t0", "tool": "echo", "args": {"value": "v"}}]
    tasks += [
        {
            "id": f"t{i}",
            "tool": "echo",
            "depends_on": [f"t{i - 1}"],
            "args": {"value": f"${{tasks.t{i - 1}.result}}"},
        }
        for i in range(1, n)
    ]
    return {"id": tree_id, "tasks": tasks}


def test_a_server_chain_finishes_while_the_brain_is_stopped(stack_factory, brain_factory) -> None:
    stack = stack_factory(services=("brain", "server-pool"))
    brain = brain_factory(stack)  # as the CLI connects: the registry the brain published
    process = stack.service("brain").process
    assert process is not None
    process.terminate()
    process.wait(timeout=120)

    rec = brain.scheduler.submit(tree(_chain("headless", 5)))
    # Only t0 was sent by submit(); each later hop was dispatched by the worker that ran the one before.
    assert wait_for_tree(brain, rec.tree_id).status is TreeStatus.DONE
    tasks = {t.task_id: t for t in brain.store.get_tasks(rec.tree_id)}
    assert tasks["t4"].result == "v"
    assert all(t.attempt == 1 and t.route == "server" for t in tasks.values())
    assert all(tasks[f"t{i}"].queued_at >= tasks[f"t{i - 1}"].finished_at for i in range(1, 5))


def test_a_client_task_that_a_server_task_made_ready_reaches_the_client_through_the_brain(
    tmp_path: Path, stack_factory, brain_factory
) -> None:
    stack = stack_factory(
        services=("brain", "server-pool", "client-agent"), agent_config=make_agent(tmp_path)
    )
    brain = brain_factory(stack)
    assert stack.wait_connected("laptop", 120)
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "server-then-client",
                "tasks": [
                    {"id": "name", "tool": "text_transform", "args": {"op": "lower", "text": "NOTES.txt"}},
                    {
                        "id": "read",
                        "tool": "read_local_file",
                        "depends_on": ["name"],
                        "args": {"path": "${tasks.name.result}"},
                    },
                ],
            }
        ),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.DONE
    read = brain.store.get_task(rec.tree_id, "read")
    assert read is not None and read.route == "client:laptop" and read.attempt == 1
    assert read.result["content"] == "kept on the laptop\n"


def test_the_brain_publishes_a_client_call_only_for_the_run_the_store_has_queued(
    tmp_path: Path, stack_factory, brain_factory
) -> None:
    """publish_call carries ids only; a stale or forged one sends nothing."""
    stack = stack_factory(services=("brain", "server-pool"), agent_config=make_agent(tmp_path))
    brain = brain_factory(stack)
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "parked",
                "tasks": [{"id": "read", "tool": "read_local_file", "args": {"path": "notes.txt"}}],
            }
        ),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )
    wait_until(lambda: brain.store.get_task(rec.tree_id, "read").state is TaskState.BLOCKED, what="parked")
    assert not brain.scheduler.publish_queued(rec.tree_id, "read", "made-up-run", "laptop")
    assert not brain.scheduler.publish_queued(rec.tree_id, "nope", "made-up-run", "laptop")
