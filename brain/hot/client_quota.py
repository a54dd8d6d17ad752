"""How much each client keeps in Redis (layer: brain/hot; Redis glue).

A client may write any key under its own prefix ``c:<id>:``; the brain measures them all
with one SCAN of the keyspace (the brain's user may SCAN; a client's may not) and a
pipelined ``MEMORY USAGE ... SAMPLES 0`` per key found (every element counted: by default
Redis samples five, and five tiny members beside large ones measured a few KB), ``SCAN_COUNT``
keys a round trip, so Redis is never held for long. The reconciler measures at most every
``QUOTA_EVERY_S`` with a ``UsageMeter``, which scans every time but sends ``MEMORY USAGE`` only
for the keys of clients whose size may have changed enough to matter (see there). Clients may
not ``SELECT`` another database (``brain.hot.acl``), so db 0 is where all their keys are.

Redis 6.2 cannot bound what one user writes, so a measurement is the only check: a client
found over its quota is suspended, and once its work is taken back ``free_client_keys``
deletes what it keeps (the memory is free at once, not when it chooses to stop).
"""

from __future__ import annotations

import zlib

import redis

from brain.core.client_health import owner_of_key
from brain.hot.state import as_text
from brain.hot.turns import keep_turn
from workers.contracts import KEY_NS, client_key, client_keys_match

SCAN_COUNT = 1000
# The quota is measured at most this often, whatever reconcile_interval_s says, by one brain.
QUOTA_EVERY_S = 2.0
# A client whose keys did not change names and who kept under half its quota is measured again
# this often (``UsageMeter``).
QUOTA_ALL_EVERY_S = 10.0

# Held by the brain that measures (``my_turn_to_measure``).
QUOTA_TURN_KEY = f"{KEY_NS}quota:measuring"


def my_turn_to_measure(r: redis.Redis, holder: str, lease_s: float) -> bool:
    """Whether this brain measures now: one brain keeps the turn while it lives (renewing its
    lease at each measure), another takes over within ``lease_s`` once it stops. A measure is a
    SCAN of the keyspace and a ``MEMORY USAGE`` of every client key that may have changed; each
    brain measuring every interval made a second brain's share of it as large as the first's,
    and a turn that went to whoever asked first left each brain's ``UsageMeter`` a few seconds
    stale, so each measured every busy client's keys anew (bench/README.md, "The CPU rows",
    ``brain_scale_out``)."""
    return keep_turn(r, QUOTA_TURN_KEY, holder, lease_s)


def measure_client_usage(r: redis.Redis) -> dict[str, int]:
    """Client id -> bytes its keys take in Redis now (keys of unenrolled ids included): every
    key measured."""
    return UsageMeter().measure(r, 0.0, 0)


class UsageMeter:
    """Measures what each client keeps, sparing the ``MEMORY USAGE`` of keys that are unlikely
    to have grown past the quota since last time: with 1,000 idle clients, a measure of every
    key every ``QUOTA_EVERY_S`` was ~2,500 commands a second for the brain to send and parse.

    Every call scans all client keys (cheap: names only, ``SCAN_COUNT`` a round trip). A key
    that was not there last time is measured at once (a flood of new keys is found at the next
    call). All of a client's keys are measured again when it was not measured before, when it
    kept more than half its quota last time (a client near its quota is measured every call),
    or once every ``QUOTA_ALL_EVERY_S``, each client at a phase of its own so the measures are
    spread. Otherwise each key keeps its last size (a key gone counts nothing). So a client
    growing keys it already had, from well under its quota, is found within
    ``QUOTA_ALL_EVERY_S`` plus one call instead of one call; Redis cannot bound a user's memory
    anyway, only find it afterwards. A busy client makes new keys all the time (a delivery
    counter per run): measuring all its keys whenever one was new was, in a 2,000-call tree,
    ~5 ``MEMORY USAGE`` per call (bench/README.md, ``brain_scale_out``)."""

    def __init__(self) -> None:
        self._sizes: dict[str, dict[bytes, int]] = {}  # client -> key -> bytes when measured
        self._period: dict[str, int] = {}  # client -> the QUOTA_ALL_EVERY_S period it was measured in

    def measure(self, r: redis.Redis, now: float, quota: int) -> dict[str, int]:
        """Client id -> bytes its keys take in Redis (keys of unenrolled ids included);
        ``now``: a monotonic clock."""
        keys = _client_keys(r)
        due: list[bytes] = []
        periods: dict[str, int] = {}
        whole: set[str] = set()  # clients measured key by key this time
        for owner, names in keys.items():
            period = periods[owner] = int((now + _phase(owner)) // QUOTA_ALL_EVERY_S)
            last = self._sizes.get(owner)
            if last is None or self._period.get(owner) != period or 2 * sum(last.values()) > quota:
                whole.add(owner)
                due.extend(names)
            else:
                due.extend(k for k in names if k not in last)
        measured: dict[str, dict[bytes, int]] = {}
        for i in range(0, len(due), SCAN_COUNT):
            chunk = due[i : i + SCAN_COUNT]
            pipe = r.pipeline(transaction=False)
            for key in chunk:
                pipe.memory_usage(key, samples=0)
            for key, size in zip(chunk, pipe.execute(raise_on_error=False), strict=True):
                of = owner_of_key(key)
                if of is not None:
                    # A key gone meanwhile (None) or refused counts nothing.
                    measured.setdefault(of, {})[key] = size if isinstance(size, int) else 0
        sizes: dict[str, dict[bytes, int]] = {}
        for owner, names in keys.items():
            new = measured.get(owner, {})
            if owner in whole:
                sizes[owner] = new
                self._period[owner] = periods[owner]
            else:
                last = self._sizes[owner]
                sizes[owner] = {k: new[k] if k in new else last[k] for k in names}
        self._sizes = sizes
        self._period = {owner: p for owner, p in self._period.items() if owner in sizes}
        return {owner: sum(by_key.values()) for owner, by_key in sizes.items()}


def _client_keys(r: redis.Redis) -> dict[str, list[bytes]]:
    """Client id -> the names of its keys now (one SCAN of the keyspace)."""
    keys: dict[str, list[bytes]] = {}
    cursor: int = 0
    while True:
        cursor, found = r.scan(cursor, match=client_keys_match(), count=SCAN_COUNT)
        for key in found:
            name = key if isinstance(key, bytes) else str(key).encode()
            owner = owner_of_key(name)
            if owner is not None:
                keys.setdefault(owner, []).append(name)
        if cursor == 0:
            return keys


def _phase(client_id: str) -> float:
    """Where in each ``QUOTA_ALL_EVERY_S`` period ``client_id`` is measured (stable)."""
    return (zlib.crc32(client_id.encode()) % 1000) / 1000 * QUOTA_ALL_EVERY_S


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
