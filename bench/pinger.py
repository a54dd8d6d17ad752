"""Another Redis client, in its own process: PING every ~1 ms and remember how long each took.

``python -m bench.pinger REDIS_URL`` prints ``ready`` once connected, pings until
SIGTERM, then prints one JSON list of ``[start, seconds]`` pairs (``time.monotonic()``,
which is system-wide on Linux, so the parent can cut the samples by its own windows).

A separate process, not a thread: a thread would measure the benchmark's own GIL
contention, not Redis being blocked. The 1 ms pause keeps it from taking a whole core
from Redis and the mover on a 2-core machine; any stall longer than that still lands
inside some ping.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from types import FrameType

import redis

PAUSE_S = 0.001
# A bound even if nobody sends SIGTERM (the parent crashed without its finally block).
MAX_RUNTIME_S = 600.0


def main(url: str) -> None:
    stop = False

    def on_term(_sig: int, _frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    client = redis.Redis.from_url(url)
    client.ping()
    print("ready", flush=True)
    samples: list[tuple[float, float]] = []
    deadline = time.monotonic() + MAX_RUNTIME_S
    while not stop and time.monotonic() < deadline:
        started = time.monotonic()
        client.ping()
        samples.append((started, time.monotonic() - started))
        time.sleep(PAUSE_S)
    client.close()
    sys.stdout.write(json.dumps(samples))
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1])
