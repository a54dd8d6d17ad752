"""How much each client keeps in Redis (layer: brain, Redis glue).

A client may write any key under its own prefix ``c:<id>:``; the brain measures them all
with one SCAN of the keyspace (the brain's user may SCAN; a client's may not) and a
pipelined ``MEMORY USAGE`` per key found, ``SCAN_COUNT`` keys a round trip, so Redis is
never held for long. The reconciler calls it at most every ``QUOTA_EVERY_S``.
"""

from __future__ import annotations

import redis

from brain.client_health import usage_by_client
from workers.contracts import client_keys_match

SCAN_COUNT = 1000
# The quota is measured at most this often, whatever reconcile_interval_s says.
QUOTA_EVERY_S = 2.0


def measure_client_usage(r: redis.Redis) -> dict[str, int]:
    """Client id -> bytes its keys take in Redis now (keys of unenrolled ids included)."""
    used: dict[str, int] = {}
    cursor: int = 0
    while True:
        cursor, keys = r.scan(cursor, match=client_keys_match(), count=SCAN_COUNT)
        if keys:
            pipe = r.pipeline(transaction=False)
            for key in keys:
                pipe.memory_usage(key)
            sizes = pipe.execute(raise_on_error=False)
            for cid, n in usage_by_client(zip(keys, sizes, strict=True)).items():
                used[cid] = used.get(cid, 0) + n
        if cursor == 0:
            return used
