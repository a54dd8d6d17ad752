"""``python -m brain.gateway``: the gateway process (what `vancetope gateway` and the embedded
stack run). Settings from the environment (``VANCETOPE_*``); Redis from VANCETOPE_REDIS_URL."""

from __future__ import annotations

import logging
import sys
import time

from brain.config import load_settings
from brain.errors import BrainError, StackNotRunning
from brain.gateway.backend import Backend
from brain.gateway.server import serve

# The brain publishes its registry once its MCP servers answered; wait for it this long.
READY_TIMEOUT_S = 120.0
log = logging.getLogger("vancetope.gateway")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings()
    except BrainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not settings.redis_url:
        print(
            "error: set VANCETOPE_REDIS_URL: the gateway serves the stack behind that Redis", file=sys.stderr
        )
        return 2
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            backend = Backend.connect(settings, settings.redis_url)
            break
        except StackNotRunning as exc:
            if time.monotonic() > deadline:
                print(f"error: {exc}", file=sys.stderr)
                return 3
            log.info("waiting for the brain: %s", exc)
            time.sleep(1.0)
    try:
        serve(backend, settings.redis_url, settings.gateway_host, settings.gateway_port)
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
