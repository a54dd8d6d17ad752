"""A worker whose stack was killed does not outlive it (layer: workers, process glue).

``brain.stack.children`` starts each of the stack's services so that the kernel sends it SIGTERM
when the stack's process dies (SIGKILL, OOM), and Celery turns that SIGTERM into a warm
shutdown. A warm shutdown waits for the tasks under way, and its flag is only read by the
consumer's loop: a worker still starting when Redis went down with the stack retries its
``worker-online`` event without end and never reads it (seen in CI: the pool was still
running minutes later, logging "could not renew pool presence ... Connection refused" every
5 s). When ``vancetope up`` stops the stack it sends SIGKILL after its timeout, as systemd
would; when the stack itself is gone nobody is left to. So a worker the stack started,
whose stack is gone, gets ``ORPHAN_GRACE_S`` for its warm shutdown and is then killed with
its process group (its pool's children). A task cut off this way is delivered again (late
ack).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("vancetope.worker")

# Set by brain.stack.children to the stack's pid, for the service it starts.
STACK_PID_VARIABLE = "VANCETOPE_STACK_PID"
# As long as `vancetope up` gives a service to stop before its SIGKILL (EmbeddedStack.stop).
ORPHAN_GRACE_S = 20.0


def stack_gone(env: Mapping[str, str] = os.environ) -> bool:
    """True if the stack started this process and has died since (the kernel gave the
    process another parent)."""
    raw = env.get(STACK_PID_VARIABLE, "")
    return raw.isdigit() and os.getppid() != int(raw)


def _on_shutting_down(**_: Any) -> None:
    # Runs in Celery's SIGTERM handler, in the main thread: only start the timer here.
    if stack_gone():
        threading.Thread(
            target=_kill_after, args=(ORPHAN_GRACE_S,), name="vancetope-orphan", daemon=True
        ).start()


def _kill_after(grace_s: float) -> None:
    time.sleep(grace_s)
    log.error(
        "the stack that started this worker is gone and its warm shutdown did not finish within %gs "
        "(a task still running, or Redis gone with the stack): killing it and its pool now; "
        "a task cut off is delivered again",
        grace_s,
    )
    logging.shutdown()  # flush the line above: nothing runs after SIGKILL
    if os.getpgid(0) == os.getpid():  # the stack starts each service in a session of its own
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def install() -> None:
    """Connect the timer to Celery's warm shutdown (every worker app does, ``workers.app``).
    Celery is imported here, not at the top: ``brain.stack.children`` reads this module's constant
    on its way to exec and should not pay for it."""
    from celery.signals import worker_shutting_down

    worker_shutting_down.connect(_on_shutting_down, weak=False, dispatch_uid="vancetope-orphans")
