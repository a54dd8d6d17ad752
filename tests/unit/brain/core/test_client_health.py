"""brain.core.client_health: what a client wrote, judged from the replies Redis gave (pure)."""

from __future__ import annotations

import pytest
from redis.exceptions import ResponseError

from brain.core.client_health import (
    MAX_HEARTBEAT_BYTES,
    QUOTA_KIND,
    Cause,
    Mark,
    owner_of_key,
    quota_cause,
    read_heartbeat,
    reply_cause,
    type_causes,
    usage_by_client,
)

WRONGTYPE = ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")


def test_a_heartbeat_holding_a_session_id_is_read() -> None:
    assert read_heartbeat(4, b"s-42").session_id == "s-42"
    assert read_heartbeat(4, b"s-42").cause is None


def test_an_absent_heartbeat_is_silence_not_misbehaviour() -> None:
    beat = read_heartbeat(0, b"")
    assert beat.session_id is None and beat.cause is None


@pytest.mark.parametrize(
    ("length", "head", "kind", "says"),
    [
        (3, b"\xff\xfe\x00", "heartbeat encoding", "not UTF-8 text"),
        (2, b"\xc3\x28", "heartbeat encoding", "not UTF-8 text"),
        (
            MAX_HEARTBEAT_BYTES + 1,
            b"x" * MAX_HEARTBEAT_BYTES,
            "heartbeat size",
            f"{MAX_HEARTBEAT_BYTES + 1} bytes",
        ),
        (100 * 1024 * 1024, b"x" * MAX_HEARTBEAT_BYTES, "heartbeat size", "104857600 bytes"),
        (WRONGTYPE, WRONGTYPE, "heartbeat type", "not a string (WRONGTYPE"),
        (5, WRONGTYPE, "heartbeat type", "not a string"),
        ("5", b"hello", "heartbeat type", "not a string"),
    ],
)
def test_a_malformed_heartbeat_names_its_cause(length: object, head: object, kind: str, says: str) -> None:
    beat = read_heartbeat(length, head)
    assert beat.session_id is None
    assert beat.cause is not None and beat.cause.kind == kind and says in beat.cause.detail


def test_key_types_are_checked_against_what_kombu_and_the_agent_write() -> None:
    fine = {
        "outbox": b"list",
        "queue": b"none",
        "unacked hash": b"hash",
        "unacked index": b"zset",
        "cancelled set": b"set",
    }
    assert type_causes("mallory", fine) == []
    causes = type_causes("mallory", {**fine, "queue": b"string", "unacked hash": WRONGTYPE})
    assert [c.kind for c in causes] == ["queue type", "unacked hash type"]
    assert causes[0].detail == "its queue 'c:mallory:client.mallory' is a string, not a list"
    assert "cannot be read (WRONGTYPE" in causes[1].detail


def test_a_refused_reply_among_a_keys_replies_is_a_cause() -> None:
    assert reply_cause("outbox", "c:m:outbox", [3, True, [b"a"]]) is None
    cause = reply_cause("outbox", "c:m:outbox", [WRONGTYPE, WRONGTYPE, WRONGTYPE])
    assert cause == Cause(
        kind="outbox type",
        detail="its outbox 'c:m:outbox' cannot be read (WRONGTYPE Operation against a key holding the wrong kind of value)",
    )


def test_the_quota_cause_says_how_much_over_what() -> None:
    assert quota_cause(100, 100) is None
    cause = quota_cause(101, 100)
    assert cause is not None and cause.kind == QUOTA_KIND
    assert cause.detail == "over quota: 101 bytes > 100 (client_quota_bytes)"


def test_usage_is_summed_per_client_prefix_and_ignores_gone_keys() -> None:
    sizes = [
        (b"c:ada-laptop:outbox", 100),
        (b"c:ada-laptop:junk", 50),
        (b"c:mallory:x:y:z", 7),
        (b"c:mallory:gone", None),
        (b"c:mallory:refused", WRONGTYPE),
        (b"vt:presence", 1000),
        (b"c:", 5),
    ]
    assert usage_by_client(sizes) == {"ada-laptop": 150, "mallory": 7}
    assert owner_of_key("c:a.b_c-d:outbox") == "a.b_c-d"
    assert owner_of_key(b"c::x") is None and owner_of_key("cx:a:b") is None


def test_a_mark_gathers_causes_by_kind_and_loses_them_by_kind() -> None:
    mark = Mark(causes={}, since=1.0).with_cause(Cause(kind="b", detail="second"))
    mark = mark.with_cause(Cause(kind="a", detail="first"))
    assert mark.shown() == "first; second"
    left = mark.without({"a"})
    assert left is not None and left.causes == {"b": "second"}
    assert mark.without({"a", "b"}) is None
