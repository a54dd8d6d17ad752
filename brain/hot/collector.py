"""The cyclic garbage collector held off while a bounded burst of objects is made (layer:
brain/hot; process glue).

CPython collects its youngest objects every 700 net allocations, and an object alive during
that collection moves to an older generation; once enough have moved, a full collection
walks every object of the process (a brain's modules, Celery, its caches). A burst that holds
thousands of short-lived objects at once (a requeue's chunk of 1,000 refs, the heartbeat
sweep's reading of every connected client) set off many collections of its own, moved its
objects on, and so set off full collections: their cost grew with the burst times the heap.
With 1,000 idle clients that was a fifth of the sweep's time (9.5-11 of 50-60 ms), none at
100: a client cost the brain a third more at 1,000 than at 100 (bench/README.md,
``idle_clients_1000``). Held off for the burst, the objects are freed by their reference
counts before any collection sees them.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# Holds in progress in this process, on any thread: the collector is switched off by the first
# and back on (if it was on then) by the last, so one thread's end cannot switch it on in the
# middle of another's burst.
_lock = threading.Lock()
_holds = 0
_was_on = False


@contextmanager
def collector_held() -> Iterator[None]:
    """No cyclic collection in this process meanwhile (process wide: keep the burst short,
    milliseconds; a Redis reply it waits for counts). The collector is switched back on when
    the last hold of any thread ends, and only if it was on when the first began."""
    global _holds, _was_on
    with _lock:
        if _holds == 0:
            _was_on = gc.isenabled()
            gc.disable()
        _holds += 1
    try:
        yield
    finally:
        with _lock:
            _holds -= 1
            if _holds == 0 and _was_on:
                gc.enable()
