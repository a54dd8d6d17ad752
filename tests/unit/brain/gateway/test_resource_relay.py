"""The gateway relays an upstream resources/updated (brain.gateway.server.relay_update) over
a fake backend: to the sessions subscribed to that URI of that server, only when the user's
catalog says the sender serves it; anything else dropped with a log line."""

from __future__ import annotations

import logging
import time

import anyio
import pytest
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.server.subscriptions import ResourceUpdated as ResourceChanged

from brain.core.models import Location
from brain.gateway.backend import UserView
from brain.gateway.catalog import GatewayTool
from brain.gateway.pools import listing
from brain.gateway.server import Gateway, _Seen
from brain.gateway.surface import surface_of
from tests.unit.brain.gateway.test_server import FakeBackend
from workers.contracts import McpSurface, ResourceUpdated


class Views(FakeBackend):
    """Each user's catalog: ada's laptop offers ``desk``, the pool runs ``shelf``."""

    def __init__(self, tools: dict[str, list[GatewayTool]]) -> None:
        super().__init__()
        self.by_user = tools
        self.built: list[str] = []

    def view(self, user: str) -> UserView:
        self.built.append(user)
        tools = self.by_user.get(user, [])
        return UserView(
            user=user, tools=[], listing=listing([], 40), pools={}, sessions=[], surface=surface_of(tools)
        )


class Told:
    def __init__(self) -> None:
        self.uris: list[str] = []

    async def send_resource_updated(self, uri: str) -> None:
        self.uris.append(uri)


def reader(server: str, uri: str, location: Location, clients: tuple[str, ...] = ()) -> GatewayTool:
    return GatewayTool(
        name=f"{server}#read_resource",
        pool=server,
        action="read_resource",
        location=location,
        clients=clients,
        surface=McpSurface(resources=[{"uri": uri, "name": uri}]),
    )


DESK = reader("desk", "watch://desk/a", Location.CLIENT, ("laptop",))
SHELF = reader("shelf", "watch://shelf/a", Location.SERVER)


def relay(gw: Gateway, raw: bytes | str) -> list[str]:
    return anyio.run(gw.relay_update, raw)


def world() -> tuple[Gateway, dict[str, Told]]:
    gw = Gateway(Views({"ada": [DESK, SHELF], "bob": [SHELF]}), "redis://unused")
    told = {sid: Told() for sid in ("ada-1", "ada-2", "bob-1")}
    now = time.monotonic()
    gw.watch.sessions = {
        "ada": {"ada-1": _Seen(told["ada-1"], now), "ada-2": _Seen(told["ada-2"], now)},  # type: ignore[arg-type]
        "bob": {"bob-1": _Seen(told["bob-1"], now)},  # type: ignore[arg-type]
    }
    gw.watch.subscribed = {
        "ada-1": {"watch://desk/a": "desk#read_resource", "watch://shelf/a": "shelf#read_resource"},
        "ada-2": {},
        "bob-1": {"watch://shelf/a": "shelf#read_resource"},
    }
    return gw, told


def update(server: str, uri: str, client_id: str | None) -> bytes:
    return ResourceUpdated(server=server, uri=uri, client_id=client_id).model_dump_json().encode()


def test_a_change_reaches_each_session_subscribed_to_it_and_no_other() -> None:
    gw, told = world()
    assert relay(gw, update("desk", "watch://desk/a", "laptop")) == ["ada-1"]
    assert relay(gw, update("shelf", "watch://shelf/a", None)) == ["ada-1", "bob-1"]
    assert told["ada-1"].uris == ["watch://desk/a", "watch://shelf/a"]
    assert told["bob-1"].uris == ["watch://shelf/a"] and told["ada-2"].uris == []
    # Unsubscribed: no more.
    del gw.watch.subscribed["ada-1"]["watch://desk/a"]
    assert relay(gw, update("desk", "watch://desk/a", "laptop")) == []


def test_a_change_said_by_anyone_but_the_servers_own_side_is_dropped_with_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw, told = world()
    with caplog.at_level(logging.WARNING, logger="vancetope.gateway"):
        # Bob's workstation speaks for ada's laptop's server; a pool for a workstation's; a
        # workstation for the pool's server.
        assert relay(gw, update("desk", "watch://desk/a", "bobpc")) == []
        assert relay(gw, update("desk", "watch://desk/a", None)) == []
        assert relay(gw, update("shelf", "watch://shelf/a", "laptop")) == []
        # Too big, not JSON, not the shape: parsed no further.
        assert relay(gw, b'{"server": "desk", "uri": "' + b"x" * 10_000 + b'"}') == []
        assert relay(gw, b"\xff garbage") == []
        assert (
            relay(gw, b'{"server": "desk", "uri": "watch://desk/a", "client_id": "laptop", "to": "all"}')
            == []
        )
    assert all(t.uris == [] for t in told.values())
    lines = [r.getMessage() for r in caplog.records]
    assert (
        sum(
            "client 'bobpc': its resources/updated of 'watch://desk/a' was dropped: "
            "MCP server 'desk' is not one it serves user 'ada' (1 such since the last line" in m
            for m in lines
        )
        == 1
    )
    assert (
        sum("the server pool: its resources/updated of 'watch://desk/a' was dropped" in m for m in lines) == 1
    )
    # Both of the sessions subscribed to the pool's resource were refused the laptop's word:
    # one line for the two (at most one a minute per sender).
    assert sum("client 'laptop': its resources/updated of 'watch://shelf/a'" in m for m in lines) == 1
    dropped = [m for m in lines if " message on the channel: it was dropped" in m]
    # Too big; malformed (the second malformed one within the minute: counted, not logged).
    assert (
        len(dropped) == 2 and "-byte limit" in dropped[0] and "malformed: message: Invalid JSON" in dropped[1]
    )


def test_a_hostile_workstations_flood_costs_one_line_a_minute_and_no_other_users_catalog(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bob's connected workstation names its own MCP server like ada's laptop's (so the brain
    passes its updates on) and says ada's subscribed resource changed, a thousand times."""
    gw, told = world()
    gw.watch.client_users = {"laptop": "ada", "bobpc": "bob"}
    backend = gw.backend
    assert isinstance(backend, Views)
    with caplog.at_level(logging.WARNING, logger="vancetope.gateway"):
        for _ in range(1000):
            assert relay(gw, update("desk", "watch://desk/a", "bobpc")) == []
    assert backend.built == []  # ada's catalog was never built for bobpc's word
    assert [r.getMessage() for r in caplog.records] == [
        (
            "client 'bobpc': its resources/updated of 'watch://desk/a' was dropped: MCP server 'desk' is "
            "not one it serves user 'ada' (1 such since the last line; at most one a minute)"
        )
    ]
    # A minute on, one line covers the 999 since.
    gw._update_drops.every_s = 0.0
    with caplog.at_level(logging.WARNING, logger="vancetope.gateway"):
        relay(gw, update("desk", "watch://desk/a", "bobpc"))
    assert "(1000 such since the last line" in caplog.records[-1].getMessage()
    # Ada's own laptop is still heard, her catalog built for it.
    assert relay(gw, update("desk", "watch://desk/a", "laptop")) == ["ada-1"]
    assert backend.built == ["ada"] and told["ada-1"].uris == ["watch://desk/a"]


def test_a_listen_stream_that_asked_for_the_uri_hears_of_it_on_its_users_bus_and_only_there(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw, _ = world()
    heard: dict[str, list[object]] = {"ada": [], "bob": []}
    for user, events in heard.items():
        gw.watch.buses[user] = InMemorySubscriptionBus()
        gw.watch.buses[user].subscribe(events.append)
    gw.watch.listened = {
        "ada": {"ada-3/listen-1": {"watch://desk/a": "desk#read_resource"}},
        "bob": {"bob-2/listen-1": {"watch://shelf/a": "shelf#read_resource"}},
    }
    assert relay(gw, update("desk", "watch://desk/a", "laptop")) == ["ada-1", "listen:ada"]
    assert heard == {"ada": [ResourceChanged(uri="watch://desk/a")], "bob": []}
    with caplog.at_level(logging.WARNING, logger="vancetope.gateway"):
        assert relay(gw, update("desk", "watch://desk/a", "bobpc")) == []
        assert relay(gw, update("shelf", "watch://shelf/a", "laptop")) == []
    assert heard["bob"] == [] and len(heard["ada"]) == 1
    assert relay(gw, update("shelf", "watch://shelf/a", None)) == ["ada-1", "bob-1", "listen:bob"]
    assert heard["bob"] == [ResourceChanged(uri="watch://shelf/a")]
