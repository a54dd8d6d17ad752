"""A client's resources/updated passes the brain's relay only about a server its session offers
resources of, stamped as that client's; anything else is dropped with at most one line a minute
per client, so a hostile workstation's flood costs the gateway nothing (issue 24)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest
import redis

from brain.runtime.intake import Intake
from brain.runtime.relay import Relay
from tests.unit.brain.runtime.rig import Rig
from workers.contracts import (
    ClientConnected,
    ClientResourceUpdated,
    ClientType,
    ResourceUpdated,
    ToolDescriptor,
    ToolType,
    channel_resource_updates,
)

DESK_READER = ToolDescriptor(name="desk#read_resource", type=ToolType.MCP, mcp_server="desk")
DESK_TOOL = ToolDescriptor(name="desk_note", type=ToolType.MCP, mcp_server="desk")


@pytest.fixture
def published(redis_client: redis.Redis) -> Iterator[Callable[[], list[ResourceUpdated]]]:
    """What the relay has published for the gateway so far."""
    pubsub = redis_client.pubsub()
    pubsub.subscribe(channel_resource_updates())
    got: list[ResourceUpdated] = []

    def drain() -> list[ResourceUpdated]:
        # Published before this returns are already in the socket: the first quiet 0.2 s ends it.
        while (message := pubsub.get_message(timeout=0.2)) is not None:
            if message["type"] == "message":
                got.append(ResourceUpdated.model_validate_json(message["data"]))
        return got

    yield drain
    pubsub.close()


def announce(relay: Relay, rig: Rig, client_id: str, *tools: ToolDescriptor) -> None:
    msg = ClientConnected(
        client_id=client_id,
        session_id="s1",
        client_type=ClientType.CLI,
        available_tools=list(tools),
        sent_at=rig.clock(),
    )
    relay.handle(client_id, msg.model_dump_json().encode())


def said(client_id: str, server: str, claimed: str | None = None) -> bytes:
    update = ResourceUpdated(server=server, uri=f"watch://{server}/a")
    return ClientResourceUpdated(client_id=claimed or client_id, updated=update).model_dump_json().encode()


def test_only_a_server_the_clients_session_offers_resources_of_is_passed_on(
    rig: Rig, published: Callable[[], list[ResourceUpdated]], caplog: pytest.LogCaptureFixture
) -> None:
    rig.presence.enroll("laptop", "ada")
    relay = Relay(Intake(rig.scheduler), rig.clients)
    with caplog.at_level(logging.WARNING, logger="vancetope.brain"):
        relay.handle("laptop", said("laptop", "desk"))  # not connected: no session, no servers
        announce(relay, rig, "laptop", DESK_TOOL)  # desk's tools, but not its resources
        relay.handle("laptop", said("laptop", "desk"))
        announce(relay, rig, "laptop", DESK_TOOL, DESK_READER)
        relay.handle("laptop", said("laptop", "desk"))
        relay.handle("laptop", said("laptop", "shelf"))  # a server it never announced
        relay.handle("laptop", said("laptop", "desk", claimed="bobpc"))
    assert published() == [ResourceUpdated(server="desk", uri="watch://desk/a", client_id="laptop")]
    lines = [r.getMessage() for r in caplog.records if "resources/updated dropped" in r.getMessage()]
    # Four drops, one line (the first): at most one a minute per client.
    assert lines == [
        (
            "client 'laptop': 1 resources/updated dropped, the last because its session offers no "
            "resources of MCP server 'desk' (at most one such line a minute)"
        )
    ]


def test_a_flood_of_a_thousand_costs_one_session_read_a_round_and_one_line(
    rig: Rig,
    published: Callable[[], list[ResourceUpdated]],
    caplog: pytest.LogCaptureFixture,
    redis_client: redis.Redis,
) -> None:
    rig.presence.enroll("mallory", "eve")
    relay = Relay(Intake(rig.scheduler), rig.clients)
    announce(relay, rig, "mallory", DESK_TOOL)
    relay.poll_once(["mallory"])  # a round starts: what sessions offer is read again
    before = redis_client.info("commandstats").get("cmdstat_hget", {}).get("calls", 0)
    with caplog.at_level(logging.WARNING, logger="vancetope.brain"):
        for _ in range(1000):
            relay.handle("mallory", said("mallory", "desk"))
    after = redis_client.info("commandstats").get("cmdstat_hget", {}).get("calls", 0)
    assert after - before == 1
    assert published() == []
    assert len([r for r in caplog.records if "resources/updated dropped" in r.getMessage()]) == 1
