"""A client call over a WAN link: 50 ms each way between the workstation and Redis (issue 25).

The ``client_round_trip`` rig (``bench/client_rt.py``: the stack's own enrolled agent
``bench-laptop``, 1-task interactive ``read_local_file`` trees) with the agent reaching
Redis only through a fault proxy (``bench/faultproxy.py``), as a laptop on a hotel's Wi-Fi
does. The baseline, plain Celery ``send_task(...).get()`` to a threads worker, has its
worker (broker and result backend) behind a second proxy with the same delay; the producer,
like the brain and the submitter, stays on loopback.

One run: first both sides at delay 0 (through the same proxies, their loopback p50s; at
least 40 calls each), then 50 ms each way; calls alternate side by side after 3 warm-up
calls each, ``calls`` per side (quick 10, full 60). ``python -m bench.wan_timeline`` shows
where the round trips of one call go (bench/README.md, "A client call over a WAN link").

Rows:

- ``wan_client_round_trip``: p50 ms over the WAN link, Vancetope / plain Celery.
- ``wan_round_trips``: (Vancetope's p50 over the link - its loopback p50) / the RTT: how
  many round trips between the workstation and Redis a call waits for. One is the least
  any call can cost (the call travels down, its result up), so the baseline is one RTT.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from bench import celery_baseline
from bench.client_rt import CLIENT_ID, QUEUE, agent_config, one_call_tree
from bench.common import BenchError, Row, bench_settings, percentile, start_vancetope
from bench.faultproxy import FaultProxy, LinkStats
from bench.rigs import Baseline, Vancetope, baseline_on
from brain.core.models import SessionKind
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack

NAME_RT = "wan_client_round_trip"
NAME_COUNT = "wan_round_trips"
GOAL_RT = 1.15
GOAL_COUNT = 1.5
DELAY_S = 0.05  # each way
RTT_MS = 2 * DELAY_S * 1000
WARMUP = 3
LOOPBACK_CALLS = 40
CALL_TIMEOUT_S = 30.0


@dataclass
class Phase:
    """The per-call times (ms) of both sides at one delay, and what went over the links."""

    base_ms: list[float] = field(default_factory=list)
    vt_ms: list[float] = field(default_factory=list)
    agent_link: LinkStats = field(default_factory=LinkStats)
    worker_link: LinkStats = field(default_factory=LinkStats)


@dataclass
class Rig:
    """The stack with its agent behind ``agent_link``, a connected brain, and the baseline's
    worker behind ``worker_link``; both links at delay 0 until a caller sets one."""

    stack: EmbeddedStack
    vt: Vancetope
    celery: Baseline
    agent_link: FaultProxy
    worker_link: FaultProxy

    def delay(self, seconds_each_way: float) -> None:
        for link in (self.agent_link, self.worker_link):
            link.delay(seconds_each_way)


@contextlib.contextmanager
def wan_rig(root: Path) -> Iterator[Rig]:
    """Start everything in ``root`` (a temp dir) and stop it on the way out, also on an error."""
    settings = bench_settings(root, agent_config=agent_config(root))
    stack = EmbeddedStack(settings, only=())
    try:
        with contextlib.chdir(root):
            stack.start()
        assert stack.redis is not None and stack.agent_url is not None
        start_vancetope(stack)
        upstream = ("127.0.0.1", stack.redis.port)
        with FaultProxy(upstream) as agent_link, FaultProxy(upstream) as worker_link:
            # Only the workstation's side crosses the link: the brain, the pool and the
            # submitter stay on loopback (as the baseline's producer does).
            stack.agent_url = agent_link.url(stack.agent_url)
            with contextlib.chdir(root):
                stack.start_service("client-agent")
            if not stack.wait_connected(CLIENT_ID, 60.0):
                raise BenchError(f"the client agent did not connect; see {settings.data_dir}/logs")
            brain = Brain.connect(settings, stack.redis_url)
            vt = Vancetope(stack, brain)
            try:
                with baseline_on(
                    stack,
                    queue=QUEUE,
                    result_backend=True,
                    pool="threads",
                    worker_url=worker_link.url(stack.redis_url),
                ) as celery:
                    yield Rig(stack, vt, celery, agent_link, worker_link)
            finally:
                vt.close()
                brain.close()
    finally:
        stack.stop()


def run(quick: bool = False) -> list[Row]:
    calls = 10 if quick else 60
    with tempfile.TemporaryDirectory(prefix="vancetope-bench-") as tmp, wan_rig(Path(tmp)) as rig:
        # A loopback call takes ~10 ms: more of them cost little and steady the p50 that
        # wan_round_trips subtracts (on a busy box 10 calls measured it at 39 ms, 60 at 22).
        loopback = _phase(rig, max(calls, LOOPBACK_CALLS))
        rig.delay(DELAY_S)
        wan = _phase(rig, calls)
        ping_ms = _ping_p50(rig.worker_link.url(rig.stack.redis_url))
    return rows(loopback, wan, ping_ms)


def _phase(rig: Rig, calls: int) -> Phase:
    """``calls`` per side at the links' present delay, alternating, after the warm-up."""
    for i in range(WARMUP):
        baseline_call(rig, f"w{i}")
        client_call(rig)
    phase = Phase()
    agent_before, worker_before = _copy(rig.agent_link.stats), _copy(rig.worker_link.stats)
    for i in range(calls):
        phase.base_ms.append(baseline_call(rig, f"v{i}") * 1000)
        phase.vt_ms.append(client_call(rig) * 1000)
    # The bytes the timed calls sent (with the heartbeats and the idle polls of that time).
    phase.agent_link = _minus(rig.agent_link.stats, agent_before)
    phase.worker_link = _minus(rig.worker_link.stats, worker_before)
    return phase


def baseline_call(rig: Rig, value: str) -> float:
    """One plain-Celery call, ``send_task(...).get()``; seconds."""
    t0 = time.perf_counter()
    got = rig.celery.app.send_task(celery_baseline.ECHO_TASK, args=[value], queue=QUEUE).get(
        timeout=CALL_TIMEOUT_S
    )
    took = time.perf_counter() - t0
    if got != value:
        raise BenchError(f"baseline echo returned {got!r}")
    return took


def client_call(rig: Rig) -> float:
    """One client call: a one-task interactive tree of the agent's client, submit -> done; seconds."""
    _, _, took = rig.vt.run_tree(
        one_call_tree(), CALL_TIMEOUT_S, session=SessionKind.INTERACTIVE, client_id=CLIENT_ID
    )
    return took


def _ping_p50(url: str, n: int = 5) -> float:
    client = redis.Redis.from_url(url)
    try:
        client.ping()  # the connection's own handshake (AUTH) is not a PING's
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            client.ping()
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        client.close()
    return percentile(times, 50)


def _copy(stats: LinkStats) -> LinkStats:
    return LinkStats(**vars(stats))


def _minus(after: LinkStats, before: LinkStats) -> LinkStats:
    return LinkStats(**{k: v - getattr(before, k) for k, v in vars(after).items()})


def rows(loopback: Phase, wan: Phase, ping_ms: float) -> list[Row]:
    calls = len(wan.vt_ms)
    base_p50, vt_p50 = percentile(wan.base_ms, 50), percentile(wan.vt_ms, 50)
    base_lo, vt_lo = percentile(loopback.base_ms, 50), percentile(loopback.vt_ms, 50)
    per_call = {
        "agent_link_bytes_per_call": (wan.agent_link.up_bytes + wan.agent_link.down_bytes) / calls,
        "worker_link_bytes_per_call": (wan.worker_link.up_bytes + wan.worker_link.down_bytes) / calls,
    }
    extra = {
        "calls": calls,
        "loopback_calls": len(loopback.vt_ms),
        "delay_ms_each_way": DELAY_S * 1000,
        "rtt_ms": RTT_MS,
        "ping_ms_through_proxy": ping_ms,
        "baseline_p50": base_p50,
        "baseline_p99": percentile(wan.base_ms, 99),
        "vancetope_p50": vt_p50,
        "vancetope_p99": percentile(wan.vt_ms, 99),
        "baseline_loopback_p50": base_lo,
        "baseline_loopback_p99": percentile(loopback.base_ms, 99),
        "vancetope_loopback_p50": vt_lo,
        "vancetope_loopback_p99": percentile(loopback.vt_ms, 99),
        "baseline_round_trips": (base_p50 - base_lo) / RTT_MS,
        "vancetope_round_trips": (vt_p50 - vt_lo) / RTT_MS,
        **per_call,
    }
    sides = (
        f"{calls} calls each, alternating, {DELAY_S * 1000:g} ms each way (a PING through the proxy "
        f"{ping_ms:.1f} ms); p99 {extra['baseline_p99']:.0f} vs {extra['vancetope_p99']:.0f} ms; "
        f"loopback ({len(loopback.vt_ms)} calls each) p50 {base_lo:.1f} vs {vt_lo:.1f} ms"
    )
    return [
        Row(
            benchmark=NAME_RT,
            metric="ms p50",
            baseline=base_p50,
            vancetope=vt_p50,
            kind="latency",
            baseline_label="plain Celery, delay().get(), its worker behind the same delay",
            goal=GOAL_RT,
            extra=extra,
            notes=f"{sides}. Vancetope: 1-task tree (read_local_file) submit -> done, the agent behind the link",
        ),
        Row(
            benchmark=NAME_COUNT,
            metric="ms over loopback",
            baseline=RTT_MS,
            vancetope=vt_p50 - vt_lo,
            kind="latency",
            baseline_label=f"one round trip ({RTT_MS:g} ms), the least a call can cost",
            goal=GOAL_COUNT,
            extra=extra,
            notes=(
                f"ratio = round trips a call waits for: (p50 {vt_p50:.0f} - loopback p50 {vt_lo:.1f} ms) "
                f"/ RTT; plain Celery's: {extra['baseline_round_trips']:.2f}. {sides}"
            ),
        ),
    ]


if __name__ == "__main__":
    for row in run(quick=True):
        print(row, f"ratio {row.ratio:.2f}")
