"""How much each client keeps in Redis (layer: brain/hot; Redis glue).

A client may write any key under its own prefix ``c:<id>:``; the brain measures them all
with one SCAN of the keyspace (the brain's user may SCAN; a client's may not) and a
pipelined ``MEMORY USAGE ... SAMPLES 0`` per key found (every element counted: by default
Redis samples five, and five tiny members beside large ones measured a few KB), ``SCAN_COUNT``
keys a round trip, so Redis is never held for long. The reconciler calls it at most every
``QUOTA_EVERY_S``. Clients may not ``SELECT`` another database (``brain.hot.acl``), so db 0 is
where all their keys are.

Redis 6.2 cannot bound what one user writes, so a measurement is the only check: a client
found over its quota is suspended, and once its work is taken back ``free_client_keys``
deletes what it keeps (the memory is free at once, not when it chooses to stop).
"""

from __future__ import annotations

import redis

from brain.core.client_health import usage_by_client
from brain.hot.state import as_text
from workers.contracts import KEY_NS, client_key, client_keys_match

SCAN_COUNT = 1000
# The quota is measured at most this often, whatever reconcile_interval_s says, by one brain.
QUOTA_EVERY_S = 2.0
# Held by the brain that measures, for QUOTA_EVERY_S (``my_turn_to_measure``).
QUOTA_TURN_KEY = f"{KEY_NS}quota:measuring"


def my_turn_to_measure(r: redis.Redis, holder: str) -> bool:
    """Whether this brain measures now: the first to ask in each ``QUOTA_EVERY_S`` does (a lease,
    ``SET NX PX``), the others skip it. A measure is a SCAN of the keyspace and a ``MEMORY
    USAGE`` of every client key; each brain measuring every interval made a second brain's
    share of it as large as the first's (bench/README.md, "The CPU rows")."""
    return bool(r.set(QUOTA_TURN_KEY, holder, nx=True, px=int(QUOTA_EVERY_S * 1000)))


def measure_client_usage(r: redis.Redis) -> dict[str, int]:
    """Client id -> bytes its keys take in Redis now (keys of unenrolled ids included)."""
    used: dict[str, int] = {}
    cursor: int = 0
    while True:
        cursor, keys = r.scan(cursor, match=client_keys_match(), count=SCAN_COUNT)
        if keys:
            pipe = r.pipeline(transaction=False)
            for key in keys:
                pipe.memory_usage(key, samples=0)
            sizes = pipe.execute(raise_on_error=False)
            for cid, n in usage_by_client(zip(keys, sizes, strict=True)).items():
                used[cid] = used.get(cid, 0) + n
        if cursor == 0:
            return used


def free_client_keys(r: redis.Redis, client_id: str, keep: frozenset[str] = frozenset()) -> int:
    """Delete every key of ``client_id`` but ``keep``; the number deleted. For a client over its
    quota, after its session was ended (its unstarted calls taken back): what its outbox still
    held is lost, and the reconciler re-sends those calls, as for any result lost in transit."""
    deleted = 0
    cursor: int = 0
    while True:
        cursor, keys = r.scan(cursor, match=client_key(client_id, "*"), count=SCAN_COUNT)
        doomed = [k for k in keys if as_text(k) not in keep]
        if doomed:
            deleted += int(r.unlink(*doomed))
        if cursor == 0:
            return deleted
