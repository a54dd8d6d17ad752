"""workers.execute.Throttle: an MCP server's progress through a token bucket (a short burst
passes whole, then at most ``RATE`` a second, coalesced) and never lost (the latest one waiting
goes when the next token is due, or at the end of the call). A fake clock and a fake timer:
nothing sleeps."""

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


def spend_burst(rig: Rig) -> None:
    """Spend the burst at t=0 (progress -5..-1), so what follows meets the steady rate."""
    for i in range(Throttle.BURST):
        rig.at(0.0, -Throttle.BURST + i)
    rig.sent.clear()
    rig.sent_at.clear()


def test_a_quick_0_50_100_passes_whole_one_by_one() -> None:
    # The conformance scenario tools-call-with-progress: three within 100 ms, three notifications.
    rig = Rig()
    rig.at(0.00, 0)
    rig.at(0.05, 50)
    rig.at(0.10, 100)
    assert rig.sent == [(0, 100), (50, 100), (100, 100)] and not rig.timers


def test_past_the_burst_an_update_waits_for_the_next_token_and_the_latest_wins() -> None:
    rig = Rig()
    spend_burst(rig)
    rig.at(0.00, 0)
    rig.at(0.05, 50)
    rig.at(0.10, 100)
    assert rig.sent == []  # no token left: they wait
    assert len(rig.timers) == 1 and abs(rig.timers[0].started + rig.timers[0].delay - 0.2) < 1e-9
    rig.fire(0.20)
    assert rig.sent == [(100, 100)]  # 0 and 50 were replaced by the later 100


def test_an_update_waiting_is_sent_when_the_token_comes_even_if_none_follows() -> None:
    rig = Rig()
    spend_burst(rig)
    rig.at(0.05, 50)
    rig.fire(0.20)
    assert rig.sent == [(50, 100)]


def test_the_end_of_the_call_flushes_the_update_waiting_and_stops_its_timer() -> None:
    rig = Rig()
    spend_burst(rig)
    rig.at(0.00, 0)
    rig.at(0.05, 50)
    rig.throttle.flush()
    assert rig.sent == [(50, 100)] and rig.timers[0].cancelled
    rig.at(0.50, 60)  # a straggler after the result: never sent
    assert rig.sent == [(50, 100)]


def test_thousands_are_coalesced_to_the_burst_then_the_rate_and_the_latest_always_arrives() -> None:
    rig = Rig()
    for i in range(1000):  # one every millisecond for a second
        rig.advance(i * 0.001)
        rig.at(i * 0.001, i)
    rig.advance(0.9995)
    rig.throttle.flush()
    assert rig.sent[-1] == (999, 100)
    assert [p for p, _ in rig.sent[: Throttle.BURST]] == list(range(Throttle.BURST))  # the burst, whole
    gaps = [
        b - a for a, b in zip(rig.sent_at[Throttle.BURST :], rig.sent_at[Throttle.BURST + 1 :], strict=False)
    ]
    assert all(gap >= Throttle.EVERY_S - 1e-9 for gap in gaps[:-1]), gaps  # the flush may come sooner
    assert Throttle.BURST + 4 <= len(rig.sent) <= Throttle.BURST + 7, rig.sent
    progress = [p for p, _ in rig.sent]
    assert progress == sorted(progress)  # in order, never an older one after a newer one


def test_the_bucket_refills_after_a_quiet_spell() -> None:
    rig = Rig()
    spend_burst(rig)
    for i in range(Throttle.BURST):
        rig.at(1.0 + i * 0.01, i)  # a second later: a whole burst again
    assert [p for p, _ in rig.sent] == list(range(Throttle.BURST)) and not rig.timers


def test_updates_further_apart_than_the_interval_all_pass_at_once() -> None:
    rig = Rig()
    spend_burst(rig)
    for i, now in enumerate([0.2, 0.4, 0.6]):
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
    assert seen == [(0, 100), (50, 100)]  # both, before the result


def test_the_real_timer_sends_the_update_waiting_without_a_flush() -> None:
    got = threading.Event()
    sent: list[float] = []

    def sink(update: ToolProgress) -> None:
        sent.append(update.progress)
        if update.progress == 50:
            got.set()

    throttle = Throttle(CALL, sink, None, time.monotonic)
    throttle.tokens = 1  # the burst nearly spent
    throttle(0, 100, None)
    throttle(50, 100, None)
    assert got.wait(60), sent  # the interval ended; nothing else came, no flush
    assert sent == [0, 50]
