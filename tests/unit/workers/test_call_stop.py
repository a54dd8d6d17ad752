"""workers.call_stop: how a worker waits on a running call and gives it up when its task is
cancelled (a fake clock, a call that "finishes" when told), and the check itself on a real
Redis behind a link that goes silent."""

from __future__ import annotations

import time

import pytest
import redis

from bench.faultproxy import FaultProxy
from brain.stack.redis_server import RedisServer
from tests.conftest import InThread, wait_until
from workers.app import make_app
from workers.call_stop import Waited, wait_unless_stopped
from workers.contracts import ToolCall, ToolResult, ToolType, key_cancelled, stop_member
from workers.execute import execute
from workers.tasks import ASK_TIMEOUTS, HotState, must_stop, register


class FakeCall:
    """``done(seconds)`` advances a fake clock by the seconds waited, or to ``ends_at``."""

    def __init__(self, ends_at: float) -> None:
        self.now = 0.0
        self.ends_at = ends_at
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    def done(self, seconds: float) -> bool:
        self.waits.append(seconds)
        if self.now + seconds >= self.ends_at:
            self.now = max(self.now, self.ends_at)
            return True
        self.now += seconds
        return False


def test_a_call_that_ends_within_its_first_wait_never_asks() -> None:
    call, asks = FakeCall(ends_at=0.3), []
    assert wait_unless_stopped(call.done, 60, lambda: asks.append(1) or True, clock=call.clock) is Waited.DONE
    assert asks == [] and call.waits == [1.0]


def test_a_cancelled_call_is_given_up_at_the_first_ask_that_finds_it() -> None:
    call, answers = FakeCall(ends_at=3600), iter([False, False, True])
    waited = wait_unless_stopped(call.done, 3600, lambda: next(answers), clock=call.clock)
    assert waited is Waited.STOPPED
    assert call.now == 3.0  # three waits of a second, an ask after each


def test_the_timeout_still_bounds_a_call_nobody_cancelled() -> None:
    call = FakeCall(ends_at=3600)
    assert wait_unless_stopped(call.done, 2.5, lambda: False, clock=call.clock) is Waited.TIMED_OUT
    assert call.waits == [1.0, 1.0, 0.5]


def test_an_ask_that_fails_is_not_a_cancel_the_call_runs_on() -> None:
    def unreachable() -> bool:
        raise ConnectionError("Redis is away")

    call = FakeCall(ends_at=2.2)
    assert wait_unless_stopped(call.done, 60, unreachable, clock=call.clock) is Waited.DONE


@pytest.mark.parametrize("ends_at, expected", [(5.0, Waited.DONE), (500.0, Waited.TIMED_OUT)])
def test_without_an_ask_it_is_one_wait_of_the_whole_timeout(ends_at: float, expected: Waited) -> None:
    call = FakeCall(ends_at=ends_at)
    assert wait_unless_stopped(call.done, 60, None, clock=call.clock) is expected
    assert call.waits == [60]


def test_the_stop_check_on_a_silent_link_gives_up_and_the_call_ends_as_it_would(
    redis_server: RedisServer,
) -> None:
    """Found by a reviewer: the check ran on a connection without a socket timeout, so a link
    gone silent (bytes dropped, the socket open: Wi-Fi, a VPN, a NAT) held the call, its slot
    and its result in a SISMEMBER for as long as redis-py's default allowed (for ever on
    redis-py 7). The server pool's check has a connection of its own with short timeouts now
    (a client agent asks on its channel's connections, whose 10 s socket timeout bounds it)."""
    host, port = redis_server.url.split("//")[1].split("/")[0].rsplit("@", 1)[-1].rsplit(":", 1)
    with FaultProxy((host, int(port))) as proxy:
        hot = HotState(make_app(proxy.url(redis_server.url)))
        assert hot.stopped("r1") is False  # connected, through the proxy
        assert hot._asker is not None
        assert (
            hot._asker.connection_pool.connection_kwargs["socket_timeout"] == ASK_TIMEOUTS["socket_timeout"]
        )
        call = ToolCall(run_id="r1", tree_id="t1", task_id="k1", tool="sleep", tool_type=ToolType.BUILT_IN,
                        args={"seconds": 3}, timeout_s=600, max_result_bytes=10_000)  # fmt: skip
        running = InThread(lambda: execute(call, mcp=None, worker="w", stopped=lambda: hot.stopped("r1")))
        time.sleep(1.5)
        proxy.cut()  # the link goes silent mid-call: each check fails after its timeout
        wait_until(running.done, timeout=60, what="the call to end with the link silent")
        assert running.result().ok  # it ran to its end; a failed check is not a stop


def test_a_run_must_stop_when_its_stop_member_is_in_its_workers_cancelled_set_only(
    redis_client: redis.Redis,
) -> None:
    """The server pool's check and a client agent's (on its channel's connections) are this
    one read: a run cancelled before it began (its plain id, which ``begin_run`` refuses) is no
    stop, nor is another worker's cancel."""
    redis_client.sadd("c:laptop:" + key_cancelled(), stop_member("r1"), "r2")
    redis_client.sadd("c:desk:" + key_cancelled(), stop_member("r3"))
    assert must_stop(redis_client, "c:laptop:", "r1")
    assert not must_stop(redis_client, "c:laptop:", "r2")
    assert not must_stop(redis_client, "c:laptop:", "r3")


def test_a_run_asks_whether_to_stop_where_its_worker_says_not_on_a_connection_of_its_own() -> None:
    """A client agent asks on its channel's connections (``register(stop_asked=...)``): the
    check's own connection stayed open after the agent's first call longer than ``STOP_POLL_S``,
    a connection more per workstation (two with both threads busy). The answer it gets decides:
    here the call is stopped at the second ask."""
    app = make_app("redis://127.0.0.1:1/0")  # eager; a connection of the check's own would fail
    app.conf.task_always_eager = True
    recorded: list[ToolResult] = []
    asked: list[str] = []

    def stop_asked(run_id: str) -> bool:
        asked.append(run_id)
        return len(asked) >= 2

    run_tool = register(
        app,
        sink=recorded.append,
        begin=lambda call, worker, started: 1,
        task_events=False,
        client_id="laptop",
        stop_asked=stop_asked,
    )
    call = ToolCall(
        run_id="t.k.1", tree_id="t", task_id="k", tool="sleep", tool_type=ToolType.BUILT_IN,
        args={"seconds": 5}, timeout_s=60, max_result_bytes=1000, client_id="laptop",
    )  # fmt: skip
    run_tool.apply(args=[call.model_dump(mode="json")])
    assert asked == ["t.k.1", "t.k.1"]
    assert [(r.ok, r.error and r.error.type) for r in recorded] == [(False, "Cancelled")]
    app.close()
