"""Which results a server pool records itself (``brain.runtime.recorder.routes_here``): only those whose
dependents all route without presence, which the pool's Redis user cannot read (issue 20, M6).
The others go to the brain unrecorded. Real scheduler, store and registry."""

from __future__ import annotations

from typing import Any

import pytest

from brain.runtime.recorder import routes_here
from brain.runtime.service import Brain
from tests.conftest import tree
from workers.contracts import ToolResult

pytestmark = pytest.mark.integration


def submitted(brain: Brain, dependent: dict[str, Any]) -> str:
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "t",
                "tasks": [
                    {"id": "first", "tool": "text_transform", "args": {"op": "upper", "text": "a"}},
                    {"id": "next", "depends_on": ["first"], **dependent},
                ],
            }
        )
    )
    return rec.tree_id


def result(tree_id: str, ok: bool = True) -> ToolResult:
    return ToolResult(
        run_id="r", tree_id=tree_id, task_id="first", tool="text_transform", ok=ok, value="A",
        started_at=0, finished_at=0,
    )  # fmt: skip


def test_a_result_whose_dependents_run_on_the_server_is_recorded_in_the_pool(brain_on_redis: Brain) -> None:
    tree_id = submitted(brain_on_redis, {"tool": "text_transform", "args": {"op": "upper", "text": "b"}})
    assert routes_here(brain_on_redis.scheduler, result(tree_id))


@pytest.mark.parametrize(
    "dependent",
    [
        {"tool": "read_local_file", "args": {"path": "a"}},  # a client tool: whose client?
        {"tool": "list_directory", "args": {"path": "."}},  # client, queued when offline
        {"tool": "some_tool_only_a_client_announced", "args": {}},  # not in the registry
    ],
    ids=["client tool", "offline strategy", "announced only"],
)
def test_a_result_whose_dependent_needs_presence_goes_to_the_brain(
    brain_on_redis: Brain, dependent: dict[str, Any]
) -> None:
    tree_id = submitted(brain_on_redis, dependent)
    assert not routes_here(brain_on_redis.scheduler, result(tree_id))
    # a failure may run its dependents too (run_if: all_done, any_failed): the same rule
    assert not routes_here(brain_on_redis.scheduler, result(tree_id, ok=False))


def test_a_result_for_an_unknown_tree_is_left_to_on_result(brain_on_redis: Brain) -> None:
    assert routes_here(brain_on_redis.scheduler, result("no-such-tree"))
