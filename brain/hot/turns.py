"""Whose turn it is among several brains (layer: brain/hot; Redis glue).

Two brains may run on one Redis and store (docs/reliability.md, "Two live brains"). Most of
what they do is safe twice by construction (a compare-and-set in the store, an atomic pop or
script in Redis); a job that is not, and is only worth doing once per interval, takes a turn
here first. ``my_turn``: whoever asks first in each interval does it (``SET NX PX``).
``keep_turn``: one brain keeps doing it while it lives, and another takes over within the
lease once it stops (``keep_turn.lua``).
"""

from __future__ import annotations

import os
import socket

import redis

from workers.scripts import lua


def holder_name() -> str:
    """Who holds a turn, as a person reading Redis wants to see it: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def my_turn(r: redis.Redis, key: str, holder: str, every_s: float) -> bool:
    """True for the first caller in each ``every_s`` (a lease nobody renews)."""
    return bool(r.set(key, holder, nx=True, px=max(1, int(every_s * 1000))))


def keep_turn(r: redis.Redis, key: str, holder: str, lease_s: float) -> bool:
    """True while ``holder`` holds the turn (taken when free, renewed for ``lease_s``)."""
    return bool(r.eval(lua("brain.hot", "keep_turn"), 1, key, holder, max(1, int(lease_s * 1000))))
