"""What an MCP server offers beside tools, as surface tools (workers/mcp_surface.py), against
real SDK servers connected in-process."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.types import (
    Completion,
    CompletionArgument,
    CompletionContext,
    PromptReference,
    ResourceTemplateReference,
)

from brain.core.models import TaskSpec
from workers import mcp_surface
from workers.contracts import surface_op, surface_tool


def vault() -> MCPServer:
    app = MCPServer("vault")

    @app.resource("note://garden", name="garden", mime_type="text/markdown")
    def garden() -> str:
        return "prune the roses"

    @app.resource("note://{name}", name="note")
    def note(name: str) -> str:
        return f"note {name}"

    @app.prompt()
    def summarize(name: str) -> str:
        return f"Summarize {name}"

    @app.completion()
    async def complete(
        ref: PromptReference | ResourceTemplateReference,
        argument: CompletionArgument,
        context: CompletionContext | None,
    ) -> Completion:
        return Completion(values=[v for v in ("garden", "groceries") if v.startswith(argument.value)])

    return app


def tools_only() -> MCPServer:
    app = MCPServer("plain")

    @app.tool()
    def add(a: int, b: int) -> int:
        return a + b

    return app


async def _surface(server: MCPServer) -> list[Any]:
    async with Client(server) as client:
        return await mcp_surface.list_surface("vault", client)


def test_a_server_of_resources_prompts_and_completion_is_three_surface_tools_with_what_it_listed() -> None:
    found = {d.name: d for d in anyio.run(_surface, vault())}
    assert set(found) == {"vault#read_resource", "vault#get_prompt", "vault#complete"}
    read = found["vault#read_resource"].surface
    assert read is not None and [r["uri"] for r in read.resources] == ["note://garden"]
    assert [t["uriTemplate"] for t in read.resource_templates] == ["note://{name}"]
    prompt = found["vault#get_prompt"].surface
    assert prompt is not None and [p["name"] for p in prompt.prompts] == ["summarize"]
    assert all(d.mcp_server == "vault" for d in found.values())


def test_a_server_of_tools_only_has_no_surface_tool() -> None:
    # MCPServer declares resources and prompts whatever it has: nothing listed, nothing offered.
    assert anyio.run(_surface, tools_only()) == []


def test_each_request_returns_the_mcp_result_as_json() -> None:
    async def run() -> list[dict[str, Any]]:
        async with Client(vault()) as client:
            return [
                await mcp_surface.request("vault", client, "read_resource", {"uri": "note://groceries"}),
                await mcp_surface.request(
                    "vault", client, "get_prompt", {"name": "summarize", "arguments": {"name": "x"}}
                ),
                await mcp_surface.request(
                    "vault",
                    client,
                    "complete",
                    {
                        "ref": {"type": "ref/prompt", "name": "summarize"},
                        "argument": {"name": "name", "value": "gr"},
                    },
                ),
            ]

    read, prompt, completed = anyio.run(run)
    assert (
        read["contents"][0]["text"] == "note groceries" and read["contents"][0]["uri"] == "note://groceries"
    )
    assert prompt["messages"][0]["content"]["text"] == "Summarize x"
    assert completed["completion"]["values"] == ["groceries"]


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("vault#read_resource", ("vault", "read_resource")),
        ("my.server#get_prompt", ("my.server", "get_prompt")),
        ("vault#erase", None),  # not a surface op
        ("#read_resource", None),
        ("read_resource", None),
    ],
)
def test_a_surface_tool_name_says_its_server_and_request(name: str, parsed: tuple[str, str] | None) -> None:
    assert surface_op(name) == parsed
    if parsed is not None:
        assert surface_tool(*parsed) == name


def test_a_tree_reads_a_resource_of_a_named_server_as_that_servers_surface_tool() -> None:
    task = TaskSpec.model_validate(
        {"id": "n", "tool": "read_resource", "args": {"server": "vault", "uri": "note://a"}}
    )
    assert (task.tool, task.args) == ("vault#read_resource", {"uri": "note://a"})
    for args in ({"uri": "note://a"}, {"server": "${tasks.x.result}", "uri": "note://a"}):
        with pytest.raises(ValueError, match="read_resource needs args.server"):
            TaskSpec.model_validate({"id": "n", "tool": "read_resource", "args": args})
