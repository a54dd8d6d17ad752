"""Blocked and pending-client tasks waiting in Redis (layer: brain, Redis glue).

The store says *that* a task is blocked or pending_client; these lists say in
which order they wait and for whom (``user:<name>`` or ``client:<id>``). On a
client's connect, its lists move in one Lua step per chunk to a per-client
``requeueing`` list, so a ref is always in exactly one list: a crash between
steps leaves it in ``requeueing``, which the next connect or sweep finishes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import redis
from pydantic import BaseModel, ConfigDict, Field

from brain.hotstate import as_bytes, as_text
from workers.contracts import KEY_NS, key_parked, key_requeueing

# Chunks keep each EVAL short: one script over 100k refs would stall Redis for
# everyone (PERFORMANCE.md: ~170 ms), 1,000 at a time costs a few ms each.
CHUNK = 1000

_MOVE = """
local moved = 0
for i = 2, #KEYS do
  local items = redis.call('LRANGE', KEYS[i], 0, tonumber(ARGV[1]) - 1)
  if #items > 0 then
    redis.call('RPUSH', KEYS[1], unpack(items))
    redis.call('LTRIM', KEYS[i], #items, -1)
    moved = moved + #items
  end
end
return moved
"""


class ParkedRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tree_id: str
    task_id: str
    owner: str
    parked_at: float
    # Every park makes a distinct ref. A task re-parked with its old parked_at (to keep its
    # place) would otherwise produce the same bytes, and LREM of one thread's ref could
    # remove the copy another thread has just parked: the task then waits in no list.
    nonce: str = Field(default_factory=lambda: uuid.uuid4().hex[:16])


def owner_of(user: str | None, client_id: str | None) -> str:
    """Work for a user may run on any of that user's clients; without a user, only on one client."""
    if user:
        return f"user:{user}"
    if client_id:
        return f"client:{client_id}"
    return "anyone"


class ParkedWork:
    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self._move = r.register_script(_MOVE)

    def park(self, ref: ParkedRef) -> None:
        self.r.rpush(key_parked(ref.owner), ref.model_dump_json())

    def take_for(self, client_id: str, owners: Iterable[str]) -> list[tuple[bytes, ParkedRef]]:
        """Move every ref of ``owners`` into this client's requeueing list; return that list
        (with leftovers of an interrupted earlier take), oldest parked first."""
        keys = [key_requeueing(client_id), *(key_parked(o) for o in owners)]
        while int(self._move(keys=keys, args=[CHUNK])) > 0:
            pass
        raw = self.r.lrange(key_requeueing(client_id), 0, -1)
        refs = [(as_bytes(item), ParkedRef.model_validate_json(item)) for item in raw]
        return sorted(refs, key=lambda pair: pair[1].parked_at)

    def placed(self, client_id: str, raw: bytes) -> None:
        """A ref taken by ``take_for`` has been dispatched or re-parked: drop it."""
        self.r.lrem(key_requeueing(client_id), 1, as_text(raw))

    def waiting(self) -> dict[str, int]:
        """Owner -> number of refs parked for it (for `vancetope clients`)."""
        prefix = key_parked("")
        counts: dict[str, int] = {}
        for key in self.r.scan_iter(match=f"{prefix}*", count=500):
            counts[key.decode()[len(prefix) :]] = int(self.r.llen(key))
        return counts

    def requeueing_clients(self) -> list[str]:
        prefix = f"{KEY_NS}requeueing:"
        return [k.decode()[len(prefix) :] for k in self.r.scan_iter(match=f"{prefix}*", count=500)]
