"""An upstream server's notifications/resources/updated reaches the gateway sessions that
subscribed (issue 24): one route per side, and no other user's session.

A real stack: the server pool runs ``shelf``, ada's workstation "laptop" runs ``desk`` from its
mcp.json, both ``tests/fixtures/mcp_watched_server.py`` (files that say when they change). Real
MCP clients (the SDK's streamable-HTTP client) for ada and bob subscribe through the gateway;
a test writes a file; the client hears of it under the gateway's URI. A hostile workstation of
bob's, with nothing but its own enrolled credential, says ada's resource changed: the brain
drops it, with a line in its log, and the gateway never hears it. Every wait bounded.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from mcp import types
from mcp.client.subscriptions import ResourceUpdated as ResourceChanged
from mcp.client.subscriptions import listen

from brain.runtime.enrollment import enroll
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack
from tests.conftest import FIXTURES, agent_with_servers, wait_until, write_mcp_config
from tests.integration.test_gateway import mcp_client, start_gateway, token_for
from workers.contracts import (
    CLIENT_OUTBOX,
    ClientResourceUpdated,
    ResourceUpdated,
    channel_resource_updates,
    client_key,
)

pytestmark = [
    pytest.mark.integration,
    # resources/subscribe is the handshake era's (the SDK calls it removed as of 2026-07-28).
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

WATCHED = str(FIXTURES / "mcp_watched_server.py")
HEARD_S = 120.0  # only how long a change may take to be heard: a wait, not a bound asserted


class World:
    def __init__(self, stack: EmbeddedStack, url: str, shelf: Path, desk: Path, mcp_json: Path) -> None:
        self.stack, self.url, self.shelf, self.desk, self.mcp_json = stack, url, shelf, desk, mcp_json

    def log(self, service: str) -> str:
        path = self.stack.service(service).log_path
        assert path is not None
        return path.read_text(errors="replace")

    def gateway_log(self) -> str:
        return self.log("gateway")


@pytest.fixture(scope="module")
def world(
    module_stack_factory: Callable[..., EmbeddedStack], tmp_path_factory: pytest.TempPathFactory
) -> World:
    tmp = tmp_path_factory.mktemp("updates")
    folders = {}
    for name in ("shelf", "desk"):
        folders[name] = tmp / name
        folders[name].mkdir()
        for stem in ("a", "b"):
            (folders[name] / f"{stem}.txt").write_text(f"{name} {stem}\n")

    def entry(name: str) -> dict[str, Any]:
        return {"command": sys.executable, "args": [WATCHED, str(folders[name])]}

    stack = module_stack_factory(
        agent_config=agent_with_servers(tmp, {"desk": entry("desk")}),
        mcp_config=write_mcp_config(tmp / "server-mcp.json", {"shelf": entry("shelf")}),
        # One pool worker, so one upstream session of shelf: with two, each that ran a
        # subscribe holds one, and a change may be told twice (docs/gateway.md). The order of
        # what a session hears is then what proves nothing else came before it.
        server_concurrency=1,
    )
    assert stack.wait_connected("laptop", 120)
    return World(stack, start_gateway(stack), folders["shelf"], folders["desk"], tmp / "mcp.json")


def change(path: Path) -> None:
    with path.open("a") as f:
        f.write("changed\n")


def listener(heard: list[str]) -> Callable[[Any], None]:
    def on(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            heard.append(str(message.params.uri))

    return on


@asynccontextmanager
async def ada_and_bob(
    world: World, ada_heard: list[str], bob_heard: list[str]
) -> AsyncIterator[tuple[Any, Any]]:
    """An MCP session of ada's and one of bob's through the gateway, each noting what it hears."""
    async with (
        mcp_client(world.url, token_for(world.stack, "ada"), listener(ada_heard)) as ada,
        mcp_client(world.url, token_for(world.stack, "bob"), listener(bob_heard)) as bob,
    ):
        yield ada, bob


async def until(what: Callable[[], bool]) -> None:
    with anyio.fail_after(HEARD_S):
        while not what():
            await anyio.sleep(0.05)


def test_a_change_of_a_server_side_resource_reaches_the_session_that_subscribed_and_no_other(
    world: World,
) -> None:
    ada_heard: list[str] = []
    bob_heard: list[str] = []

    async def scenario() -> None:
        async with ada_and_bob(world, ada_heard, bob_heard) as (ada, bob):
            await ada.subscribe_resource("watch://shelf/a")
            await bob.subscribe_resource("watch://shelf/b")
            change(world.shelf / "a.txt")
            await until(lambda: bool(ada_heard))
            # Bob's session works (it hears of its own), and heard nothing of ada's before it.
            change(world.shelf / "b.txt")
            await until(lambda: bool(bob_heard))
            # Unsubscribed: ada hears no more of a, still of what it keeps.
            await ada.unsubscribe_resource("watch://shelf/a")
            await ada.subscribe_resource("watch://shelf/b")
            change(world.shelf / "a.txt")
            change(world.shelf / "b.txt")
            await until(lambda: len(ada_heard) == 2 and len(bob_heard) == 2)
            # The contents are read again as the spec says a client does: the change is there.
            read = await ada.read_resource("watch://shelf/b")
            assert read.contents[0].text.endswith("changed\n")  # type: ignore[union-attr]

    anyio.run(scenario)
    assert ada_heard == ["watch://shelf/a", "watch://shelf/b"]
    assert bob_heard == ["watch://shelf/b", "watch://shelf/b"]


def test_a_change_on_adas_workstation_reaches_her_session_and_bobs_workstation_cannot_fake_one(
    world: World, brain_factory: Callable[[EmbeddedStack], Brain]
) -> None:
    brain = brain_factory(world.stack)
    hostile = enroll(brain.scheduler.presence, "bobpc", "bob", world.stack.redis.address_url)  # type: ignore[union-attr]
    as_bobpc = redis.Redis.from_url(hostile.broker_url)
    ada_heard: list[str] = []
    bob_heard: list[str] = []

    async def scenario() -> None:
        async with ada_and_bob(world, ada_heard, bob_heard) as (ada, bob):
            await ada.subscribe_resource("watch://desk/a")
            # Bob cannot subscribe to ada's workstation's resource: he does not see it.
            with pytest.raises(Exception, match="watch://desk/a"):
                await bob.subscribe_resource("watch://desk/a")
            await bob.subscribe_resource("watch://shelf/a")
            # Bob's workstation says ada's desk changed, through the only door it has (its
            # outbox), once as itself and once claiming to be ada's laptop. It offers no server
            # "desk" (it is not even connected), so the brain drops both: the gateway never hears
            # them. (A connected one naming its own server "desk": tests/unit/brain/gateway/
            # test_resource_relay.py, the gateway drops it without building ada's catalog.)
            desk_a = ResourceUpdated(server="desk", uri="watch://desk/a")
            outbox = client_key("bobpc", CLIENT_OUTBOX)
            for claimed in ("bobpc", "laptop"):
                forged = ClientResourceUpdated(client_id=claimed, updated=desk_a)
                as_bobpc.lpush(outbox, forged.model_dump_json())
            await anyio.to_thread.run_sync(
                lambda: wait_until(
                    lambda: (
                        "client 'bobpc': 1 resources/updated dropped, the last because its session "
                        "offers no resources of MCP server 'desk'"
                        in world.log("brain")
                        and brain.hot.r.llen(outbox) == 0
                    ),
                    HEARD_S,
                    "bobpc's words dropped by the brain",
                )
            )
            # Ada's desk really changes: she hears it (and only that: her stream is in order).
            change(world.desk / "a.txt")
            await until(lambda: bool(ada_heard))
            change(world.shelf / "a.txt")
            await until(lambda: bool(bob_heard))
            read = await ada.read_resource("watch://desk/a")
            assert read.contents[0].text.endswith("changed\n")  # type: ignore[union-attr]

    anyio.run(scenario)
    # Only the real change, and only to her: bobpc's words reached no session and no gateway log.
    assert ada_heard == ["watch://desk/a"]
    assert bob_heard == ["watch://shelf/a"]
    assert "bobpc" not in world.gateway_log()


def test_a_workstation_that_reloads_its_mcp_json_still_tells_of_what_was_subscribed_to(world: World) -> None:
    heard: list[str] = []

    def reloads() -> int:
        return world.log("client-agent").count("reloaded mcp.json")

    async def scenario() -> None:
        async with mcp_client(world.url, token_for(world.stack, "ada"), listener(heard)) as ada:
            await ada.subscribe_resource("watch://desk/a")
            before = reloads()
            # The same servers, written out again (an editor's save): the agent reloads them,
            # with new upstream sessions that hold no subscription of their own.
            world.mcp_json.write_text(json.dumps(json.loads(world.mcp_json.read_text()), indent=2))
            await anyio.to_thread.run_sync(
                lambda: wait_until(lambda: reloads() > before, HEARD_S, "the agent to reload mcp.json")
            )
            change(world.desk / "a.txt")
            await until(lambda: bool(heard))

    anyio.run(scenario)
    assert heard == ["watch://desk/a"]


def test_a_message_on_the_channel_that_is_too_big_or_malformed_is_dropped_with_a_log_line(
    world: World,
) -> None:
    admin = redis.Redis.from_url(world.stack.redis_url)
    channel = channel_resource_updates()
    assert admin.publish(channel, '{"server": "shelf", "uri": "' + "x" * 10_000 + '"}') == 1
    assert admin.publish(channel, "{not json") == 1
    wait_until(
        lambda: world.gateway_log().count(" message on the channel: it was dropped") >= 2,
        HEARD_S,
        "the gateway dropping both",
    )
    log = world.gateway_log()
    assert "-byte limit" in log and "malformed" in log


def test_a_2026_era_client_hears_of_the_resources_its_listen_stream_asked_for(world: World) -> None:
    async def scenario() -> list[Any]:
        heard = []
        async with (
            mcp_client(world.url, token_for(world.stack, "ada"), modern=True) as mcp,
            listen(mcp, resource_subscriptions=["watch://desk/b", "watch://shelf/b"]) as events,
        ):
            # Acknowledged once both are subscribed to upstream: no change is missed.
            for path in (world.desk / "b.txt", world.shelf / "b.txt"):
                change(path)
                with anyio.fail_after(HEARD_S):
                    heard.append(await events.__anext__())
        return heard

    assert anyio.run(scenario) == [
        ResourceChanged(uri="watch://desk/b"),
        ResourceChanged(uri="watch://shelf/b"),
    ]
