"""Who hears that an upstream resource changed (brain.core.resource_updates): pure."""

from __future__ import annotations

import pytest

from brain.core.models import Location
from brain.core.resource_updates import (
    DropCounts,
    Dropped,
    announced_servers,
    may_notify,
    parse_update,
    subscribers,
)
from brain.core.sessions import ClientSession
from workers.contracts import MAX_RESOURCE_UPDATE_BYTES, ClientType, ResourceUpdated, ToolDescriptor, ToolType


def test_a_message_is_parsed_strictly_and_bounded_before_it_is_parsed() -> None:
    ok = ResourceUpdated(server="desk", uri="watch://desk/a", client_id="laptop")
    assert parse_update(ok.model_dump_json().encode()) == ok
    for raw, why in [
        (b"not json", "malformed"),
        (b'{"server": "desk"}', "uri: Field required"),
        (b'{"server": "desk", "uri": 7}', "uri: Input should be a valid string"),
        (b'{"server": "desk", "uri": "u", "extra": 1}', "extra: Extra inputs are not permitted"),
        (b'{"server": "desk", "uri": ""}', "uri: String should have at least 1 character"),
        (b'{"server": "desk", "uri": "' + b"x" * MAX_RESOURCE_UPDATE_BYTES + b'"}', "-byte limit"),
    ]:
        with pytest.raises(Dropped, match=why) as dropped:
            parse_update(raw)
        assert dropped.value.kind == ("too big" if why == "-byte limit" else "malformed")


def test_only_sessions_subscribed_to_that_uri_of_that_server_hear_of_it() -> None:
    subscribed = {
        "s2": {"watch://a": "desk#read_resource"},
        "s1": {"watch://a": "desk#read_resource", "watch://b": "desk#read_resource"},
        "s3": {"watch://a": "shelf#read_resource"},  # the same URI, read from another server
        "s4": {},
    }
    assert subscribers(subscribed, "desk#read_resource", "watch://a") == ["s1", "s2"]
    assert subscribers(subscribed, "shelf#read_resource", "watch://a") == ["s3"]
    assert subscribers(subscribed, "desk#read_resource", "watch://c") == []


def test_a_client_speaks_only_for_servers_it_offers_and_the_pool_only_for_the_servers() -> None:
    assert may_notify(Location.CLIENT, ("laptop",), "laptop")
    assert not may_notify(Location.CLIENT, ("laptop",), "bobpc")
    assert not may_notify(Location.CLIENT, ("laptop",), None)
    assert may_notify(Location.SERVER, (), None)
    assert not may_notify(Location.SERVER, (), "laptop")
    assert may_notify(Location.BOTH, ("laptop",), None) and may_notify(Location.BOTH, ("laptop",), "laptop")


def test_a_client_may_report_changes_only_of_servers_its_session_offers_resources_of() -> None:
    def session(*names: str) -> ClientSession:
        tools = [ToolDescriptor(name=n, type=ToolType.MCP, mcp_server="desk") for n in names]
        return ClientSession(
            client_id="laptop",
            user="ada",
            session_id="s1",
            client_type=ClientType.CLI,
            tools=tools,
            connected_at=0,
        )

    assert announced_servers(None) == frozenset()
    assert announced_servers(session("desk_note", "desk#get_prompt")) == frozenset()
    assert announced_servers(session("desk#read_resource", "notes#read_resource", "x#complete")) == {
        "desk",
        "notes",
    }


def test_a_senders_drops_make_one_line_a_minute_saying_how_many() -> None:
    counts = DropCounts(every_s=60)
    assert counts.dropped("bobpc", 0.0) == 1  # the first, at once
    assert [counts.dropped("bobpc", t) for t in (1.0, 30.0, 59.9)] == [None, None, None]
    assert counts.dropped("laptop", 10.0) == 1  # another sender has its own minute
    assert counts.dropped("bobpc", 60.0) == 4  # the three kept quiet, and this one
    assert counts.dropped("bobpc", 61.0) is None
    assert counts.dropped("bobpc", 200.0) == 2
