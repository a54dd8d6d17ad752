"""client_agent.announce and .channel: announcement size rules (pure), and the announcer and
heartbeat against a real redis-server, with the test playing the brain."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import cast

import pytest
import redis

from client_agent.announce import Announcer, Heartbeat, encode_announcement, retry_delay
from client_agent.channel import AgentChannel
from client_agent.errors import AnnouncementTooLarge
from workers.contracts import (
    CLIENT_ACK,
    CLIENT_HEARTBEAT,
    CLIENT_MESSAGE,
    CLIENT_OUTBOX,
    MAX_ANNOUNCED_TOOLS,
    AnnouncementAck,
    ClientConnected,
    ClientType,
    McpSurface,
    ToolDescriptor,
    ToolType,
    client_key,
)

CID = "laptop"


def tool(name: str, description: str = "", schema_note: str = "") -> ToolDescriptor:
    schema = {"type": "object", "properties": {"path": {"type": "string", "description": schema_note}}}
    return ToolDescriptor(name=name, type=ToolType.NATIVE, description=description, input_schema=schema)


@pytest.mark.parametrize(
    ("attempt", "delay"), [(0, 1.0), (1, 2.0), (2, 4.0), (4, 16.0), (5, 30.0), (500, 30.0)]
)
def test_retry_delay_doubles_up_to_the_cap(attempt: int, delay: float) -> None:
    assert retry_delay(attempt) == delay


def test_small_announcement_keeps_descriptions() -> None:
    body, stripped = encode_announcement(CID, "s1", ClientType.CLI, [tool("a", "reads")], sent_at=1.0)
    message = ClientConnected.model_validate_json(body)
    assert not stripped and message.available_tools[0].description == "reads"
    assert (message.client_id, message.session_id, message.client_type, message.sent_at) == (
        CID, "s1", ClientType.CLI, 1.0
    )  # fmt: skip


def test_descriptions_are_dropped_first_when_over_the_cap() -> None:
    tools = [tool(f"t{i}", "x" * 500, schema_note="y" * 100) for i in range(10)]
    body, stripped = encode_announcement(CID, "s1", ClientType.DESKTOP, tools, 1.0, max_bytes=4000)
    message = ClientConnected.model_validate_json(body)
    assert stripped and len(body) <= 4000
    assert all(t.description == "" for t in message.available_tools)
    assert message.available_tools[0].input_schema["properties"]["path"] == {
        "type": "string",
        "description": "y" * 100,
    }


def test_schema_descriptions_go_next() -> None:
    tools = [tool(f"t{i}", "x" * 500, schema_note="y" * 300) for i in range(10)]
    body, stripped = encode_announcement(CID, "s1", ClientType.DESKTOP, tools, 1.0, max_bytes=2000)
    message = ClientConnected.model_validate_json(body)
    assert stripped and message.available_tools[0].input_schema["properties"]["path"] == {"type": "string"}


def rich(name: str, icon_bytes: int = 0) -> ToolDescriptor:
    """An MCP tool with every optional field of a tool definition (git_reset-like)."""
    return ToolDescriptor(
        name=name,
        type=ToolType.MCP,
        mcp_server="git",
        description="Resets the repository",
        title="Reset",
        annotations={"destructiveHint": True, "readOnlyHint": False},
        icons=[{"src": "data:image/png;base64," + "A" * icon_bytes, "mimeType": "image/png"}],
        output_schema={"type": "object", "properties": {"ok": {"type": "boolean"}}},
        execution={"taskSupport": "forbidden"},
        meta={"example.com/owner": "git-team"},
    )


def test_a_tools_metadata_is_announced_whole_when_it_fits() -> None:
    body, left_out = encode_announcement(CID, "s1", ClientType.CLI, [rich("git_reset")], sent_at=1.0)
    assert left_out == "" and ClientConnected.model_validate_json(body).available_tools == [rich("git_reset")]


def test_without_metadata_the_announcement_is_what_an_older_brain_reads() -> None:
    # Unset fields are not sent: a brain that knows no `annotations` field still accepts it.
    body, _ = encode_announcement(CID, "s1", ClientType.CLI, [tool("a", "reads")], sent_at=1.0)
    sent = json.loads(body)["available_tools"][0]
    assert set(sent) == {"name", "type", "description", "input_schema"}


def test_over_the_cap_icons_and_meta_go_first_and_the_hints_a_host_acts_on_stay() -> None:
    tools = [rich(f"t{i}", icon_bytes=2000) for i in range(5)]
    body, left_out = encode_announcement(CID, "s1", ClientType.DESKTOP, tools, 1.0, max_bytes=6000)
    assert left_out == "icons and _meta" and len(body) <= 6000
    sent = ClientConnected.model_validate_json(body).available_tools[0]
    assert sent.icons is None and sent.meta is None
    assert sent.annotations == {"destructiveHint": True, "readOnlyHint": False} and sent.title == "Reset"
    assert sent.output_schema is not None and sent.description == "Resets the repository"


def test_the_hints_are_left_out_last_and_the_log_says_everything_that_went() -> None:
    tools = [rich(f"t{i}") for i in range(5)]
    body, left_out = encode_announcement(CID, "s1", ClientType.DESKTOP, tools, 1.0, max_bytes=650)
    assert left_out == (
        "icons and _meta, output schemas, tool descriptions, titles, annotations and execution hints"
    )  # the schemas hold no descriptions: that step changed nothing and is not named
    sent = ClientConnected.model_validate_json(body).available_tools[0]
    assert (sent.title, sent.annotations, sent.execution, sent.description) == (None, None, None, "")


def test_over_the_cap_a_long_list_of_resources_is_cut_short_and_says_so() -> None:
    listed = McpSurface(resources=[{"uri": f"note://{i:03d}", "name": f"n{i}"} for i in range(150)])
    vault = ToolDescriptor(name="vault#read_resource", type=ToolType.MCP, mcp_server="vault", surface=listed)
    body, left_out = encode_announcement(CID, "s1", ClientType.CLI, [vault], 1.0, max_bytes=4000)
    assert left_out == "resources and prompts beyond the first 20 of a server"
    sent = ClientConnected.model_validate_json(body).available_tools[0].surface
    assert sent is not None and len(sent.resources) == 20 and sent.truncated  # reads still go to it


def test_too_large_even_without_descriptions_fails_loudly() -> None:
    with pytest.raises(AnnouncementTooLarge) as info:
        encode_announcement(
            CID, "s1", ClientType.DESKTOP, [tool(f"tool_{i}") for i in range(50)], 1.0, max_bytes=500
        )
    assert "the announcement of 50 tools is" in str(info.value)
    assert "over the brain's cap of 500 bytes (largest: tool_" in str(info.value)


def test_too_many_tools_fails_loudly() -> None:
    with pytest.raises(AnnouncementTooLarge, match=f"over the brain's limit of {MAX_ANNOUNCED_TOOLS}"):
        encode_announcement(
            CID, "s1", ClientType.DESKTOP, [tool(f"t{i}") for i in range(MAX_ANNOUNCED_TOOLS + 1)], 1.0
        )


# --- against a real redis-server -----------------------------------------------------------------


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def pop(r: redis.Redis, timeout: float = 60.0) -> object:
    # Short blocking pops up to the deadline: redis-py reads with a 5 s socket timeout by
    # default, so one long BRPOP raises "Timeout reading from socket" instead of waiting.
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        item = r.brpop([client_key(CID, CLIENT_OUTBOX)], timeout=max(1, min(2, int(left))))
        if item is not None:
            return CLIENT_MESSAGE.validate_json(item[1])
    raise AssertionError(f"nothing in the outbox within {timeout}s")


def ack(r: redis.Redis, session_id: str, accepted: bool, reason: str = "") -> None:
    body = AnnouncementAck(session_id=session_id, accepted=accepted, reason=reason, tools=1).model_dump_json()
    r.set(client_key(CID, CLIENT_ACK), body)


def start_announcer(redis_url: str, stop: threading.Event, ack_timeout_s: float = 5.0) -> Announcer:
    channel = AgentChannel(redis.Redis.from_url(redis_url), CID)

    def build() -> str:
        return encode_announcement(CID, "s1", ClientType.DESKTOP, [tool("read_local_file")], time.time())[0]

    announcer = Announcer(channel, "s1", build, stop, ack_timeout_s, backoff=lambda attempt: 0.2)
    announcer.start()
    announcer.request()
    return announcer


def test_announcer_stops_once_the_brain_accepts(
    redis_url: str, r: redis.Redis, stop: threading.Event
) -> None:
    announcer = start_announcer(redis_url, stop)
    message = pop(r)
    assert isinstance(message, ClientConnected) and message.session_id == "s1"
    ack(r, "s1", accepted=True)
    assert announcer.accepted.wait(60)
    assert r.brpop([client_key(CID, CLIENT_OUTBOX)], timeout=1) is None


def test_announcer_retries_after_a_rejection_and_after_silence(
    redis_url: str, r: redis.Redis, stop: threading.Event
) -> None:
    announcer = start_announcer(redis_url, stop, ack_timeout_s=0.5)
    assert isinstance(pop(r), ClientConnected)
    ack(r, "s1", accepted=False, reason="registry is full")
    assert isinstance(pop(r), ClientConnected)  # rejected: announced again
    # The retry cleared the old (rejected) ack; nobody answers now, so it tries once more.
    assert isinstance(pop(r), ClientConnected)
    accept(r, announcer)


def accept(r: redis.Redis, announcer: Announcer, timeout: float = 60.0) -> None:
    """Answer "accepted" until the announcer has it. With a 0.5 s ack timeout, a test thread
    slowed by the suite's load may answer after the announcer gave up and announced again, which
    clears the answer: each such announcement is answered too."""
    ack(r, "s1", accepted=True)
    deadline = time.monotonic() + timeout
    while not announcer.accepted.wait(0.1):
        assert time.monotonic() < deadline, f"not accepted within {timeout}s"
        if r.rpop(client_key(CID, CLIENT_OUTBOX)) is not None:  # announced again: answer it
            ack(r, "s1", accepted=True)


def test_a_session_announcing_other_tools_stays_accepted_until_the_brain_answers(
    redis_url: str, r: redis.Redis, stop: threading.Event
) -> None:
    """An mcp.json reload announces again in the same session: the brain still holds the session
    (with its old tools), so `vancetope-agent status` must not call the agent disconnected, and
    the heartbeat must not take the cleared ack for a dropped agent."""
    announcer = start_announcer(redis_url, stop)
    assert isinstance(pop(r), ClientConnected)
    ack(r, "s1", accepted=True)
    assert announcer.accepted.wait(60) and not announcer.pending.is_set()

    announcer.request(same_session=True)
    assert isinstance(pop(r), ClientConnected)
    assert announcer.accepted.is_set() and announcer.pending.is_set()  # no answer yet
    assert r.get(client_key(CID, CLIENT_ACK)) is None  # cleared for the new answer
    ack(r, "s1", accepted=True)
    wait_for(lambda: not announcer.pending.is_set())
    assert announcer.accepted.is_set()

    # Refused this time (e.g. suspended): no longer accepted.
    announcer.request(same_session=True)
    assert isinstance(pop(r), ClientConnected)
    ack(r, "s1", accepted=False, reason="over quota")
    wait_for(lambda: not announcer.accepted.is_set())


def wait_for(what: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "not within the bound"
        time.sleep(0.01)


def test_ack_for_another_session_is_not_taken(redis_url: str, r: redis.Redis, stop: threading.Event) -> None:
    announcer = start_announcer(redis_url, stop, ack_timeout_s=0.5)
    pop(r)
    ack(r, "an-older-session", accepted=True)
    assert not announcer.accepted.wait(0.3)
    pop(r)  # no matching ack within the timeout: announced again


def test_heartbeat_holds_the_session_with_a_ttl(
    redis_url: str, r: redis.Redis, stop: threading.Event
) -> None:
    channel = AgentChannel(redis.Redis.from_url(redis_url), CID)
    Heartbeat(channel, "s1", interval_s=0.1, ttl_s=0.6, stop=stop).start()
    key = client_key(CID, CLIENT_HEARTBEAT)
    deadline = time.monotonic() + 60
    while r.get(key) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert r.get(key) == b"s1" and 0 < r.pttl(key) <= 600
    stop.set()
    # Without beats the TTL runs out: what the brain reads as "gone".
    deadline = time.monotonic() + 60
    while r.exists(key) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not r.exists(key)


def test_heartbeat_reports_each_beat_the_broker_took(
    redis_url: str, r: redis.Redis, stop: threading.Event
) -> None:
    beats = threading.Semaphore(0)
    channel = AgentChannel(redis.Redis.from_url(redis_url), CID)
    Heartbeat(channel, "s1", interval_s=0.05, ttl_s=0.6, stop=stop, on_beat=beats.release).start()
    assert all(beats.acquire(timeout=60) for _ in range(3))
    assert r.get(client_key(CID, CLIENT_HEARTBEAT)) == b"s1"


def test_channel_uses_only_keys_under_its_prefix(redis_url: str, r: redis.Redis) -> None:
    channel = AgentChannel(redis.Redis.from_url(redis_url), CID)
    channel.announce(json.dumps({"x": 1}))
    channel.beat("s1", 5)
    channel.clear_heartbeat()
    assert channel.read_ack() is None
    r.set(client_key(CID, CLIENT_ACK), "not json")
    assert channel.read_ack() is None
    assert all(cast(bytes, key).startswith(b"c:laptop:") for key in r.keys("*"))


class _RefusingRedis:
    """A broker client that fails every call the same way: counts the attempts."""

    def __init__(self, error: redis.RedisError) -> None:
        self.error = error
        self.attempts = 0

    def pipeline(self, transaction: bool = True) -> _RefusingRedis:
        return self

    def delete(self, *keys: str) -> None:
        pass

    def lpush(self, *args: object) -> None:
        pass

    def execute(self) -> None:
        self.attempts += 1
        raise self.error


def announcing(
    client: _RefusingRedis, stop: threading.Event, on_refused: Callable[[redis.AuthenticationError], None]
) -> Announcer:
    """An announcer on ``client``, quick to retry, started and asked to announce."""
    announcer = Announcer(
        AgentChannel(client, CID),  # type: ignore[arg-type]
        "s1",
        lambda: "{}",
        stop,
        ack_timeout_s=0.1,
        backoff=lambda attempt: 0.05,
        on_refused=on_refused,
    )
    announcer.start()
    announcer.request()
    return announcer


@pytest.mark.parametrize(
    ("error", "refused"),
    [
        (redis.AuthenticationError("WRONGPASS invalid username-password pair"), True),
        (redis.AuthenticationError("NOAUTH Authentication required."), True),
        (redis.ConnectionError("Connection refused"), False),
        (redis.TimeoutError("Timeout connecting"), False),
    ],
)
def test_refused_credentials_stop_the_announcer_while_network_errors_are_retried(
    stop: threading.Event, error: redis.RedisError, refused: bool
) -> None:
    client = _RefusingRedis(error)
    calls: list[redis.AuthenticationError] = []

    def refused_stops(exc: redis.AuthenticationError) -> None:  # as Agent._on_refused past its grace
        calls.append(exc)
        stop.set()

    announcing(client, stop, refused_stops)
    deadline = time.monotonic() + 60
    while client.attempts < 3 and not calls and time.monotonic() < deadline:
        stop.wait(0.05)
    stop.wait(0.3)  # room for a retry that must not happen after a refusal
    if refused:
        assert calls == [error]
        assert client.attempts == 1
    else:
        assert calls == []
        assert client.attempts >= 3


def test_a_refusal_the_agent_waits_out_is_announced_again(stop: threading.Event) -> None:
    """Agent._on_refused within its grace (a Redis restarted without its users) does not stop
    the agent: the announcer tries again, with its backoff."""
    client = _RefusingRedis(redis.AuthenticationError("WRONGPASS invalid username-password pair"))
    calls: list[redis.AuthenticationError] = []
    announcing(client, stop, calls.append)
    deadline = time.monotonic() + 60
    while client.attempts < 3 and time.monotonic() < deadline:
        stop.wait(0.05)
    stop.set()
    assert client.attempts >= 3 and len(calls) >= 3
