"""Blocked and pending-client tasks waiting in Redis (layer: brain/hot; Redis glue).

The store says *that* a task is blocked or pending_client; these lists say in
which order they wait and for whom (``user:<name>`` or ``client:<id>``).

Requeue on a client's connect works on each list **in place**, in chunks, under a
short per-list lock (:meth:`ParkedWork.requeue`): one Lua step per chunk drops the
chunk handed out before (it has been placed by then) and hands out the next one as a
single reply. A ref leaves its list only after it was placed, so a crash at any point
leaves it listed; the lock's holder is the only one who drops refs from a list's head,
and only while it still holds the lock, so two requeues can never drop each other's
unplaced refs. A requeue that finds the lock taken asks the holder for one more pass
and returns. Each pass takes exactly the refs listed when it started: refs parked
meanwhile (among them the ones it re-parks itself) are appended behind them.

Order: a list is kept in ``parked_at`` order (a park older than the list's tail, such
as a task taken back from a vanished client with its old ``parked_at``, is inserted in
its place, unless a requeue of that list is running: then it is appended), and each
chunk is placed oldest first. A connect requeues ``client:<id>`` first, then
``user:<name>``; across those two lists refs are not interleaved.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Iterator
from itertools import repeat
from typing import NamedTuple, Self

import redis

from brain.hot.collector import collector_held
from brain.hot.state import as_text
from workers.contracts import KEY_NS, key_parked, key_requeueing
from workers.scripts import lua

# Chunks keep each EVAL short: one script over 100k refs would stall Redis for
# everyone (docs/performance.md: ~170 ms), 1,000 at a time costs a few ms each.
CHUNK = 1000
# How long a requeue's lock on a list lives without a step renewing it. Placing one chunk
# (a store read, compare-and-set and dispatch per ref) must fit well within it; a holder
# that stalls longer loses the list to the next requeue and stops (placing a ref twice is
# harmless, every dispatch is a compare-and-set in the store).
LOCK_MS = 60_000

# The reference pass of bench/requeue.py (requeue_100k's baseline), which imports it from
# here. Requeue itself no longer moves refs.
_MOVE = lua("brain.hot", "move_chunk")


def _nonce() -> str:
    return uuid.uuid4().hex[:12]


_new_tuple = tuple.__new__  # builds a ParkedRef from decoded fields without a Python call


class _RefFields(NamedTuple):
    tree_id: str
    task_id: str
    owner: str
    parked_at: float
    nonce: str


class ParkedRef(_RefFields):
    """One parked task in one list. A tuple, so that decoding 100,000 of them on a connect
    costs little and leaves the garbage collector nothing to track (tuples of strings and
    floats are untracked at its first look; 100,000 tracked objects set off full
    collections that doubled some requeues' time)."""

    __slots__ = ()

    def __new__(
        cls, tree_id: str, task_id: str, owner: str, parked_at: float, nonce: str | None = None
    ) -> Self:
        # Every park makes a distinct ref. A task re-parked with its old parked_at (to keep
        # its place) would otherwise produce the same bytes, and anything removing a ref by
        # value (LREM, LINSERT's pivot) could hit the copy another thread has just parked.
        return super().__new__(cls, tree_id, task_id, owner, parked_at, nonce or _nonce())

    def encode(self) -> str:
        """``<parked_at> <tree_id> <task_id> <nonce>``: parked_at first (Lua orders by it), the
        owner left out (the list's key says it). Ids are single words by the id grammar; one
        that is not is stored as JSON, which :func:`decode_ref` still reads."""
        words = (self.tree_id, self.task_id, self.nonce)
        if any(not w or " " in w or "\n" in w or w[0] == "{" for w in words):
            return json.dumps(
                {
                    "tree_id": self.tree_id,
                    "task_id": self.task_id,
                    "parked_at": self.parked_at,
                    "nonce": self.nonce,
                }
            )
        return f"{self.parked_at!r} {self.tree_id} {self.task_id} {self.nonce}"


def decode_ref(raw: bytes | str, owner: str = "") -> ParkedRef:
    """A stored ref, compact or JSON (the JSON form also carries its owner)."""
    text = as_text(raw)
    if text.startswith("{"):
        d = json.loads(text)
        return ParkedRef(
            d["tree_id"], d["task_id"], d.get("owner", owner), float(d["parked_at"]), d.get("nonce", "")
        )
    at, tree_id, task_id, nonce = text.split(" ")
    return ParkedRef(tree_id, task_id, owner, float(at), nonce)


def decode_chunk(blob: bytes | str, owner: str = "") -> list[ParkedRef]:
    """The refs of one chunk (refs joined by newlines)."""
    text = as_text(blob)
    if not text:
        return []
    if "{" not in text:  # all compact: decoded by columns (a connect may decode 100,000)
        words = text.replace("\n", " ").split(" ")
        if len(words) == 4 * (text.count("\n") + 1):
            fields = zip(words[1::4], words[2::4], repeat(owner), map(float, words[0::4]), words[3::4])
            return list(map(_new_tuple, repeat(ParkedRef), fields))
    return [decode_ref(line, owner) for line in text.split("\n")]


def owner_of(user: str | None, client_id: str | None) -> str:
    """Work of a tree bound to a client waits for that client only (brain.core.routing); an
    unbound tree's work for any client of its user."""
    if client_id:
        return f"client:{client_id}"
    if user:
        return f"user:{user}"
    return "anyone"


def key_requeue_lock(list_key: str) -> str:
    """String: the token of the requeue working on ``list_key`` (expires)."""
    return f"{KEY_NS}requeue-lock:{list_key}"


def key_requeue_again(list_key: str) -> str:
    """Flag: a requeue of ``list_key`` was asked for while another held it."""
    return f"{KEY_NS}requeue-again:{list_key}"


def key_requeues() -> str:
    """Hash: list key -> client id, for every requeue begun and not finished (a crash leaves
    its entry; the reconciler's ``finish_requeues`` runs it again)."""
    return f"{KEY_NS}requeues"


Place = Callable[[list[ParkedRef]], None]


class ParkedWork:
    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        # The scripts live in brain/hot/lua/, one file each, named for what they do.
        self._park = r.register_script(lua("brain.hot", "park_ref"))
        self._acquire = r.register_script(lua("brain.hot", "requeue_acquire"))
        self._step = r.register_script(lua("brain.hot", "requeue_step"))
        self._release = r.register_script(lua("brain.hot", "requeue_release"))
        # Letting go of the list without dropping anything is releasing a lock we may have lost.
        self._abandon = r.register_script(lua("brain.hot", "release_lock"))
        self._read = r.register_script(lua("brain.hot", "read_chunk"))

    def park(self, ref: ParkedRef) -> None:
        key = key_parked(ref.owner)
        self._park(keys=[key, key_requeue_lock(key)], args=[ref.encode(), repr(ref.parked_at)])

    def requeue(self, client_id: str, owners: Iterable[str], place: Place) -> int:
        """Hand every ref listed for ``owners`` (in that order), plus leftovers of the older
        per-client ``requeueing`` list, to ``place`` in chunks, oldest parked first within a
        chunk; drop each chunk once ``place`` returned. Lists another requeue is working on
        are left to it (it makes one more pass). Returns how many refs were handed out."""
        keys = [key_requeueing(client_id), *(key_parked(o) for o in owners)]
        owner_names = ["", *owners]
        return sum(self._requeue_list(key, owner, client_id, place) for key, owner in zip(keys, owner_names))

    def _requeue_list(self, key: str, owner: str, client_id: str, place: Place) -> int:
        lock, again = key_requeue_lock(key), key_requeue_again(key)
        token = uuid.uuid4().hex
        budget = int(
            self._acquire(keys=[lock, again, key_requeues(), key], args=[token, LOCK_MS, key, client_id])
        )
        handed = 0
        drop = 0
        try:
            while budget >= 0:
                while budget > 0:
                    blob = self._step(keys=[lock, key], args=[token, LOCK_MS, drop, min(CHUNK, budget)])
                    if blob is None:
                        return handed  # lost the lock (stalled): its next holder goes on from here
                    drop = 0
                    refs = _decode_sorted(blob, owner)
                    if not refs:
                        break
                    place(refs)
                    handed += len(refs)
                    budget -= len(refs)
                    drop = len(refs)
                    del refs  # not kept alive through the next chunk's decode
                budget = int(
                    self._release(keys=[lock, again, key_requeues(), key], args=[token, LOCK_MS, key, drop])
                )
                drop = 0
        except BaseException:
            # Nothing of the chunk being placed is dropped; the reconciler finishes the list.
            self._abandon(keys=[lock], args=[token])
            raise
        return handed

    def unfinished_requeues(self) -> dict[str, str]:
        """List key -> client id of requeues no one is working on (their holder crashed or
        failed midway), plus older per-client ``requeueing`` lists left by a crash."""
        pending = {as_text(k): as_text(v) for k, v in self.r.hgetall(key_requeues()).items()}
        prefix = f"{KEY_NS}requeueing:"
        for k in self.r.scan_iter(match=f"{prefix}*", count=500):
            pending.setdefault(as_text(k), as_text(k)[len(prefix) :])
        if not pending:
            return {}
        pipe = self.r.pipeline(transaction=False)
        for key in pending:
            pipe.exists(key_requeue_lock(key))
        return {key: cid for (key, cid), held in zip(pending.items(), pipe.execute()) if not held}

    def requeueing_clients(self) -> list[str]:
        """Clients whose requeue a crash interrupted."""
        return sorted(set(self.unfinished_requeues().values()))

    def refs_in(self, key: str) -> Iterator[ParkedRef]:
        """Every ref of one list, read ``CHUNK`` at a time (never the whole list in one reply).
        A requeue dropping refs meanwhile may make this skip some: callers must treat a
        missed ref as harmless (re-listing one makes a duplicate, which is)."""
        start = 0
        while blob := self._read(keys=[key], args=[start, start + CHUNK - 1]):
            refs = decode_chunk(blob)
            yield from refs
            start += len(refs)

    def listed_keys(self) -> list[str]:
        """Every parked list, and older per-client ``requeueing`` lists."""
        keys: list[str] = []
        for pattern in (key_parked("*"), key_requeueing("*")):
            keys.extend(as_text(k) for k in self.r.scan_iter(match=pattern, count=500))
        return keys

    def waiting(self) -> dict[str, int]:
        """Owner -> number of refs parked for it (for `vancetope clients`)."""
        prefix = key_parked("")
        counts: dict[str, int] = {}
        for key in self.r.scan_iter(match=f"{prefix}*", count=500):
            counts[key.decode()[len(prefix) :]] = int(self.r.llen(key))
        return counts


def _parked_at(ref: ParkedRef) -> float:
    return ref.parked_at


def _decode_sorted(blob: bytes | str, owner: str) -> list[ParkedRef]:
    """One chunk's refs, oldest parked first. The garbage collector is held off meanwhile
    (``brain.hot.collector``): 1,000 new refs would otherwise be scanned (and promoted) by the
    collections their own allocation sets off - on a 100,000-ref requeue that was up to half
    of its time. For well under a millisecond."""
    with collector_held():
        refs = decode_chunk(blob, owner)
        refs.sort(key=_parked_at)
        return refs
