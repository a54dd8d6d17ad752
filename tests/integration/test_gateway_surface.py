"""Resources, prompts and completion through the gateway and in trees (issue 24, item 1).

A real stack: the brain runs the MCP project's reference server from npm
(``@modelcontextprotocol/server-everything``, as "everything"); ada's workstation "laptop"
runs a notes vault (``tests/fixtures/mcp_vault_server.py``, as "vault") from its mcp.json,
and the registry declares ``vault#read_resource`` a client tool that queues, so that a night
batch's read of the vault parks while the laptop is closed. Real MCP clients (the SDK's
streamable-HTTP client), a real client agent process; every wait bounded.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from brain.core.models import SessionKind, TaskState, TreeStatus
from brain.core.submission import SubmitRequest
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack
from tests.conftest import (
    EXAMPLES,
    FIXTURES,
    agent_with_servers,
    npm_binary,
    tree,
    wait_for_tree,
    write_mcp_config,
)
from tests.integration.test_gateway import INSPECTOR_PACKAGE, inspect, mcp_client, start_gateway, token_for

pytestmark = pytest.mark.integration

NOTES = {"groceries": "# Groceries\n\n- oat milk\n- lemons\n", "garden": "# Garden\n\nprune the roses\n"}


@pytest.fixture(scope="module")
def world(
    module_stack_factory: Callable[..., EmbeddedStack],
    tmp_path_factory: pytest.TempPathFactory,
    everything_server: dict[str, Any],
) -> tuple[EmbeddedStack, str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("surface")
    vault = tmp / "vault"
    vault.mkdir()
    for name, text in NOTES.items():
        (vault / f"{name}.md").write_text(text)
    registry = yaml.safe_load((EXAMPLES / "registry.yaml").read_text())
    registry["tools"].append(
        {
            "name": "vault#read_resource",
            "location": "client",
            "mcp_server": "vault",
            "offline_strategy": "queue",
        }
    )
    (tmp / "registry.yaml").write_text(yaml.safe_dump(registry))
    vault_entry = {"command": sys.executable, "args": [str(FIXTURES / "mcp_vault_server.py"), str(vault)]}
    stack = module_stack_factory(
        agent_config=agent_with_servers(tmp, {"vault": vault_entry}),
        mcp_config=write_mcp_config(tmp / "server-mcp.json", {"everything": everything_server}),
        registry=tmp / "registry.yaml",
    )
    assert stack.wait_connected("laptop", 120)
    return stack, start_gateway(stack), everything_server


def test_resources_and_prompts_of_the_brains_server_and_adas_vault_are_listed_and_read_whole(
    world: tuple[EmbeddedStack, str, dict[str, Any]],
) -> None:
    stack, url, everything = world

    async def direct() -> dict[str, Any]:
        """What the everything server says to a client of its own (the same binary)."""
        params = StdioServerParameters(command=everything["command"], args=everything["args"])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as mcp:
            await mcp.initialize()
            resources = (await mcp.list_resources()).resources
            text = next(r for r in resources if (r.mime_type or "").startswith("text/"))
            prompts = (await mcp.list_prompts()).prompts
            simple = next(p for p in prompts if not any(a.required for a in p.arguments or []))
            return {
                "uris": {str(r.uri) for r in resources},
                "text": text,
                "read": await mcp.read_resource(text.uri),
                "prompt": simple.name,
                "got": await mcp.get_prompt(simple.name),
            }

    async def through_gateway(want: dict[str, Any]) -> dict[str, Any]:
        async with mcp_client(url, token_for(stack, "ada")) as mcp:
            return {
                "uris": {str(r.uri) for r in (await mcp.list_resources()).resources},
                "templates": {
                    t.uri_template for t in (await mcp.list_resource_templates()).resource_templates
                },
                "prompts": {p.name for p in (await mcp.list_prompts()).prompts},
                "read": await mcp.read_resource(want["text"].uri),
                "note": await mcp.read_resource("note://groceries"),
                "by_template": await mcp.read_resource("note://garden"),
                "got": await mcp.get_prompt(want["prompt"]),
                "summary": await mcp.get_prompt("summarize_note", {"name": "garden"}),
                "completed": await mcp.complete(
                    types.PromptReference(type="ref/prompt", name="summarize_note"),
                    {"name": "name", "value": "g"},
                ),
                "tools": {t.name for t in (await mcp.list_tools()).tools},
            }

    want = anyio.run(direct)
    got = anyio.run(through_gateway, want)
    # Every resource of the brain's server and the vault's notes, under their own URIs.
    assert want["uris"] <= got["uris"]
    assert {"note://groceries", "note://garden"} <= got["uris"]
    assert "note://{name}" in got["templates"]
    assert {want["prompt"], "summarize_note"} <= got["prompts"]
    # Read whole, as the server itself answers its own client.
    assert got["read"].model_dump(mode="json") == want["read"].model_dump(mode="json")
    assert got["note"].contents[0].text == NOTES["groceries"]  # type: ignore[union-attr]
    assert got["by_template"].contents[0].text == NOTES["garden"]  # type: ignore[union-attr]
    assert got["got"].model_dump(mode="json") == want["got"].model_dump(mode="json")
    assert "prune the roses" in got["summary"].messages[0].content.text  # type: ignore[union-attr]
    assert got["completed"].completion.values == ["garden", "groceries"]
    # Routed as tools, never listed as tools.
    assert not [name for name in got["tools"] if "#" in name]


def test_an_unknown_resource_and_an_unknown_prompt_are_protocol_errors(
    world: tuple[EmbeddedStack, str, dict[str, Any]],
) -> None:
    stack, url, _ = world

    async def scenario() -> list[MCPError]:
        errors = []
        async with mcp_client(url, token_for(stack, "ada")) as mcp:
            for ask in (
                lambda: mcp.read_resource("note://nowhere"),  # the vault's template matches: the vault says
                lambda: mcp.read_resource("gopher://nothing/at/all"),  # nobody's
                lambda: mcp.get_prompt("no_such_prompt"),
            ):
                with pytest.raises(MCPError) as caught:
                    await ask()
                errors.append(caught.value)
        return errors

    vault_said, nobody, no_prompt = anyio.run(scenario)
    # The vault's own words and code (MCPServer: -32603), and the tree that routed the read.
    assert vault_said.error.code == -32603 and "note://nowhere" in vault_said.error.message
    assert "(tree mcp-vault" in vault_said.error.message
    assert nobody.error.code == -32002 and "gopher://nothing/at/all" in nobody.error.message
    assert no_prompt.error.code == types.INVALID_PARAMS and "summarize_note" in no_prompt.error.message


def test_a_night_batch_reads_the_vault_and_parks_while_the_laptop_is_closed(
    world: tuple[EmbeddedStack, str, dict[str, Any]],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    stack, url, _ = world
    brain = brain_factory(stack)
    night = tree(
        {
            "id": "vault-night",
            "tasks": [
                {
                    "id": "notes",
                    "tool": "read_resource",
                    "args": {"server": "vault", "uri": "note://groceries"},
                },
                {
                    "id": "shout",
                    "tool": "text_transform",
                    "depends_on": ["notes"],
                    "args": {"op": "upper", "text": "${tasks.notes.result.contents.0.text}"},
                },
            ],
        }
    )
    # Connected: read on the workstation, then used by a server task.
    accepted = brain.scheduler.accept(
        SubmitRequest(tree=night, source="test", session=SessionKind.AUTONOMOUS, user="ada")
    )
    done = wait_for_tree(brain, accepted.record.tree_id, 120)
    tasks = {t.task_id: t for t in brain.store.get_tasks(done.tree_id)}
    assert done.status is TreeStatus.DONE, tasks
    assert tasks["notes"].tool == "vault#read_resource" and tasks["notes"].client_id == "laptop"
    assert tasks["shout"].result == NOTES["groceries"].upper()

    # The laptop closes: the same night parks its read, and runs it when the laptop is back.
    agent = stack.service("client-agent").process
    assert agent is not None
    os.killpg(agent.pid, 9)
    # Through the gateway meanwhile: the vault's note is nobody's now, and the error says which
    # of ada's clients is offline.
    anyio.run(_until_listed, url, token_for(stack, "ada"), "note://groceries", False)
    offline = anyio.run(_read_error, url, token_for(stack, "ada"), "note://groceries")
    assert offline.error.code == -32002 and "'laptop' are offline" in offline.error.message
    parked = brain.scheduler.accept(
        SubmitRequest(tree=night, source="test", session=SessionKind.AUTONOMOUS, user="ada")
    ).record.tree_id
    anyio.run(_until, lambda: _state(brain, parked, "notes") is TaskState.PENDING_CLIENT, 60.0)
    stack.start_service("client-agent")
    assert stack.wait_connected("laptop", 120)
    again = wait_for_tree(brain, parked, 120)
    assert again.status is TreeStatus.DONE
    assert brain.store.get_task(parked, "shout").result == NOTES["groceries"].upper()  # type: ignore[union-attr]


async def _until_listed(url: str, token: str, uri: str, listed: bool, timeout: float = 120) -> None:
    """Until resources/list shows ``uri`` (or, with ``listed`` False, no longer does): the
    brain has seen the laptop come or go."""
    async with mcp_client(url, token) as mcp:
        with anyio.fail_after(timeout):
            while (uri in {str(r.uri) for r in (await mcp.list_resources()).resources}) is not listed:
                await anyio.sleep(0.2)


async def _read_error(url: str, token: str, uri: str) -> MCPError:
    async with mcp_client(url, token) as mcp:
        with pytest.raises(MCPError) as caught:
            await mcp.read_resource(uri)
    return caught.value


@pytest.fixture(scope="session")
def inspector_cli() -> Path:
    return npm_binary(INSPECTOR_PACKAGE, "mcp-inspector", "the gateway's Inspector tests")


def test_the_inspector_cli_lists_and_reads_resources_and_gets_a_prompt(
    world: tuple[EmbeddedStack, str, dict[str, Any]], inspector_cli: Path, tmp_path: Path
) -> None:
    inspector = inspector_cli
    stack, url, _ = world
    token = token_for(stack, "ada")
    anyio.run(_until_listed, url, token, "note://garden", True)  # the laptop is (back) on line
    listed = inspect(inspector, url, token, tmp_path, "--method", "resources/list")
    assert "note://garden" in {r["uri"] for r in listed["resources"]}
    read = inspect(inspector, url, token, tmp_path, "--method", "resources/read", "--uri", "note://garden")
    assert read["contents"][0]["text"] == NOTES["garden"]
    prompts = inspect(inspector, url, token, tmp_path, "--method", "prompts/list")
    assert "summarize_note" in {p["name"] for p in prompts["prompts"]}
    got = inspect(
        inspector, url, token, tmp_path, "--method", "prompts/get", "--prompt-name", "summarize_note",
        "--prompt-args", "name=groceries",
    )  # fmt: skip
    assert "oat milk" in got["messages"][0]["content"]["text"]


def _state(brain: Brain, tree_id: str, task_id: str) -> TaskState | None:
    rec = brain.store.get_task(tree_id, task_id)
    return rec.state if rec else None


async def _until(check: Callable[[], bool], timeout: float) -> None:
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(0.1)
