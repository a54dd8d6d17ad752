"""workers.execute.Throttle: an MCP server's progress, coalesced (at most one update per
interval) and never lost (the latest one waiting goes when the interval ends, or at the end of
the call). A fake clock and a fake timer: nothing sleeps."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tests.unit.workers.helpers import FIXTURES, make_config, stdio
from workers.contracts import ToolCall, ToolProgress, ToolType
from workers.execute import Throttle, execute
from workers.mcp_clients import MCPClientManager

CALL = ToolCall(
    run_id="r1",
    tree_id="t1",
    task_id="k1",
    tool="slow",
    tool_type=ToolType.MCP,
    mcp_server="demo",
    args={},
    timeout_s=10,
    max_result_bytes=10_000,
)


class FakeTimer:
    def __init__(self, started: float, delay: float, fn: Callable[[], None]) -> None:
        self.started, self.delay, self.fn, self.cancelled = started, delay, fn, False

    def cancel(self) -> None:
        self.cancelled = True


class Rig:
    def __init__(self) -> None:
        self.now = 0.0
        self.sent: list[tuple[float, float | None]] = []
        self.sent_at: list[float] = []
        self.timers: list[FakeTimer] = []
        self.throttle = Throttle(CALL, self.sink, None, lambda: self.now, later=self.later)

    def sink(self, update: ToolProgress) -> None:
        self.sent.append((update.progress, update.total))
        self.sent_at.append(self.now)

    def later(self, delay: float, fn: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(self.now, delay, fn)
        self.timers.append(timer)
        return timer

    def at(self, now: float, progress: float, total: float | None = 100) -> None:
        self.now = now
        self.throttle(progress, total, None)

    def fire(self, now: float) -> None:
        """The interval ended: the last timer started goes off (unless cancelled)."""
        self.now = now
        timer = self.timers[-1]
        assert not timer.cancelled
        timer.fn()

    def advance(self, now: float) -> None:
        """Time passes: every timer due by ``now`` goes off, at its due time."""
        for timer in list(self.timers):
            due = timer.started + timer.delay
            if not timer.cancelled and due <= now and timer.fn is not None:
                self.now, fn, timer.fn = due, timer.fn, None  # type: ignore[assignment]
                fn()
        self.now = now


def test_a_quick_0_50_100_sends_the_first_then_the_latest_when_the_interval_ends() -> None:
    rig = Rig()
    rig.at(0.00, 0)
    rig.at(0.05, 50)
    rig.at(0.10, 100)
    assert rig.sent == [(0, 100)]  # at most one per interval
    assert len(rig.timers) == 1 and abs(rig.timers[0].started + rig.timers[0].delay - 0.2) < 1e-9
    rig.fire(0.20)
    assert rig.sent == [(0, 100), (100, 100)]  # 50 was replaced by the later 100


def test_an_update_waiting_is_sent_when_the_interval_ends_even_if_none_follows() -> None:
    # The conformance suite's case: 0/100, 50/100, then a long silence. 50/100 was lost for good.
    rig = Rig()
    rig.at(0.00, 0)
    rig.at(0.05, 50)
    rig.fire(0.20)
    assert rig.sent == [(0, 100), (50, 100)]


def test_the_end_of_the_call_flushes_the_update_waiting_and_stops_its_timer() -> None:
    rig = Rig()
    rig.at(0.00, 0)
    rig.at(0.05, 50)
    rig.throttle.flush()
    assert rig.sent == [(0, 100), (50, 100)] and rig.timers[0].cancelled
    rig.at(0.50, 60)  # a straggler after the result: never sent
    assert rig.sent == [(0, 100), (50, 100)]


def test_never_more_than_one_update_per_interval_and_the_latest_always_arrives() -> None:
    rig = Rig()
    for i in range(100):  # one every 10 ms for a second
        rig.advance(i * 0.01)
        rig.at(i * 0.01, i)
    rig.advance(0.995)
    rig.throttle.flush()
    assert rig.sent[-1] == (99, 100)
    gaps = [b - a for a, b in zip(rig.sent_at, rig.sent_at[1:], strict=False)]
    assert all(gap >= Throttle.EVERY_S - 1e-9 for gap in gaps[:-1]), gaps  # the flush may come sooner
    assert 5 <= len(rig.sent) <= 7, rig.sent


def test_updates_further_apart_than_the_interval_all_pass_at_once() -> None:
    rig = Rig()
    for i, now in enumerate([0.0, 0.3, 0.6]):
        rig.at(now, i)
    assert rig.sent == [(0, 100), (1, 100), (2, 100)] and not rig.timers


def test_a_real_servers_quick_0_50_then_silence_reports_50_before_the_result() -> None:
    manager = MCPClientManager(make_config({"rich": stdio(str(FIXTURES / "mcp_rich_server.py"))}))
    seen: list[tuple[float, float | None]] = []
    try:
        call = CALL.model_copy(
            update={"tool": "burst", "mcp_server": "rich", "args": {"steps": [0, 50], "then_s": 0.5}}
        )
        result = execute(
            call, mcp=manager, worker="w1", progress=lambda u: seen.append((u.progress, u.total))
        )
    finally:
        manager.close()
    assert result.ok, result.error
    assert seen == [(0, 100), (50, 100)]  # 50/100 came when the interval ended, not never


def test_the_real_timer_sends_the_update_waiting_without_a_flush() -> None:
    got = threading.Event()
    sent: list[float] = []

    def sink(update: ToolProgress) -> None:
        sent.append(update.progress)
        if update.progress == 50:
            got.set()

    throttle = Throttle(CALL, sink, None, time.monotonic)
    throttle(0, 100, None)
    throttle(50, 100, None)
    assert got.wait(5), sent  # the interval ended; nothing else came, no flush
    assert sent == [0, 50]
