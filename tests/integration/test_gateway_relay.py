"""What an MCP server says while a gateway call runs, relayed to the MCP client that made the
call (issue 24), on both routes: progress one by one, log messages filtered by the session's
logging/setLevel, sampling and elicitation put to the MCP client and answered; inside a tree
the same tools fail saying why. A real stack (redis-server, brain, server pool) whose brain runs
the talk and rich fixture servers, ada's laptop (a real client agent) running them too, the
real gateway, and the SDK's MCP client with sampling and elicitation callbacks.

Every wait is bounded; nothing sleeps to wait for readiness.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import pytest
import redis
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from brain.core.models import SessionKind, TaskRecord, TaskState, TaskTree
from brain.runtime.enrollment import enroll
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack
from tests.conftest import FIXTURES, agent_with_servers, wait_for_tree, wait_until, write_mcp_config
from tests.integration.test_gateway import start_gateway, text_of, token_for
from workers.contracts import CLIENT_OUTBOX, ClientToolAsk, ToolAsk, client_answer_key, client_key

pytestmark = [
    pytest.mark.integration,
    # logging/setLevel, sampling and elicitation: the SDK deprecates them as of 2026-07-28
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]


def fixture_server(name: str) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(FIXTURES / name)]}


@pytest.fixture(scope="module")
def talk(
    module_stack_factory: Callable[..., EmbeddedStack], tmp_path_factory: pytest.TempPathFactory
) -> tuple[EmbeddedStack, str, dict[str, str]]:
    """The stack, its gateway, and each route's name of each tool: ``server:chatty`` is the
    brain's, ``client:chatty`` the laptop's (whatever separator the catalog uses)."""
    tmp = tmp_path_factory.mktemp("talk")
    servers = {"talk": fixture_server("mcp_talk_server.py"), "rich": fixture_server("mcp_rich_server.py")}
    stack = module_stack_factory(
        agent_config=agent_with_servers(tmp, {"mine": servers["talk"], "myrich": servers["rich"]}),
        mcp_config=write_mcp_config(tmp / "server-mcp.json", servers),
    )
    assert stack.wait_connected("laptop", 120)
    url = start_gateway(stack)

    async def listed() -> list[str]:
        async with client(url, token_for(stack, "ada")) as mcp:
            return [t.name for t in (await mcp.list_tools()).tools]

    names = anyio.run(listed)
    tools: dict[str, str] = {}
    for tool in ("chatty", "ask_llm", "ask_user", "burst"):
        tools[f"server:{tool}"] = tool
        mine = [n for n in names if n != tool and n.endswith(tool) and ("mine" in n or "myrich" in n)]
        assert len(mine) == 1, (tool, names)
        tools[f"client:{tool}"] = mine[0]
    return stack, url, tools


@asynccontextmanager
async def client(
    url: str,
    token: str,
    on_message: Callable[[Any], None] | None = None,
    sampling: Any = None,
    elicitation: Any = None,
) -> AsyncIterator[ClientSession]:
    """A handshake-era SDK client session, with sampling and elicitation callbacks if given."""

    async def handler(message: Any) -> None:
        if on_message is not None:
            on_message(message)

    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(
            read, write, message_handler=handler, sampling_callback=sampling, elicitation_callback=elicitation
        ) as session,
    ):
        await session.initialize()
        yield session


ROUTES = ("server", "client")


@pytest.mark.parametrize("route", ROUTES)
def test_progress_0_50_100_reaches_the_mcp_client_whole_and_in_order(
    talk: tuple[EmbeddedStack, str, dict[str, str]], route: str
) -> None:
    stack, url, tools = talk
    seen: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    async def scenario() -> types.CallToolResult:
        async with client(url, token_for(stack, "ada")) as mcp:
            return await mcp.call_tool(
                tools[f"{route}:burst"], {"steps": [0, 50, 100]}, progress_callback=on_progress
            )

    result = anyio.run(scenario)
    assert not result.is_error, text_of(result)
    assert seen == [(0, 100), (50, 100), (100, 100)]


def log_messages(seen: list[Any]) -> list[tuple[str, Any]]:
    return [(m.params.level, m.params.data) for m in seen if isinstance(m, types.LoggingMessageNotification)]


@pytest.mark.parametrize("route", ROUTES)
def test_three_log_messages_arrive_before_the_result_and_set_level_filters_them(
    talk: tuple[EmbeddedStack, str, dict[str, str]], route: str
) -> None:
    stack, url, tools = talk
    seen: list[Any] = []
    at_result: list[int] = []

    async def scenario() -> tuple[types.CallToolResult, types.CallToolResult]:
        async with client(url, token_for(stack, "ada"), seen.append) as mcp:
            everything = await mcp.call_tool(tools[f"{route}:chatty"], {})
            at_result.append(len(log_messages(seen)))
            await mcp.set_logging_level("info")
            filtered = await mcp.call_tool(tools[f"{route}:chatty"], {})
            return everything, filtered

    everything, filtered = anyio.run(scenario)
    assert not everything.is_error and not filtered.is_error, text_of(everything)
    got = log_messages(seen)
    # Every level the server sent until the session asked for less; then info and above.
    assert got == [
        ("debug", "debug message 0"),
        ("info", "info message 1"),
        ("warning", "warning message 2"),
        ("info", "info message 1"),
        ("warning", "warning message 2"),
    ], got
    assert at_result == [3]  # all three before the first result


def sampling_answer(prompts: list[str]) -> Any:
    async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        content = params.messages[0].content
        prompts.append(getattr(content, "text", ""))
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="four"), model="tiny-llm"
        )

    return sample


def elicitation_answer(questions: list[str]) -> Any:
    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        questions.append(params.message)
        return types.ElicitResult(action="accept", content={"name": "Ada Lovelace"})

    return elicit


@pytest.mark.parametrize("route", ROUTES)
def test_sampling_and_elicitation_round_trip_through_the_mcp_client(
    talk: tuple[EmbeddedStack, str, dict[str, str]], route: str
) -> None:
    stack, url, tools = talk
    prompts: list[str] = []
    questions: list[str] = []

    async def scenario() -> tuple[types.CallToolResult, types.CallToolResult]:
        async with client(
            url,
            token_for(stack, "ada"),
            sampling=sampling_answer(prompts),
            elicitation=elicitation_answer(questions),
        ) as mcp:
            sampled = await mcp.call_tool(tools[f"{route}:ask_llm"], {"prompt": "2+2?"})
            asked = await mcp.call_tool(tools[f"{route}:ask_user"], {"question": "Your name?"})
            return sampled, asked

    sampled, asked = anyio.run(scenario)
    assert text_of(sampled) == "LLM said: four (tiny-llm)", text_of(sampled)
    assert text_of(asked) == "user said: Ada Lovelace", text_of(asked)
    assert prompts == ["2+2?"] and questions == ["Your name?"]


@pytest.mark.parametrize("route", ROUTES)
def test_an_mcp_client_without_sampling_gets_the_tools_error_not_a_hang(
    talk: tuple[EmbeddedStack, str, dict[str, str]], route: str
) -> None:
    stack, url, tools = talk

    async def scenario() -> types.CallToolResult:
        async with client(url, token_for(stack, "ada")) as mcp:
            return await mcp.call_tool(tools[f"{route}:ask_llm"], {"prompt": "2+2?"})

    result = anyio.run(scenario)
    assert result.is_error and "does not offer sampling" in text_of(result), text_of(result)


@pytest.mark.parametrize("route", ROUTES)
def test_inside_a_tree_sampling_and_elicitation_fail_saying_they_are_not_available(
    talk: tuple[EmbeddedStack, str, dict[str, str]],
    route: str,
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    stack, _, tools = talk
    brain = brain_factory(stack)
    tree = TaskTree.model_validate(
        {
            "id": f"asks-{route}",
            "tasks": [
                {"id": "llm", "tool": tools[f"{route}:ask_llm"], "args": {"prompt": "2+2?"}},
                {"id": "user", "tool": tools[f"{route}:ask_user"], "args": {"question": "name?"}},
            ],
        }
    )
    rec = brain.scheduler.submit(tree, session=SessionKind.INTERACTIVE, user="ada")
    wait_for_tree(brain, rec.tree_id, timeout=120)
    tasks = {t.task_id: t for t in brain.store.get_tasks(rec.tree_id)}
    for task_id, what in (("llm", "sampling"), ("user", "elicitation")):
        task = tasks[task_id]
        assert task.state is TaskState.FAILED, (task_id, task.state)
        assert task.client_id == ("laptop" if route == "client" else None)
        message = task.error.message if task.error else task.reason
        assert f"{what} is not available to calls from task trees" in message, message
        assert ("'ask_llm'" if what == "sampling" else "'ask_user'") in message, message  # the tool


def test_a_hostile_workstation_cannot_ask_another_workstations_caller(
    talk: tuple[EmbeddedStack, str, dict[str, str]], brain_factory: Callable[[EmbeddedStack], Brain]
) -> None:
    """Mallory (user eve, her own credential) learns the run of ada's gateway call on laptop and
    puts a request for it in her outbox, naming laptop or herself; and writes an answer where
    laptop waits. Ada's MCP client is asked once (laptop's own request), and answers it."""
    stack, url, tools = talk
    brain = brain_factory(stack)
    mallory = enroll(brain.scheduler.presence, "mallory", "eve", stack.redis.address_url)
    as_mallory = redis.Redis.from_url(mallory.broker_url, socket_timeout=5)
    asked: list[str] = []

    def running_call() -> TaskRecord | None:
        for tree_rec in brain.store.list_trees(limit=50):
            rec = brain.store.get_task(tree_rec.tree_id, "call")
            # Queued until its start notice, which a call quicker than 0.2 s never sends.
            in_flight = {TaskState.QUEUED_CLIENT, TaskState.RUNNING}
            if rec is not None and rec.client_id == "laptop" and rec.state in in_flight:
                return rec
        return None

    def forge(rec: TaskRecord) -> None:
        assert rec.run_id is not None
        for claimed in ("laptop", "mallory"):
            ask = ToolAsk(
                run_id=rec.run_id,
                tree_id=rec.tree_id,
                task_id=rec.task_id,
                ask_id=uuid.uuid4().hex,
                kind="elicitation",
                params={
                    "mode": "form",
                    "message": "forged",
                    "requestedSchema": {"type": "object", "properties": {}},
                },
                answer_by=time.time() + 30,
                client_id=claimed,
            )
            as_mallory.lpush(
                client_key("mallory", CLIENT_OUTBOX),
                ClientToolAsk(client_id=claimed, ask=ask).model_dump_json(),
            )
        with pytest.raises(redis.exceptions.NoPermissionError):  # a forged answer for laptop
            as_mallory.lpush(client_key("laptop", client_answer_key(uuid.uuid4().hex)), b"{}")
        # The brain's relay refused both (it says so in its log), before the call went on.
        brain_log = stack.settings.data_dir / "logs" / "brain.log"
        wait_until(
            lambda: brain_log.read_text(errors="replace").count("not a gateway call running there") >= 2,
            120,
            "the relay refusing both forged requests",
        )

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        if len(asked) == 1:
            rec = running_call()
            assert rec is not None
            await anyio.to_thread.run_sync(forge, rec)
        return types.ElicitResult(action="accept", content={"name": "Ada"})

    async def scenario() -> types.CallToolResult:
        async with client(url, token_for(stack, "ada"), elicitation=elicit) as mcp:
            return await mcp.call_tool(tools["client:ask_user"], {"question": "Your name?"})

    try:
        result = anyio.run(scenario)
    finally:
        as_mallory.close()
    assert text_of(result) == "user said: Ada", text_of(result)
    assert asked == ["Your name?"]  # the forged requests reached nobody
