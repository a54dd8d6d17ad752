"""The fault proxy (bench/faultproxy.py) in front of a real redis-server: each fault does what
a real link does to a Redis client (issue 25, item 1). Only lower bounds on time are asserted
(a slow machine makes a delay longer, never shorter)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from bench.faultproxy import FaultProxy
from brain.stack.redis_server import RedisServer

pytestmark = pytest.mark.integration


_OPENED: list[socket.socket | redis.Redis] = []


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", redis_server.port), seed=1) as running:
        running.admin_url = running.url(redis_server.url)  # type: ignore[attr-defined]
        yield running
        while _OPENED:
            _OPENED.pop().close()


def client(proxy: FaultProxy, timeout: float | None = 5.0) -> redis.Redis:
    # No retries: each fault is seen as the client's first try meets it.
    url = proxy.admin_url  # type: ignore[attr-defined]
    r = redis.Redis.from_url(url, socket_timeout=timeout, retry=Retry(NoBackoff(), 0))
    _OPENED.append(r)
    return r


def test_commands_pass_through_and_the_url_of_an_agent_is_rewritten(
    proxy: FaultProxy, redis_server: RedisServer
) -> None:
    r = client(proxy)
    r.set("k", "v")
    assert r.get("k") == b"v"
    url = f"redis://laptop:secret@127.0.0.1:{redis_server.port}/0"
    assert proxy.url(url) == f"redis://laptop:secret@127.0.0.1:{proxy.port}/0"
    assert proxy.stats.accepted == 1 and proxy.stats.up_bytes > 0 and proxy.stats.down_bytes > 0


def test_a_delay_each_way_costs_a_round_trip_twice_the_delay(proxy: FaultProxy) -> None:
    r = client(proxy)
    r.ping()
    proxy.delay(0.1)
    started = time.monotonic()
    r.ping()
    assert time.monotonic() - started >= 0.2


def raw(proxy: FaultProxy) -> socket.socket:
    """A bare TCP connection through the proxy: what it does to the socket itself shows (redis-py
    reconnects behind a reset, which hides it)."""
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    _OPENED.append(sock)
    sock.sendall(b"PING\r\n")
    assert sock.recv(100).startswith(b"-NOAUTH")  # the server answered, through the proxy
    return sock


def test_a_cut_link_goes_quiet_without_closing_and_heals(proxy: FaultProxy) -> None:
    sock = raw(proxy)
    proxy.cut()
    sock.settimeout(0.5)
    sock.sendall(b"PING\r\n")
    with pytest.raises(TimeoutError):  # no answer, and no reset or close either: silence
        sock.recv(100)
    with pytest.raises(redis.TimeoutError):
        client(proxy, timeout=0.5).ping()
    assert proxy.stats.dropped_bytes > 0 and proxy.stats.resets == 0
    proxy.heal()
    assert client(proxy).ping() is True
    sock.sendall(b"PING\r\n")  # the old connection carries bytes again too
    sock.settimeout(5)
    assert sock.recv(100).startswith(b"-NOAUTH")


def test_a_cut_after_a_marker_lets_that_chunk_through_and_nothing_after_it(
    proxy: FaultProxy, redis_server: RedisServer
) -> None:
    r = client(proxy, timeout=0.5)
    direct = redis.Redis.from_url(redis_server.url)
    _OPENED.append(direct)
    r.ping()
    proxy.cut_after(b"the-marker")  # towards the client: the reply carrying it is the last
    r.set("k", "the-marker")
    assert r.get("k") == b"the-marker"
    with pytest.raises(redis.TimeoutError):
        r.set("after", "1")  # sent after the marker came back: dropped
    assert direct.get("after") is None
    proxy.heal()
    proxy.cut_after(b"up-marker", up=True)  # towards the upstream: the command carrying it lands
    with pytest.raises(redis.TimeoutError):
        client(proxy, timeout=0.5).set("landed", "up-marker")  # ... and its reply is dropped
    assert direct.get("landed") == b"up-marker"


def test_a_reset_closes_every_connection_and_the_next_one_works(proxy: FaultProxy) -> None:
    sock = raw(proxy)
    assert proxy.reset() == 1
    with pytest.raises(ConnectionResetError):
        sock.recv(100)
    assert client(proxy).ping() is True  # a new connection goes through
    assert proxy.stats.resets == 1


def test_a_bandwidth_cap_paces_a_big_value(proxy: FaultProxy) -> None:
    r = client(proxy, timeout=30)
    r.set("big", b"x" * 96_000)
    proxy.bandwidth(32_000)  # 256 kbit/s
    started = time.monotonic()
    assert len(r.get("big") or b"") == 96_000
    assert time.monotonic() - started >= 2.5  # 96 kB at 32 kB/s: 3 s, less the first slice


def test_a_flaky_link_resets_connections_at_the_rate_it_was_given(proxy: FaultProxy) -> None:
    socks = [raw(proxy) for _ in range(4)]
    proxy.flaky(1.0)
    deadline = time.monotonic() + 60
    while proxy.stats.resets < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    proxy.flaky(0.0)
    assert proxy.stats.resets == 4
    for sock in socks:
        with pytest.raises(ConnectionResetError):
            sock.recv(100)


def test_the_brains_hot_state_gives_up_on_a_cut_link_instead_of_waiting_for_ever(
    proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition between the brain's host and Redis's (bytes dropped, no FIN): without a socket
    timeout the brain's next command waited for a reply for ever. The timeout is shortened here
    so the test is quick; what is tested is that HotState's client has one."""
    from brain.hot import state

    monkeypatch.setitem(state.HOT_SOCKET_OPTIONS, "socket_timeout", 1.0)
    hot = state.HotState.from_url(proxy.admin_url)  # type: ignore[attr-defined]
    _OPENED.append(hot.r)
    assert hot.r.ping()
    proxy.cut()
    with pytest.raises(redis.TimeoutError):
        hot.r.get("k")
    proxy.heal()
    assert hot.r.ping()  # the same client reconnects once the link is back
