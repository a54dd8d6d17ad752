"""The gateway's MCP handlers (brain.gateway.server) over a fake backend: what a tools/call
becomes (a result, or a protocol error), what tools/list carries. No Redis, no HTTP: the
handlers are called as the SDK calls them."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from mcp import types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.shared.exceptions import MCPError

from brain.core.models import Location, Progress, TaskRecord, TaskState
from brain.errors import InvalidTaskTree
from brain.gateway.backend import Caller, Submitted, UnknownTool, UserView
from brain.gateway.catalog import GatewayTool, UserState
from brain.gateway.pools import listing
from brain.gateway.server import Gateway, _Seen
from brain.gateway.surface import surface_of
from workers.contracts import McpSurface, ProgressEvent, ToolProgress


class FakeBackend:
    """``GatewayBackend`` with canned answers; ``records`` are returned one per read (the last
    one again once they run out)."""

    def __init__(
        self,
        tools: list[GatewayTool] | None = None,
        submit_error: Exception | None = None,
        records: list[TaskRecord] | None = None,
    ) -> None:
        self.tools = tools or []
        self.submit_error = submit_error
        self.records = records or []
        self.submitted: list[tuple[str, Mapping[str, Any]]] = []
        # What ``state`` answers, one per look (the last one again once they run out).
        self.states: list[dict[str, UserState]] = [{}]
        self.asked_for: list[set[str]] = []

    def user_of(self, token: str) -> str | None:
        return "ada"

    def view(self, user: str) -> UserView:
        return UserView(user=user, tools=self.tools, listing=listing(self.tools, 40), pools={}, sessions=[])

    def offline_clients(self, user: str) -> tuple[str, ...]:
        return ()

    def state(self, users: Collection[str]) -> tuple[float, dict[str, UserState]]:
        self.asked_for.append(set(users))
        return 0.0, self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def submit_call(
        self, caller: Caller, tool: str, args: Mapping[str, Any], run_id: str | None = None
    ) -> Submitted:
        if self.submit_error is not None:
            raise self.submit_error
        self.submitted.append((tool, args))
        return Submitted(tree_id=run_id or "mcp-t-1", wait_s=30.0)

    def call_record(self, tree_id: str) -> TaskRecord:
        return self.records.pop(0) if len(self.records) > 1 else self.records[0]

    def cancel(self, caller: Caller, tree_id: str, task_id: str | None = None) -> list[str]:
        return []

    def primary(self, caller: Caller, tool: str, args: Mapping[str, Any]) -> Any:
        return {}


class FakeSession:
    def __init__(self) -> None:
        self.progress: list[tuple[float, float | None, str | None]] = []

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        self.progress.append((progress, total, message))


def context(session: FakeSession | None = None) -> Any:
    token = AccessToken(token="vtg_x", client_id="vancetope-user:ada", scopes=[], subject="ada")
    request = SimpleNamespace(user=AuthenticatedUser(token), headers={})
    return SimpleNamespace(request=request, session=session or FakeSession())


def gateway(backend: FakeBackend) -> Gateway:
    gw = Gateway(backend, "redis://unused")

    @asynccontextmanager
    async def no_events(tree_id: str) -> AsyncIterator[Callable[[float], Awaitable[None]]]:
        async def woken(timeout: float) -> None:
            await anyio.lowlevel.checkpoint()

        yield woken

    gw._tree_events = no_events  # type: ignore[method-assign]
    return gw


def call(
    gw: Gateway, name: str, args: dict[str, Any], session: FakeSession | None = None
) -> types.CallToolResult:
    params = types.CallToolRequestParams(name=name, arguments=args)
    return anyio.run(gw.call_tool, context(session), params)


# --- tools/call: unknown tool, refused arguments, failures --------------------------------------


def test_a_call_of_an_unknown_tool_is_the_protocol_error_invalid_params() -> None:
    gw = gateway(FakeBackend(submit_error=UnknownTool("Unknown tool: 'nope'; did you mean `echo`?")))
    with pytest.raises(MCPError) as raised:
        call(gw, "nope", {})
    assert raised.value.code == types.INVALID_PARAMS == -32602
    assert raised.value.message == "Unknown tool: 'nope'; did you mean `echo`?"


def test_a_call_the_brain_refuses_before_it_runs_is_an_error_result_the_model_can_read() -> None:
    # Input validation errors are tool execution errors (MCP 2025-11-25), not -32602.
    problems = [
        "task 'call': args.a: '2' is not of type 'integer'",
        "task 'call': args: 'b' is a required property",
    ]
    refused = InvalidTaskTree("tools/call notes.add", problems)
    result = call(gateway(FakeBackend(submit_error=refused)), "notes.add", {"a": "2"})
    assert result.is_error
    assert result.content[0].text == (  # type: ignore[union-attr]
        "tool 'notes.add' was not called: args.a: '2' is not of type 'integer'; args: 'b' is a required property"
    )


def test_a_tool_that_ran_and_failed_is_an_error_result() -> None:
    failed = TaskRecord(tree_id="mcp-t-1", task_id="call", tool="echo", state=TaskState.FAILED, reason="boom")
    result = call(gateway(FakeBackend(records=[failed])), "echo", {"value": 1})
    assert result.is_error and "tool 'echo' failed" in result.content[0].text  # type: ignore[union-attr]


def scripted(gw: Gateway, waits: list[list[bytes]]) -> None:
    """The call's tree channel: each wait gives the messages of one list, then nothing (a quiet
    wait) once they run out."""

    @asynccontextmanager
    async def events(tree_id: str) -> AsyncIterator[Callable[[float], Awaitable[bytes | None]]]:
        pending: list[bytes] = []

        async def woken(timeout: float) -> bytes | None:
            await anyio.lowlevel.checkpoint()
            if pending:
                return pending.pop(0)
            if timeout > 0 and waits:
                pending.extend(waits.pop(0))
                return pending.pop(0) if pending else None
            return None

        yield woken

    gw._tree_events = events  # type: ignore[method-assign]


def progress_event(step: float, at: float) -> bytes:
    update = ToolProgress(
        run_id="r1", tree_id="mcp-t-1", task_id="call", progress=step, total=100, at=at, client_id="laptop"
    )
    return ProgressEvent(progress=update).model_dump_json().encode()


def test_a_record_ahead_of_the_progress_events_in_flight_does_not_drop_them() -> None:
    # The record is written before its event is published: read after a quiet wait, it may
    # already hold progress 50 while the events of 0 and 50 are on their way.
    running = TaskRecord(
        tree_id="mcp-t-1",
        task_id="call",
        tool="burst",
        state=TaskState.RUNNING,
        run_id="r1",
        client_id="laptop",
    )
    ahead = running.model_copy(update={"progress": Progress(progress=50, total=100, at=1.1)})
    done = ahead.model_copy(update={"state": TaskState.DONE, "result": {"ok": True}})
    session = FakeSession()
    gw = gateway(FakeBackend(records=[running, ahead, done]))
    scripted(gw, [[], [progress_event(0, 1.0), progress_event(50, 1.1)]])
    result = call(gw, "burst", {}, session)
    assert not result.is_error
    assert session.progress == [(0, 100, None), (50, 100, None)]


def test_progress_no_event_brought_reaches_the_client_from_the_record_a_quiet_wait_later() -> None:
    # A dropped subscription: the record holds progress 30 and no event ever comes.
    running = TaskRecord(
        tree_id="mcp-t-1",
        task_id="call",
        tool="burst",
        state=TaskState.RUNNING,
        run_id="r1",
        client_id="laptop",
        progress=Progress(progress=30, total=100, at=1.0),
    )
    seen_at_done: list[list[tuple[float, float | None, str | None]]] = []
    session = FakeSession()

    class Watching(FakeBackend):
        def call_record(self, tree_id: str) -> TaskRecord:
            if len(self.records) == 1:
                seen_at_done.append(list(session.progress))
            return super().call_record(tree_id)

    done = running.model_copy(update={"state": TaskState.DONE, "result": {"ok": True}})
    gw = gateway(Watching(records=[running, running, running, done]))
    scripted(gw, [])
    assert not call(gw, "burst", {}, session).is_error
    assert seen_at_done[0] == [(30, 100, None)]  # relayed while it ran, not only at the end
    assert session.progress == [(30, 100, None)]


# --- tools/list -----------------------------------------------------------------------------------


def test_tools_list_carries_every_field_the_tools_mcp_server_sent() -> None:
    reset = GatewayTool(
        name="git_reset",
        description="Resets",
        input_schema={"type": "object", "properties": {"repo_path": {"type": "string"}}},
        pool="git",
        action="git_reset",
        location=Location.CLIENT,
        title="Reset",
        annotations={"destructiveHint": True, "readOnlyHint": False},
        icons=[{"src": "data:image/png;base64,AAAA", "mimeType": "image/png", "sizes": ["48x48"]}],
        output_schema={"type": "object", "properties": {"ok": {"type": "boolean"}}},
        execution={"taskSupport": "forbidden"},
        meta={"example.com/owner": "git-team"},
    )
    gw = gateway(FakeBackend(tools=[reset]))
    listed = anyio.run(gw.list_tools, context(), None)
    wire = {t.name: t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in listed.tools}
    assert wire["git_reset"] == {
        "name": "git_reset",
        "title": "Reset",
        "description": "Resets",
        "inputSchema": {"type": "object", "properties": {"repo_path": {"type": "string"}}},
        "annotations": {"destructiveHint": True, "readOnlyHint": False},
        "icons": [{"src": "data:image/png;base64,AAAA", "mimeType": "image/png", "sizes": ["48x48"]}],
        "outputSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
        "execution": {"taskSupport": "forbidden"},
        "_meta": {"example.com/owner": "git-team"},
    }
    assert wire["brain_health"].keys() == {"name", "description", "inputSchema"}  # no metadata: none invented


# --- list_changed ---------------------------------------------------------------------------------


class ListeningSession:
    """Counts each list_changed it is sent: tools, resources and prompts."""

    def __init__(self) -> None:
        self.told = 0
        self.lists: list[str] = []

    async def send_tool_list_changed(self) -> None:
        self.told += 1
        self.lists.append("tools")

    async def send_resource_list_changed(self) -> None:
        self.lists.append("resources")

    async def send_prompt_list_changed(self) -> None:
        self.lists.append("prompts")


def test_the_watcher_tells_the_sessions_of_a_user_whose_catalog_changed_in_the_same_session() -> None:
    laptop = frozenset({("laptop", "s1")})
    backend = FakeBackend()
    backend.states = [{"ada": (laptop, "d1")}, {"ada": (laptop, "d1")}, {"ada": (laptop, "d2")}]
    gw = gateway(backend)
    ada = ListeningSession()
    gw.watch.sessions["ada"] = {"mcp-1": _Seen(ada, time.monotonic())}  # type: ignore[arg-type]
    looks = [anyio.run(gw.check_changes) for _ in range(3)]
    assert looks == [set(), set(), {"ada"}]  # the first look only learns; then what changed
    assert ada.told == 1
    # what a user sees of resources and prompts comes from the same catalog: told alike
    assert ada.lists == ["tools", "resources", "prompts"]
    assert backend.asked_for == [{"ada"}] * 3  # the watched users' states are asked for


# --- resources ----------------------------------------------------------------------------------


def test_a_uri_two_servers_list_is_listed_once_and_the_clash_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def reader(server: str) -> GatewayTool:
        listed = McpSurface(resources=[{"uri": "shared://x", "name": "x"}])
        name = f"{server}#read_resource"
        return GatewayTool(name=name, pool=server, action=name, location=Location.SERVER, surface=listed)

    backend = FakeBackend()
    backend.view = lambda user: UserView(  # type: ignore[method-assign]
        user=user, tools=[], listing=listing([], 40), pools={}, sessions=[],
        surface=surface_of([reader("a"), reader("b")]),
    )  # fmt: skip
    gw = gateway(backend)
    with caplog.at_level(logging.WARNING, logger="vancetope.gateway"):
        first = anyio.run(gw.list_resources, context(), None)
        anyio.run(gw.list_resources, context(), None)
    assert [str(r.uri) for r in first.resources] == ["shared://x"]
    told = [r.getMessage() for r in caplog.records if "shared://x" in r.getMessage()]
    assert told == ["resource 'shared://x' is listed by MCP servers 'a', 'b': it is read from 'a'"]
