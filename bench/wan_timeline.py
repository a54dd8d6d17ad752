"""Where a call's round trips go over the WAN link: a ``MONITOR`` timeline of one call each side.

    python -m bench.wan_timeline [--delay-ms 50]

The ``bench/wan.py`` rig (the agent and the baseline's worker each behind a fault proxy),
warmed up at the delay, then one Vancetope client call and one plain-Celery call, each
under redis-server's ``MONITOR``. Printed per side: the call's push onto the far side's
queue, then every command that came through that side's proxy, in the order Redis ran
them, with the time since the push in ms and in round trips. The far side sends a burst,
waits for its replies (one round trip), sends the next: the bursts before the result is
written are the round trips a call waits for. Not part of ``bench/run.py``: ``MONITOR``
slows Redis down, so no timed number comes from here.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench.client_rt import CLIENT_ID, QUEUE
from bench.faultproxy import FaultProxy
from bench.wan import DELAY_S, WARMUP, Rig, baseline_call, client_call, wan_rig
from workers.contracts import client_keyprefix, client_queue

_SHOWN_CHARS = 120


@dataclass(frozen=True)
class Command:
    at: float  # redis-server's clock, unix seconds
    port: int
    text: str


def monitored(url: str, action: Callable[[], object]) -> list[Command]:
    """The commands redis-server ran while ``action`` ran (and ~0.3 s either side)."""
    seen: list[Command] = []
    stop = threading.Event()
    ready = threading.Event()

    def watch() -> None:
        client = redis.Redis.from_url(url)
        try:
            with client.monitor() as monitor:
                ready.set()
                while not stop.is_set():
                    got: dict[str, Any] = monitor.next_command()
                    seen.append(Command(got["time"], int(got["client_port"] or 0), got["command"]))
        finally:
            client.close()

    thread = threading.Thread(target=watch, name="monitor", daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("MONITOR did not start")
    time.sleep(0.3)
    action()
    time.sleep(0.3)
    stop.set()
    nudge = redis.Redis.from_url(url)  # one command more, so next_command() returns
    nudge.ping()
    nudge.close()
    thread.join(5)
    return seen


def render(
    title: str,
    commands: list[Command],
    far: set[int],
    is_push: Callable[[str], bool],
    is_result: Callable[[str], bool],
    rtt_s: float,
) -> str:
    """The far side's commands from the call's push on, numbered by burst, up to its result."""
    push = next((c for c in commands if c.port not in far and is_push(c.text)), None)
    if push is None:
        return f"{title}: the call's push was not seen"
    lines = [f"== {title}: the call pushed at 0 ms (RTT {rtt_s * 1000:g} ms)"]
    burst, last = 0, None
    for c in commands:
        if c.at < push.at or c.port not in far:
            continue
        if last is None or c.at - last > rtt_s / 4:
            burst += 1
        last = c.at
        since = c.at - push.at
        lines.append(
            f"  {since * 1000:7.1f} ms {since / rtt_s:4.1f} RTT  #{burst:<2} :{c.port} {c.text[:_SHOWN_CHARS]}"
        )
        if is_result(c.text):
            lines.append(f"  -> the result reached Redis {since / rtt_s:.2f} round trips after the push")
            break
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wan_timeline", description=__doc__.splitlines()[0])
    parser.add_argument("--delay-ms", type=float, default=DELAY_S * 1000, help="delay each way")
    args = parser.parse_args(argv)
    delay_s = args.delay_ms / 1000
    agent_queue = client_keyprefix(CLIENT_ID) + client_queue(CLIENT_ID)
    with tempfile.TemporaryDirectory(prefix="vancetope-bench-") as tmp, wan_rig(Path(tmp)) as rig:
        rig.delay(delay_s)
        for i in range(WARMUP):
            baseline_call(rig, f"w{i}")
            client_call(rig)
        print(
            _side(
                rig,
                "Vancetope client call",
                rig.agent_link,
                lambda: client_call(rig),
                lambda t: t.startswith(f"LPUSH {agent_queue} "),
                lambda t: '"tool_result"' in t,
                delay_s,
            )
        )
        print(
            _side(
                rig,
                "plain Celery send_task().get()",
                rig.worker_link,
                lambda: baseline_call(rig, "x"),
                lambda t: t.startswith(f"LPUSH {QUEUE} "),
                lambda t: t.startswith("PUBLISH celery-task-meta-"),
                delay_s,
            )
        )
    return 0


def _side(
    rig: Rig,
    title: str,
    link: FaultProxy,
    action: Callable[[], object],
    is_push: Callable[[str], bool],
    is_result: Callable[[str], bool],
    delay_s: float,
) -> str:
    before = link.upstream_ports()
    commands = monitored(rig.stack.redis_url, action)
    far = before | link.upstream_ports()  # also a connection opened or closed meanwhile
    return render(title, commands, far, is_push, is_result, 2 * delay_s)


if __name__ == "__main__":
    raise SystemExit(main())
