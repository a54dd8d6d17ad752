"""The MCP gateway (issue 13) driven by real MCP clients: the SDK's streamable-HTTP client and
the MCP Inspector's CLI (npm), against a real stack (redis-server, brain, server pool, a client
agent of user "ada" whose mcp.json runs the demo server as "notes").

Every wait is bounded; nothing sleeps to wait for readiness.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ToolsListChanged, listen
from mcp.shared.exceptions import MCPError
from mcp.shared.tool_name_validation import validate_tool_name

from brain.hot.state import HotState
from brain.runtime import gateway_tokens as tokens
from brain.stack.embedded import EmbeddedStack, gateway_argv, stack_env
from brain.stack.redis_server import free_port
from brain.store import open_store
from tests.conftest import (
    FIXTURES,
    ROOT,
    agent_with_servers,
    demo_server,
    make_settings,
    npm_binary,
    time_server,
    wait_until,
    write_mcp_config,
)
from workers.contracts import CLIENT_ACK, client_key, key_tool_pins

pytestmark = pytest.mark.integration

INSPECTOR_PACKAGE = "@modelcontextprotocol/inspector@2.12.0"
SERVER_TOOLS = {"get_current_time", "convert_time", "echo", "add", "slow"}
ADA_CLIENT_TOOLS = {"read_local_file", "list_directory", "notes.add", "notes.slow"}


def token_for(stack: EmbeddedStack, user: str) -> str:
    store = open_store(stack.settings.store)
    try:
        return tokens.issue(store, user)
    finally:
        store.close()


def wait_served(url: str, timeout: float = 120.0) -> None:
    """Until the gateway answers (401: it is up and refuses the token-less probe)."""

    def answered() -> bool:
        try:
            return httpx2.post(url, json={}, timeout=2).status_code == 401
        except httpx2.TransportError:
            return False

    wait_until(answered, timeout, f"the gateway at {url}")


def start_gateway(stack: EmbeddedStack) -> str:
    port = free_port()
    stack.start_gateway(port)
    url = f"http://127.0.0.1:{port}/mcp"
    wait_served(url)
    return url


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    tmp = tmp_path_factory.mktemp("gateway")
    agent = agent_with_servers(tmp, {"notes": demo_server()})
    (tmp / "sandbox" / "hello.txt").write_text("hello from the workstation\n")
    settings = make_settings(
        tmp,
        agent_config=agent,
        mcp_config=write_mcp_config(tmp / "server-mcp.json", {"time": time_server(), "demo": demo_server()}),
    )
    running = EmbeddedStack(settings).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def gateway(stack: EmbeddedStack) -> str:
    return start_gateway(stack)


@asynccontextmanager
async def mcp_client(
    url: str, token: str, on_message: Callable[[Any], None] | None = None, *, modern: bool = False
) -> AsyncIterator[ClientSession]:
    """An SDK client session: the handshake era (initialize), or with ``modern`` the
    2026-07-28 era (server/discover, per-request envelopes, subscriptions/listen)."""

    async def handler(message: Any) -> None:
        if on_message is not None:
            on_message(message)

    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write, message_handler=handler) as session,
    ):
        await (session.discover() if modern else session.initialize())
        yield session


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))


# --- per-user access ----------------------------------------------------------------------


def test_without_a_valid_token_nothing_is_served(stack: EmbeddedStack, gateway: str) -> None:
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    assert httpx2.post(gateway, json=init, headers=headers).status_code == 401
    forged = {**headers, "Authorization": "Bearer vtg_not-a-token"}
    assert httpx2.post(gateway, json=init, headers=forged).status_code == 401
    revoked = token_for(stack, "carol")
    store = open_store(stack.settings.store)
    tokens.revoke(store, "carol")
    store.close()
    assert (
        httpx2.post(gateway, json=init, headers={**headers, "Authorization": f"Bearer {revoked}"}).status_code
        == 401
    )


def test_a_session_opened_with_one_users_token_is_not_found_with_anothers(
    stack: EmbeddedStack, gateway: str
) -> None:
    ada, bob = token_for(stack, "ada"), token_for(stack, "bob")
    accept = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
    init = {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }  # fmt: skip
    opened = httpx2.post(gateway, json=init, headers={**accept, "Authorization": f"Bearer {ada}"})
    assert opened.status_code == 200, opened.text
    session = {"mcp-session-id": opened.headers["mcp-session-id"]}
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    hijack = httpx2.post(
        gateway, json=listing, headers={**accept, **session, "Authorization": f"Bearer {bob}"}
    )
    assert hijack.status_code == 404 and "read_local_file" not in hijack.text


def test_a_users_token_lists_and_calls_server_tools_and_the_tools_of_their_connected_client(
    stack: EmbeddedStack, gateway: str
) -> None:
    token = token_for(stack, "ada")
    sandbox = stack.settings.data_dir.parent / "sandbox"

    async def scenario() -> dict[str, Any]:
        async with mcp_client(gateway, token) as mcp:
            listed = {t.name: t for t in (await mcp.list_tools()).tools}
            on_server = await mcp.call_tool("get_current_time", {"timezone": "UTC"})
            on_client = await mcp.call_tool("notes.add", {"a": 2, "b": 3})
            local = await mcp.call_tool("read_local_file", {"path": str(sandbox / "hello.txt")})
            builtin = await mcp.call_tool("echo", {"value": {"x": 1}})
            return {
                "listed": listed,
                "server": on_server,
                "client": on_client,
                "local": local,
                "echo": builtin,
            }

    got = anyio.run(scenario)
    listed = got["listed"]
    assert SERVER_TOOLS | ADA_CLIENT_TOOLS | {"brain_health", "brain_submit_tree"} <= set(listed)
    assert listed["notes.add"].input_schema["properties"].keys() == {"a", "b"}  # the schema as announced
    assert got["server"].is_error is False and got["server"].structured_content["timezone"] == "UTC"
    assert got["client"].is_error is False and text_of(got["client"]) == "5"
    assert "hello from the workstation" in text_of(got["local"])
    assert got["echo"].structured_content == {"x": 1}
    store = open_store(stack.settings.store)
    try:
        routes = {
            t.tool: t.route for tree in store.list_trees(limit=10) for t in store.get_tasks(tree.tree_id)
        }
    finally:
        store.close()
    assert routes["get_current_time"] == "server"
    assert routes["notes.add"] == "client:laptop" and routes["read_local_file"] == "client:laptop"


def test_another_users_token_sees_and_reaches_none_of_adas_client_tools_or_trees(
    stack: EmbeddedStack, gateway: str
) -> None:
    ada, bob = token_for(stack, "ada"), token_for(stack, "bob")

    async def scenario() -> tuple[set[str], MCPError, types.CallToolResult, types.CallToolResult]:
        async with mcp_client(gateway, ada) as mcp:
            queued = await mcp.call_tool(
                "brain_submit_tree",
                {"tree": {"id": "t", "tasks": [{"id": "a", "tool": "echo", "args": {"value": 1}}]}},
            )
        assert queued.structured_content is not None, text_of(queued)
        tree_id = queued.structured_content["tree_id"]
        async with mcp_client(gateway, bob) as mcp:
            names = {t.name for t in (await mcp.list_tools()).tools}
            with pytest.raises(MCPError) as called:
                await mcp.call_tool("notes.add", {"a": 1, "b": 1})
            status = await mcp.call_tool("brain_tree_status", {"tree_id": tree_id})
            cancel = await mcp.call_tool("brain_cancel", {"tree_id": tree_id})
        return names, called.value, status, cancel

    names, called, status, cancel = anyio.run(scenario)
    assert SERVER_TOOLS <= names and not ADA_CLIENT_TOOLS & names
    # Refused before submit (issue 22 item 6) with the spec's protocol error for an unknown tool
    # (issue 24), and no name of ada's clients is suggested to bob.
    assert called.code == types.INVALID_PARAMS and called.message.startswith("Unknown tool: 'notes.add'")
    suggested = called.message.partition("did you mean")[2]
    assert not any(name in suggested for name in ADA_CLIENT_TOOLS), suggested
    assert status.is_error and "no tree" in text_of(status)
    assert cancel.is_error and "no tree" in text_of(cancel)


def test_a_cancelled_mcp_request_cancels_its_task_and_the_call_on_the_server_behind(
    stack: EmbeddedStack, gateway: str, tmp_path: Path
) -> None:
    token = token_for(stack, "ada")
    mark = tmp_path / "cancelled"

    async def scenario() -> None:
        async with mcp_client(gateway, token) as mcp:
            with anyio.move_on_after(2):
                await mcp.call_tool("slow", {"seconds": 300, "cancelled_mark": str(mark)})

    anyio.run(scenario)
    store = open_store(stack.settings.store)
    try:

        def cancelled() -> bool:
            slow = [
                t
                for tr in store.list_trees(limit=20)
                for t in store.get_tasks(tr.tree_id)
                if t.tool == "slow"
            ]
            return bool(slow) and slow[0].state.value == "skipped" and "cancelled" in slow[0].reason

        wait_until(cancelled, 120, "the slow call's task to be cancelled")
    finally:
        store.close()
    # The pool stopped the running call: the MCP server behind was sent notifications/cancelled
    # (before, it ran its 300 s while the pool's slot waited).
    wait_until(mark.exists, 120, "the demo server behind the pool to see its call cancelled")


def test_a_2026_era_client_calls_tools_and_hears_of_a_registry_reload_on_its_listen_stream(
    stack: EmbeddedStack, gateway: str
) -> None:
    token = token_for(stack, "ada")

    def reload_registry() -> None:
        # What the brain's reloader publishes (a new loaded_at); the tools stay the same.
        hot = HotState.from_url(stack.redis_url)
        try:
            snapshot = hot.get_registry()
            assert snapshot is not None
            hot.put_registry({**snapshot, "loaded_at": snapshot["loaded_at"] + 1})
        finally:
            hot.close()

    async def scenario() -> tuple[str | None, set[str], types.CallToolResult, Any]:
        async with mcp_client(gateway, token, modern=True) as mcp:
            names = {t.name for t in (await mcp.list_tools()).tools}
            called = await mcp.call_tool("notes.add", {"a": 1, "b": 2})
            async with listen(mcp, tools_list_changed=True) as events:
                await anyio.to_thread.run_sync(reload_registry)
                with anyio.fail_after(120):
                    event = await events.__anext__()
            return mcp.protocol_version, names, called, event

    version, names, called, event = anyio.run(scenario)
    assert version == "2026-07-28"
    assert ADA_CLIENT_TOOLS <= names and text_of(called) == "3"
    assert isinstance(event, ToolsListChanged)


# --- tool pools (seed 004) ------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_gateway(stack: EmbeddedStack) -> Iterator[str]:
    """A second gateway on the same stack with VANCETOPE_GATEWAY_MAX_TOOLS=5."""
    port = free_port()
    settings = stack.settings.model_copy(update={"gateway_port": port, "gateway_max_tools": 5})
    env = stack_env(settings, stack.service_url("gateway"))
    assert env["VANCETOPE_GATEWAY_MAX_TOOLS"] == "5"
    with open(stack.settings.data_dir / "logs" / "gateway-small.log", "ab") as log:
        proc = subprocess.Popen(gateway_argv(), env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        wait_served(url)
        yield url
    finally:
        proc.terminate()
        proc.wait(120)


def test_with_max_tools_5_the_list_holds_5_and_brain_specialized_cmd_reaches_the_same_tools(
    stack: EmbeddedStack, small_gateway: str
) -> None:
    token = token_for(stack, "ada")

    async def scenario() -> dict[str, Any]:
        async with mcp_client(small_gateway, token) as mcp:
            return {
                "names": [t.name for t in (await mcp.list_tools()).tools],
                "pools": await mcp.call_tool("brain_list_pools", {}),
                "found": await mcp.call_tool("brain_list_pools", {"query": "add"}),
                "time": await mcp.call_tool(
                    "brain_specialized_cmd",
                    {"pool": "time", "action": "get_current_time", "params": {"timezone": "UTC"}},
                ),
                "client": await mcp.call_tool(
                    "brain_specialized_cmd", {"pool": "notes", "action": "add", "params": {"a": 20, "b": 22}}
                ),
                "health": await mcp.call_tool(
                    "brain_specialized_cmd", {"pool": "brain", "action": "list_clients"}
                ),
                "no_pool": await mcp.call_tool("brain_specialized_cmd", {"pool": "nope", "action": "x"}),
                "no_action": await mcp.call_tool("brain_specialized_cmd", {"pool": "time", "action": "nope"}),
            }

    got = anyio.run(scenario)
    assert len(got["names"]) <= 5 and {"brain_specialized_cmd", "brain_list_pools"} <= set(got["names"])
    pools = {p["pool"]: p for p in got["pools"].structured_content["pools"]}
    assert {"brain", "builtin", "native", "time", "demo", "notes"} <= set(pools)
    # ada's client is connected, without shell_execute (shell_enabled is off): only that one is offline
    assert pools["native"]["offline"].startswith("shell_execute run on a workstation")
    assert {(h["pool"], h["action"]) for h in got["found"].structured_content["tools"]} >= {
        ("demo", "add"),
        ("notes", "add"),
    }
    assert got["time"].structured_content["timezone"] == "UTC"
    assert text_of(got["client"]) == "42"
    assert got["health"].structured_content["clients"][0]["client_id"] == "laptop"
    assert got["no_pool"].is_error and "the pools are: brain, builtin, demo" in text_of(got["no_pool"])
    assert got["no_action"].is_error and "its actions: convert_time, get_current_time" in text_of(
        got["no_action"]
    )


# --- the MCP Inspector's CLI ------------------------------------------------------------------


@pytest.fixture(scope="session")
def inspector() -> Path:
    return npm_binary(INSPECTOR_PACKAGE, "mcp-inspector", "the gateway's Inspector tests")


def inspect(binary: Path, url: str, token: str, tmp_path: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [
            str(binary),
            "--cli",
            url,
            "--transport",
            "http",
            "--header",
            f"Authorization: Bearer {token}",
            *args,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MCP_CATALOG_PATH": str(tmp_path / "catalog.json")},
    )
    assert done.returncode == 0, f"inspector failed ({done.returncode}): {done.stderr[-2000:]}"
    return json.loads(done.stdout)


def test_the_inspector_cli_lists_and_calls_a_server_tool_and_a_client_tool(
    stack: EmbeddedStack, gateway: str, inspector: Path, tmp_path: Path
) -> None:
    token = token_for(stack, "ada")
    listed = inspect(inspector, gateway, token, tmp_path, "--method", "tools/list")
    assert SERVER_TOOLS | ADA_CLIENT_TOOLS <= {t["name"] for t in listed["tools"]}
    on_server = inspect(
        inspector, gateway, token, tmp_path, "--method", "tools/call", "--tool-name", "get_current_time",
        "--tool-arg", "timezone=UTC",
    )  # fmt: skip
    assert on_server["structuredContent"]["timezone"] == "UTC"
    on_client = inspect(
        inspector, gateway, token, tmp_path, "--method", "tools/call", "--tool-name", "notes.add",
        "--tool-arg", "a=4", "b=5",
    )  # fmt: skip
    assert on_client["content"][0]["text"] == "9"


# --- a client going offline mid-session -------------------------------------------------------


def test_a_client_going_offline_shrinks_the_list_and_a_block_call_returns_the_waiting_text(
    stack_factory: Callable[..., EmbeddedStack], tmp_path: Path
) -> None:
    offline_stack = stack_factory(
        services=("brain", "server-pool", "client-agent"),
        agent_config=agent_with_servers(tmp_path, {"notes": demo_server()}),
        max_wait_s=2.0,
    )
    assert offline_stack.wait_connected("laptop", 120)
    url, token = start_gateway(offline_stack), token_for(offline_stack, "ada")
    changed = anyio.Event()

    def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async def scenario() -> dict[str, Any]:
        async with mcp_client(url, token, on_message) as mcp:
            before = {t.name for t in (await mcp.list_tools()).tools}
            agent = offline_stack.service("client-agent").process
            assert agent is not None
            os.killpg(agent.pid, 9)  # the workstation goes away without a goodbye
            with anyio.fail_after(120):
                await changed.wait()
            after = {t.name for t in (await mcp.list_tools()).tools}
            started = time.monotonic()
            blocked = await mcp.call_tool("read_local_file", {"path": "notes.txt"})
            waited = time.monotonic() - started
            queued = await mcp.call_tool("list_directory", {"path": "."})
            tree_id = (queued.structured_content or {}).get("tree_id")
            status = await mcp.call_tool("brain_tree_status", {"tree_id": tree_id})
            native = await mcp.call_tool("brain_list_pools", {"pool": "native"})
            cancel = await mcp.call_tool("brain_cancel", {"tree_id": tree_id})
            return {"before": before, "after": after, "blocked": blocked, "waited": waited, "queued": queued,
                    "status": status, "native": native, "cancel": cancel}  # fmt: skip

    got = anyio.run(scenario)
    assert ADA_CLIENT_TOOLS <= got["before"]
    assert not ADA_CLIENT_TOOLS & got["after"] and SERVER_TOOLS <= got["after"]
    assert got["blocked"].is_error and "Waiting for Client for Tool: read_local_file" in text_of(
        got["blocked"]
    )
    assert got["waited"] >= 2.0  # max_wait_s
    assert not got["queued"].is_error and got["queued"].structured_content["state"] == "pending_client"
    assert got["status"].structured_content["tasks"][0]["state"] == "pending_client"
    assert "on a workstation and none of your clients" in got["native"].structured_content["offline"]
    assert got["cancel"].structured_content == {"cancelled": ["call"]}


# --- list_changed when what a user sees changes (issue 24, item 4) ----------------------------------


def run_cli(stack: EmbeddedStack, *args: str) -> subprocess.CompletedProcess[str]:
    """The operator's `vancetope` against this stack (found through its data dir)."""
    return subprocess.run(  # noqa: PLW1510 - callers assert on returncode
        [sys.executable, "-m", "brain", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "VANCETOPE_DATA_DIR": str(stack.settings.data_dir)},
    )  # fmt: skip


async def told_again(seen: list[Any], before: int, timeout: float = 120) -> None:
    """Until a list_changed beyond the first ``before`` arrives."""
    with anyio.fail_after(timeout):
        while len(seen) <= before:
            await anyio.sleep(0.1)


@pytest.fixture
def changing_stack(stack_factory: Callable[..., EmbeddedStack], tmp_path: Path) -> EmbeddedStack:
    """Ada's laptop with the demo server as "notes" (and "more" trusted, not yet in mcp.json)."""
    agent = agent_with_servers(tmp_path, {"notes": demo_server()})
    agent.write_text(
        agent.read_text().replace('trust_mcp_servers = ["notes"]', 'trust_mcp_servers = ["more", "notes"]')
    )
    changing = stack_factory(services=("brain", "server-pool", "client-agent"), agent_config=agent)
    assert changing.wait_connected("laptop", 120)
    return changing


def test_a_client_announcing_other_tools_in_the_same_session_sends_list_changed(
    changing_stack: EmbeddedStack, tmp_path: Path
) -> None:
    url, token = start_gateway(changing_stack), token_for(changing_stack, "ada")
    seen: list[Any] = []

    def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            seen.append(message)

    async def scenario() -> tuple[set[str], set[str]]:
        async with mcp_client(url, token, on_message) as mcp:
            before = {t.name for t in (await mcp.list_tools()).tools}
            told = len(seen)
            # A server added to the running agent's mcp.json: it re-announces in the same session.
            write_mcp_config(tmp_path / "mcp.json", {"notes": demo_server(), "more": demo_server()})
            await told_again(seen, told)
            return before, {t.name for t in (await mcp.list_tools()).tools}

    before, after = anyio.run(scenario)
    assert ADA_CLIENT_TOOLS <= before and "more.add" not in before
    assert {"more.add", "more.slow"} <= after


def test_a_held_tool_and_its_approval_each_send_list_changed(changing_stack: EmbeddedStack) -> None:
    url, token = start_gateway(changing_stack), token_for(changing_stack, "ada")
    seen: list[Any] = []

    def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            seen.append(message)

    def hold_slow() -> None:
        # As if notes' slow tool changed its definition since the brain pinned it: a pin that no
        # longer matches, and the ack dropped so that the agent announces again (as
        # approve-tools does); the brain then holds the tool back.
        hot = HotState.from_url(changing_stack.redis_url)
        try:
            hot.r.hset(key_tool_pins("laptop"), "slow", "0" * 64)
            hot.r.delete(client_key("laptop", CLIENT_ACK))
        finally:
            hot.close()

    async def scenario() -> tuple[set[str], set[str], subprocess.CompletedProcess[str], set[str]]:
        async with mcp_client(url, token, on_message) as mcp:
            before = {t.name for t in (await mcp.list_tools()).tools}
            told = len(seen)
            await anyio.to_thread.run_sync(hold_slow)
            await told_again(seen, told)
            holding = {t.name for t in (await mcp.list_tools()).tools}
            told = len(seen)
            approved = await anyio.to_thread.run_sync(
                lambda: run_cli(changing_stack, "clients", "approve-tools", "laptop", "slow")
            )
            await told_again(seen, told)
            return before, holding, approved, {t.name for t in (await mcp.list_tools()).tools}

    before, holding, approved, after = anyio.run(scenario)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    assert "notes.slow" in before and "notes.slow" not in holding and "notes.add" in holding
    assert "notes.slow" in after


# --- progress ----------------------------------------------------------------------------------


def test_progress_notifications_of_a_running_tool_reach_the_mcp_client(
    stack_factory: Callable[..., EmbeddedStack], tmp_path: Path, everything_server: dict[str, Any]
) -> None:
    progress_stack = stack_factory(
        services=("brain", "server-pool"),
        mcp_config=write_mcp_config(tmp_path / "server-mcp.json", {"everything": everything_server}),
    )
    url, token = start_gateway(progress_stack), token_for(progress_stack, "ada")
    seen: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    async def scenario() -> types.CallToolResult:
        async with mcp_client(url, token) as mcp:
            return await mcp.call_tool(
                "trigger-long-running-operation", {"duration": 2, "steps": 4}, progress_callback=on_progress
            )

    result = anyio.run(scenario)
    assert not result.is_error
    assert seen and all(total == 4 for _, total in seen) and seen == sorted(seen)


# --- what the upstream servers said, progress, arguments, names (issue 24) ---------------------


def rich_server() -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(FIXTURES / "mcp_rich_server.py")]}


@pytest.fixture(scope="module")
def rich_gateway(
    module_stack_factory: Callable[..., EmbeddedStack], tmp_path_factory: pytest.TempPathFactory
) -> tuple[EmbeddedStack, str]:
    """A stack whose brain runs the real mcp-server-git and the rich fixture server, with the
    example registry (its native git_status), and ada's laptop whose mcp.json runs the rich
    server as "mine"; its gateway."""
    tmp = tmp_path_factory.mktemp("rich")
    repo = tmp / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    git = {"command": sys.executable, "args": ["-m", "mcp_server_git", "--repository", str(repo)]}
    stack = module_stack_factory(
        agent_config=agent_with_servers(tmp, {"mine": rich_server()}),
        mcp_config=write_mcp_config(tmp / "server-mcp.json", {"git": git, "rich": rich_server()}),
    )
    assert stack.wait_connected("laptop", 120)
    return stack, start_gateway(stack)


def test_tools_list_carries_every_field_each_mcp_server_sent_on_both_routes(
    rich_gateway: tuple[EmbeddedStack, str],
) -> None:
    stack, url = rich_gateway

    async def scenario() -> dict[str, types.Tool]:
        async with mcp_client(url, token_for(stack, "ada")) as mcp:
            return {t.name: t for t in (await mcp.list_tools()).tools}

    listed = anyio.run(scenario)
    # A third-party server's hint that a host asks before running (it was dropped: item A).
    reset = listed["git_reset"].annotations
    assert reset is not None and reset.destructive_hint is True and reset.read_only_hint is False
    for name in ("erase", "mine.erase"):  # the brain's server, and ada's laptop's mcp.json
        erase = listed[name].model_dump(mode="json", by_alias=True, exclude_none=True)
        assert erase["title"] == "Erase a note", name
        assert erase["annotations"] == {
            "title": "Erase", "readOnlyHint": False, "destructiveHint": True, "idempotentHint": True,
        }, name  # fmt: skip
        assert erase["icons"] == [
            {"src": "data:image/svg+xml;base64,PHN2Zy8+", "mimeType": "image/svg+xml", "sizes": ["any"]}
        ], name
        assert erase["outputSchema"]["required"] == ["erased"] and erase["_meta"] == {
            "example.com/owner": "notes-team"
        }, name


def test_a_quick_burst_of_progress_reaches_the_mcp_client_up_to_the_latest(
    rich_gateway: tuple[EmbeddedStack, str],
) -> None:
    stack, url = rich_gateway
    seen: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    async def scenario() -> types.CallToolResult:
        async with mcp_client(url, token_for(stack, "ada")) as mcp:
            return await mcp.call_tool(
                "burst", {"steps": [0, 50], "then_s": 1}, progress_callback=on_progress
            )

    result = anyio.run(scenario)
    assert not result.is_error, text_of(result)
    # 50/100 came within 0.2 s of 0/100 and nothing followed it: it was lost for good (item B).
    assert seen and seen[-1] == (50, 100), seen


def test_arguments_the_schema_refuses_are_refused_alike_on_both_routes_and_nothing_runs(
    rich_gateway: tuple[EmbeddedStack, str],
) -> None:
    stack, url = rich_gateway

    async def scenario() -> tuple[types.CallToolResult, types.CallToolResult]:
        async with mcp_client(url, token_for(stack, "ada")) as mcp:
            return await mcp.call_tool("erase", {"nme": "x"}), await mcp.call_tool("mine.erase", {"nme": "x"})

    on_server, on_client = anyio.run(scenario)
    # A tool execution error the model can correct (MCP 2025-11-25), worded alike (item D).
    assert on_server.is_error and on_client.is_error
    assert text_of(on_server) == "tool 'erase' was not called: args: 'name' is a required property"
    assert text_of(on_client) == "tool 'mine.erase' was not called: args: 'name' is a required property"
    store = open_store(stack.settings.store)
    try:
        assert not [t for t in store.list_trees(limit=50) if "erase" in t.tree_id]  # nothing submitted
    finally:
        store.close()


def test_the_registrys_native_git_status_and_mcp_server_gits_are_both_listed_and_reported(
    rich_gateway: tuple[EmbeddedStack, str],
) -> None:
    stack, url = rich_gateway

    async def scenario() -> tuple[set[str], types.CallToolResult]:
        async with mcp_client(url, token_for(stack, "ada")) as mcp:
            names = {t.name for t in (await mcp.list_tools()).tools}
            return names, await mcp.call_tool("brain_list_pools", {"pool": "git"})

    names, git_pool = anyio.run(scenario)
    # git.git_status vanished from the list and the pool (item E).
    assert {"git_status", "git.git_status", "git_log"} <= names
    actions = {a["action"]: a["tool"] for a in git_pool.structured_content["actions"]}
    assert actions["git_status"] == "git.git_status" and actions["git_reset"] == "git_reset"
    shown = subprocess.run(  # noqa: PLW1510 - asserted below
        [sys.executable, "-m", "brain", "clients", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "VANCETOPE_DATA_DIR": str(stack.settings.data_dir)},
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["registry"]["clashes"] == [
        (
            "tool name 'git_status' is offered by registry file, git.git_status: 'git_status' is the registry "
            "file's tool; write 'git.git_status' for the other"
        )
    ]


def test_every_name_tools_list_shows_passes_the_sdks_validate_tool_name_and_calls_its_tool(
    rich_gateway: tuple[EmbeddedStack, str],
) -> None:
    """Issue 24 item 3: qualified names are ``<server>.<tool>``, so strict hosts take them all:
    the real mcp-server-git's, the rich server's on the brain and on ada's laptop ("mine")."""
    stack, url = rich_gateway
    assert stack.settings.mcp_config is not None
    git = json.loads(Path(stack.settings.mcp_config).read_text())["mcpServers"]["git"]
    repo = git["args"][-1]

    async def scenario() -> tuple[list[str], types.CallToolResult]:
        async with mcp_client(url, token_for(stack, "ada")) as mcp:
            names = [t.name for t in (await mcp.list_tools()).tools]
            return names, await mcp.call_tool("git.git_status", {"repo_path": repo})

    names, status = anyio.run(scenario)
    invalid = {n: validate_tool_name(n).warnings for n in names if not validate_tool_name(n).is_valid}
    assert invalid == {}
    assert {"git.git_status", "mine.erase", "git_log", "erase"} <= set(names)
    assert not status.is_error and "branch" in text_of(status).lower()


# --- as a user runs it: `vancetope up`, `vancetope users token demo` --------------------------


def test_up_serves_the_gateway_and_a_token_from_users_token_demo_lets_an_mcp_client_in(
    tmp_path: Path,
) -> None:
    data, port = tmp_path / "data", free_port()
    env = {**os.environ, "VANCETOPE_DATA_DIR": str(data), "COLUMNS": "250"}

    def vancetope(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: PLW1510 - callers assert on returncode
            [sys.executable, "-m", "brain", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )

    with open(tmp_path / "up.log", "w") as up_log:
        up = subprocess.Popen(
            [sys.executable, "-m", "brain", "up", "--gateway-port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=up_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: "MCP gateway: http" in (tmp_path / "up.log").read_text(), 120, "`vancetope up`")
        url = f"http://127.0.0.1:{port}/mcp"
        wait_served(url)
        issued = vancetope("users", "token", "demo")
        assert issued.returncode == 0, issued.stderr
        assert re.fullmatch(r"VANCETOPE_GATEWAY_TOKEN=vtg_\S+", issued.stdout.strip()), issued.stdout
        token = issued.stdout.strip().split("=", 1)[1]

        async def scenario() -> tuple[set[str], types.CallToolResult, types.CallToolResult]:
            async with mcp_client(url, token) as mcp:
                names = {t.name for t in (await mcp.list_tools()).tools}
                on_server = await mcp.call_tool("get_current_time", {"timezone": "UTC"})
                on_client = await mcp.call_tool("read_local_file", {"path": "notes.txt"})
            return names, on_server, on_client

        names, on_server, on_client = anyio.run(scenario)
        # The laptop's git server is not started: examples/agent/sandbox is not a repository of
        # its own, and mcp-server-git would serve the one around it (client_agent.git_server).
        assert {"get_current_time", "read_local_file"} <= names and "git_log" not in names
        assert on_server.structured_content["timezone"] == "UTC"
        assert not on_client.is_error and text_of(on_client), text_of(on_client)
        revoked = vancetope("users", "token", "demo", "--revoke")
        assert revoked.returncode == 0, revoked.stderr
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
        assert httpx2.post(url, json={}, headers=headers).status_code == 401
        assert vancetope("users", "token", "demo", "--revoke").returncode == 2
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGINT)
            up.wait(120)
    assert up.returncode == 0, (tmp_path / "up.log").read_text()


def test_gateway_alone_needs_vancetope_redis_url(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "VANCETOPE_REDIS_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "brain", "--data-dir", str(tmp_path), "gateway"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "set VANCETOPE_REDIS_URL" in done.stderr
