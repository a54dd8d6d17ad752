"""When each task waiting to retry starts its next attempt (layer: brain/hot; Redis glue).

The store says *that* a task is ``retrying`` and when (``TaskRecord.retry_at``); this sorted
set says it to the brain cheaply: one ``ZRANGEBYSCORE`` finds what is due, whatever the
number of tasks waiting. A wait holds no worker and no thread, and survives a brain restart
(the set is in Redis, and the reconciler adds back from the store what a lost Redis forgot:
``brain.runtime.sweeps``). Several brains may poll it: ``ZREM`` decides which one starts a
due attempt, and the start itself is a compare-and-set from ``retrying`` in the store.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis

from brain.hot.state import as_text
from workers.contracts import key_retry_at

RETRY_AT_KEY = key_retry_at()
_SEP = "\x1f"  # ids never hold it (brain.core.models.ID_BODY)


def _member(tree_id: str, task_id: str) -> str:
    return f"{tree_id}{_SEP}{task_id}"


class RetryTimers:
    def __init__(self, r: redis.Redis) -> None:
        self.r = r

    def set(self, tree_id: str, task_id: str, at: float) -> None:
        self.r.zadd(RETRY_AT_KEY, {_member(tree_id, task_id): at})

    def ensure(self, timers: Iterable[tuple[str, str, float]]) -> int:
        """Add the timers the set does not hold (NX: a timer already there keeps its time).
        How many were missing."""
        mapping = {_member(tree_id, task_id): at for tree_id, task_id, at in timers}
        return int(self.r.zadd(RETRY_AT_KEY, mapping, nx=True) or 0) if mapping else 0

    def take_due(self, now: float, limit: int = 100) -> list[tuple[str, str]]:
        """The (tree id, task id) of attempts due by ``now``, oldest first, each removed from
        the set: only the caller whose ``ZREM`` removed it gets it."""
        found = self.r.zrangebyscore(RETRY_AT_KEY, "-inf", now, start=0, num=limit)
        due = [m for m in found if isinstance(m, (bytes, str))]
        if not due:
            return []
        pipe = self.r.pipeline(transaction=False)
        for member in due:
            pipe.zrem(RETRY_AT_KEY, member)
        taken: list[tuple[str, str]] = []
        for member, removed in zip(due, pipe.execute(), strict=True):
            if removed:
                tree_id, _, task_id = as_text(member).partition(_SEP)
                taken.append((tree_id, task_id))
        return taken

    def next_due(self) -> float | None:
        """When the earliest timer is due, or None when none is set."""
        first = self.r.zrange(RETRY_AT_KEY, 0, 0, withscores=True)
        return float(first[0][1]) if first else None
