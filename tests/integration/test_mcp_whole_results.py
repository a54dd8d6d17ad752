"""An MCP tool's whole result reaches the task record on both routes (issue 10, item 1).

Against the MCP project's reference server from npm (``@modelcontextprotocol/server-everything``),
configured once server-side (mcpServers JSON) and once in a client agent's mcp.json: an image
beside text, an embedded resource, structured content beside its text; ``${tasks.x.result}``
stays the convenient value and ``${tasks.x.mcp...}`` reaches the blocks.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from brain.core.models import SessionKind, TaskRecord, TreeStatus
from brain.stack.embedded import EmbeddedStack
from tests.conftest import agent_with_servers, tree, wait_for_tree, write_mcp_config

TASKS: list[dict[str, Any]] = [
    {"id": "img", "tool": "get-tiny-image"},
    {"id": "weather", "tool": "get-structured-content", "args": {"location": "Chicago"}},
    {"id": "doc", "tool": "get-resource-reference", "args": {"resourceType": "Text", "resourceId": 1}},
    {  # a built-in on the server, fed from the blocks and the value of either route
        "id": "said",
        "tool": "text_transform",
        "depends_on": ["img", "weather"],
        "args": {
            "op": "upper",
            "text": "${tasks.img.mcp.content.1.mimeType} ${tasks.weather.result.conditions}",
        },
    },
]


def check_records(tasks: dict[str, TaskRecord], where: str) -> None:
    img = tasks["img"]
    assert img.route.startswith(where) and img.mcp is not None
    kinds = [block["type"] for block in img.mcp["content"]]
    assert "image" in kinds and "text" in kinds  # the image is kept beside the text
    image = img.mcp["content"][kinds.index("image")]
    assert image["mimeType"] == "image/png" and len(image["data"]) > 100
    assert isinstance(img.result, str) and img.result  # the convenient value: the text

    weather = tasks["weather"]
    assert weather.mcp is not None
    assert weather.result == weather.mcp["structuredContent"]  # structured content is the value...
    assert weather.mcp["content"][0]["type"] == "text"  # ...and the text sits beside it
    assert json.loads(weather.mcp["content"][0]["text"]) == weather.result

    doc = tasks["doc"]
    assert doc.mcp is not None
    resources = [b for b in doc.mcp["content"] if b["type"] == "resource"]
    assert (
        resources
        and resources[0]["resource"]["uri"].startswith("demo://")
        and resources[0]["resource"]["text"]
    )

    assert tasks["said"].route == "server"
    assert tasks["said"].result == f"image/png {weather.result['conditions']}".upper()


# Two stacks for the module, one per route: each test submits a tree of its own and reads only
# that tree's records (the cap test needs a stack of its own: its max_result_bytes).
@pytest.fixture(scope="module")
def server_stack(
    tmp_path_factory: pytest.TempPathFactory, module_stack_factory: Any, everything_server: dict[str, Any]
) -> EmbeddedStack:
    where = tmp_path_factory.mktemp("server-route")
    config = write_mcp_config(where / "server-mcp.json", {"everything": everything_server})
    return module_stack_factory(services=("brain", "server-pool"), mcp_config=config)


@pytest.fixture(scope="module")
def client_stack(
    tmp_path_factory: pytest.TempPathFactory, module_stack_factory: Any, everything_server: dict[str, Any]
) -> EmbeddedStack:
    """Client agent "laptop" with the everything server in its mcp.json, none server-side."""
    where = tmp_path_factory.mktemp("client-route")
    stack = module_stack_factory(
        services=("brain", "server-pool", "client-agent"),
        agent_config=agent_with_servers(where, {"everything": everything_server}),
        mcp_config=write_mcp_config(where / "server-mcp.json", {}),
    )
    assert stack.wait_connected("laptop", 120)
    return stack


def test_whole_results_on_the_server_route(server_stack: EmbeddedStack, brain_factory) -> None:
    brain = brain_factory(server_stack)
    rec = brain.scheduler.submit(tree({"id": "whole-server", "tasks": TASKS}))
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.DONE
    check_records({t.task_id: t for t in brain.store.get_tasks(rec.tree_id)}, "server")


def test_whole_results_on_the_client_route(client_stack: EmbeddedStack, brain_factory) -> None:
    brain = brain_factory(client_stack)
    # The client's echo shares its bare name with the built-in: named by its server it goes
    # to the client with its own schema (issue 10 item 3), the bare name stays the built-in.
    theirs = {"id": "theirs", "tool": "everything.echo", "args": {"message": "hi"}}
    builtin = {"id": "builtin", "tool": "echo", "args": {"value": "plain"}}
    rec = brain.scheduler.submit(
        tree({"id": "whole-client", "tasks": [*TASKS, theirs, builtin]}),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )
    done = wait_for_tree(brain, rec.tree_id, timeout=120)
    assert done.status is TreeStatus.DONE, [
        (t.task_id, t.state, t.reason) for t in brain.store.get_tasks(rec.tree_id)
    ]
    tasks = {t.task_id: t for t in brain.store.get_tasks(rec.tree_id)}
    check_records(tasks, "client:laptop")
    assert (tasks["theirs"].route, tasks["theirs"].result) == ("client:laptop", "Echo: hi")
    assert (tasks["builtin"].route, tasks["builtin"].result) == ("server", "plain")


@pytest.mark.parametrize("cap", [2000])
def test_a_result_over_the_cap_is_refused_whole_naming_its_biggest_block(
    tmp_path: Path, stack_factory, brain_factory, everything_server, cap: int
) -> None:
    config = write_mcp_config(tmp_path / "server-mcp.json", {"everything": everything_server})
    stack = stack_factory(services=("brain", "server-pool"), mcp_config=config, max_result_bytes=cap)
    brain = brain_factory(stack)
    rec = brain.scheduler.submit(tree({"id": "too-big", "tasks": [{"id": "img", "tool": "get-tiny-image"}]}))
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.FAILED
    img = brain.store.get_task(rec.tree_id, "img")
    assert img is not None and img.error is not None and img.error.type == "ResultTooLarge"
    assert "image" in img.error.message and f"over the cap of {cap} bytes" in img.error.message
    assert img.mcp is None and img.result is None  # refused whole, never cut


def _watch_progress(brain, tree_id: str, task_id: str) -> list[tuple[float, float | None]]:
    """Progress values seen in the task record while the task runs, until the tree ends."""
    seen: list[tuple[float, float | None]] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rec = brain.store.get_task(tree_id, task_id)
        if rec.progress is not None and (rec.progress.progress, rec.progress.total) not in seen:
            seen.append((rec.progress.progress, rec.progress.total))
        if brain.store.get_tree(tree_id).status is not TreeStatus.RUNNING:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"tree {tree_id} did not end; progress seen {seen}")


LONG = {"id": "long", "tool": "trigger-long-running-operation", "args": {"duration": 2, "steps": 4}}


def test_progress_reaches_the_task_record_while_it_runs_on_the_server(
    server_stack: EmbeddedStack, brain_factory
) -> None:
    brain = brain_factory(server_stack)
    rec = brain.scheduler.submit(tree({"id": "progress-server", "tasks": [LONG]}))
    seen = _watch_progress(brain, rec.tree_id, "long")
    assert len(seen) >= 2 and seen[-1] == (4, 4)  # several steps seen while it ran, then the last
    done = brain.store.get_task(rec.tree_id, "long")
    assert done.state.value == "done" and done.progress is not None and done.progress.total == 4


def test_progress_reaches_the_task_record_while_it_runs_on_a_client(
    client_stack: EmbeddedStack, brain_factory
) -> None:
    brain = brain_factory(client_stack)
    rec = brain.scheduler.submit(
        tree({"id": "progress-client", "tasks": [LONG]}), session=SessionKind.INTERACTIVE, client_id="laptop"
    )
    seen = _watch_progress(brain, rec.tree_id, "long")
    assert len(seen) >= 2 and seen[-1] == (4, 4)
    assert brain.store.get_task(rec.tree_id, "long").route == "client:laptop"
