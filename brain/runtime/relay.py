"""Messages from client agents (layer: brain/runtime; Redis glue).

Each enrolled client writes to its own ``c:<id>:outbox`` (it can reach no other
key); the relay pops every outbox, checks size, depth and shape, and hands
announcements, disconnects, results, starts, progress, approval waits, and an MCP server's log
messages and sampling/elicitation requests (issue 24) to the brain. The outbox a message came
through — not what the message claims — says which client sent it.

Fair and bounded: each poll first asks which outboxes hold anything (one script,
``_HOLDING``: an idle outbox costs no command of its own), then runs one MULTI round over
those that trims each to ``outbox_max_messages`` (the excess is dropped and logged; a result
lost this way is re-sent by the reconciler, which finds its task queued and held nowhere) and
pops at most ``POP_BATCH`` messages per client (one from a suspended client), starting at a
client that rotates every poll, so a chatty client delays another by at most one round.
With every outbox empty it blocks in BRPOP instead of spinning.

Isolated: each client's replies in that round are checked on their own, so an outbox
turned into a string refuses only its owner's commands and every other client's popped
messages are handled. A client whose outbox or message is malformed is suspended
(``ClientWork.suspend``: marked misbehaving, logged once per cause); the others go on.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from itertools import zip_longest
from typing import TypeVar

import redis
from pydantic import ValidationError
from redis.commands.core import Script

from brain.core.client_health import Cause, reply_cause
from brain.core.resource_updates import DropCounts, announced_servers
from brain.hot.state import as_bytes, as_text
from brain.runtime.clientwork import ClientWork
from brain.runtime.events import HEARTBEAT_S
from brain.runtime.intake import Intake
from workers.contracts import (
    CLIENT_ACK,
    CLIENT_MESSAGE,
    CLIENT_OUTBOX,
    MAX_ANNOUNCEMENT_BYTES,
    MAX_JSON_DEPTH,
    AnnouncementAck,
    ClientConnected,
    ClientDisconnected,
    ClientResourceUpdated,
    ClientToolAsk,
    ClientToolAwaiting,
    ClientToolLog,
    ClientToolProgress,
    ClientToolResult,
    ClientToolStarted,
    channel_resource_updates,
    client_key,
)
from workers.transport import depth_over

log = logging.getLogger("vancetope.brain")

POP_TIMEOUT_S = 1
# Messages popped per client per poll: bounds what the brain holds and how long one
# client's burst can delay another's message.
POP_BATCH = 32
# ... and from a suspended client (brain.hot.misbehaving): its messages still count (a result
# of a call it ran is not thrown away), but it gets no more than this of any round.
SUSPENDED_POP_BATCH = 1
_ENVELOPE_SLACK = 64 * 1024
_T = TypeVar("_T")
# How long the relay pauses when a client changes its outbox's type between the round and
# BRPOP (it then refuses BRPOP for everyone): short, the next round skips that outbox.
RACE_PAUSE_S = 0.1
# Which of KEYS exist (Redis deletes a list once it is empty), as 1-based positions. With 1,000
# clients idle, an LLEN, LTRIM and RPOP of every outbox each poll were 3,000 commands a second
# to send and parse; this is one. EXISTS is O(1) and reads no value, so the script holds Redis
# for well under a millisecond per thousand outboxes, and any type of key counts: an outbox a
# client turned into a string is in the round, which finds it (``_pop_round``).
_HOLDING = """
local found = {}
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then found[#found + 1] = i end
end
return found
"""


def rotated(items: Sequence[str], turn: int) -> list[str]:
    """``items`` starting at position ``turn`` (mod its length): who goes first each poll."""
    if not items:
        return []
    k = turn % len(items)
    return [*items[k:], *items[:k]]


def interleaved(batches: Sequence[tuple[str, Sequence[bytes]]]) -> list[tuple[str, bytes]]:
    """One message from each client in turn, each client's own in the order they were sent."""
    rounds = zip_longest(*[[(owner, raw) for raw in msgs] for owner, msgs in batches])
    return [item for row in rounds for item in row if item is not None]


class Relay:
    def __init__(self, intake: Intake, clients: ClientWork) -> None:
        self.intake = intake
        self.s = scheduler = intake.scheduler
        self.clients = clients
        self.max_bytes = max(MAX_ANNOUNCEMENT_BYTES, scheduler.settings.max_result_bytes + _ENVELOPE_SLACK)
        self.max_messages = scheduler.settings.outbox_max_messages
        self.turn = 0
        # The last BRPOP's outbox was emptied by its wake: the next poll waits again at once.
        self._drained = False
        # Clients suspended, as last read (every enrollment refresh) or suspended here since.
        self.suspended: set[str] = set()
        self._stop = threading.Event()  # run()'s, so a pause in poll_once ends with it
        # The servers each client's session announced a resource reader for, read once a round
        # (a hostile client may send a thousand updates a round) and again after it announces.
        self._servers: dict[str, frozenset[str]] = {}
        self._update_drops = DropCounts()
        self._holding: Script | None = None  # _HOLDING, registered on first use

    def handle(self, owner: str, raw: bytes) -> None:
        """Act on one message popped from ``owner``'s outbox. Bad messages are logged and dropped:
        a lost result is re-sent by the reconciler, a refused announcement is acked as refused."""
        if len(raw) > self.max_bytes:
            # Not parsed, not even to ack it: parsing is what an oversized message would cost us.
            detail = f"sent a {len(raw)}-byte message, over the {self.max_bytes}-byte limit (dropped)"
            self._suspend(owner, Cause(kind="oversized message", detail=detail))
            return
        depth = depth_over(raw, MAX_JSON_DEPTH)
        if depth is not None:
            # Not parsed either: a recursive parser (json.loads below) would run out of stack.
            detail = f"sent a message nested {depth} deep, over the limit of {MAX_JSON_DEPTH} (dropped)"
            self._suspend(owner, Cause(kind="message nested too deep", detail=detail))
            return
        try:
            msg = CLIENT_MESSAGE.validate_json(raw)
        except ValidationError as exc:
            reason = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
            detail = f"sent a malformed message (dropped): {reason}"[:1000]
            self._suspend(owner, Cause(kind="malformed message", detail=detail))
            self._refuse_if_announcement(owner, raw, f"malformed announcement: {reason}")
            return
        if isinstance(msg, (ClientConnected, ClientDisconnected)):
            self._servers.pop(owner, None)
        if isinstance(msg, ClientConnected):
            if self.clients.on_connected(msg, owner).accepted:
                self.suspended.discard(owner)
        elif isinstance(msg, ClientDisconnected):
            if msg.client_id == owner:
                self.clients.on_disconnected(owner, msg.session_id, f"graceful disconnect ({msg.reason})")
        elif isinstance(msg, ClientToolResult):
            self.intake.on_result(msg.result, from_client=owner)
        elif isinstance(msg, ClientToolProgress):
            self._progress(owner, msg)
        elif isinstance(msg, ClientToolStarted):
            self._started(owner, msg)
        elif isinstance(msg, ClientToolAwaiting):
            self._awaiting(owner, msg)
        elif isinstance(msg, ClientToolLog):
            self.intake.on_log(msg.log, from_client=owner)
        elif isinstance(msg, ClientToolAsk):
            self.intake.on_ask(msg.ask, from_client=owner)
        elif isinstance(msg, ClientResourceUpdated):
            self._resource_updated(owner, msg)

    def _resource_updated(self, owner: str, msg: ClientResourceUpdated) -> None:
        """Published for the gateway as ``owner``'s, and only about a server whose resources
        ``owner``'s session offers: the gateway then tells only sessions of ``owner``'s user
        subscribed to that URI of ``owner``'s server. Anything else is dropped here, so a hostile
        workstation costs the gateway nothing for it (logged once a minute per client)."""
        if msg.client_id != owner:
            self._drop_update(owner, f"it claims to speak for client {msg.client_id!r}")
            return
        if owner not in self._servers:
            self._servers[owner] = announced_servers(self.clients.presence.session(owner))
        if msg.updated.server not in self._servers[owner]:
            self._drop_update(owner, f"its session offers no resources of MCP server {msg.updated.server!r}")
            return
        stamped = msg.updated.model_copy(update={"client_id": owner})
        self.s.hot.r.publish(channel_resource_updates(), stamped.model_dump_json())

    def _drop_update(self, owner: str, why: str) -> None:
        count = self._update_drops.dropped(owner, time.monotonic())
        if count is not None:
            log.warning(
                "client %r: %d resources/updated dropped, the last because %s (at most one such line a minute)",
                owner,
                count,
                why,
            )

    def _started(self, owner: str, msg: ClientToolStarted) -> None:
        if self.intake.on_started(msg.started, from_client=owner) and self.s.events is not None:
            self.s.events.task_started(msg.started)

    def _progress(self, owner: str, msg: ClientToolProgress) -> None:
        if self.intake.on_progress(msg.progress, from_client=owner) and self.s.events is not None:
            self.s.events.task_progress(msg.progress)

    def _awaiting(self, owner: str, msg: ClientToolAwaiting) -> None:
        if self.intake.on_awaiting(msg.awaiting, from_client=owner) and self.s.events is not None:
            self.s.events.task_awaiting(msg.awaiting)

    def _refuse_if_announcement(self, owner: str, raw: bytes, reason: str) -> None:
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            return
        if (
            isinstance(data, dict)
            and data.get("type") == "client_connected"
            and isinstance(data.get("session_id"), str)
        ):
            ack = AnnouncementAck(session_id=data["session_id"][:128], accepted=False, reason=reason)
            self.s.hot.r.set(client_key(owner, CLIENT_ACK), ack.model_dump_json())

    def poll_once(self, enrolled: list[str]) -> bool:
        """One fair round over the outboxes that hold anything (two round trips, one when none
        does); if all were empty, wait in BRPOP for the next message. True if any message was
        handled."""
        if not enrolled:
            return False
        order = rotated(enrolled, self.turn)
        self.turn += 1
        self._servers.clear()
        if self._drained:
            # The last wake took all its outbox held: no backlog to batch, so no round (a script
            # and a transaction that would find the outboxes empty) before waiting again. With
            # two brains racing for each result, that round was paid per result by each.
            self._drained = False
            return self._wait_for_one(order, set())
        batches, faults = self._pop_round(self._holding_messages(order))
        batches = self._within_budget(batches)
        for owner, raw in interleaved(batches):
            self._handle_one(owner, raw)
        for owner, cause in faults.items():
            self._suspend_one(owner, cause)
        if batches:
            return True
        return self._wait_for_one(order, set(faults))

    def _wait_for_one(self, order: list[str], faulty: set[str]) -> bool:
        """BRPOP on the outboxes of ``order`` (in that order: the first that holds one is
        served), then the rest of the one it woke on. True if a message was handled."""
        # An outbox that is not a list would make BRPOP fail for everyone: it waits on the others.
        keys = {client_key(cid, CLIENT_OUTBOX): cid for cid in order if cid not in faulty}
        if not keys:
            self._stop.wait(POP_TIMEOUT_S)  # as BRPOP would have, rather than spin
            return False
        try:
            item = self.s.hot.r.brpop(list(keys), timeout=POP_TIMEOUT_S)
        except redis.ResponseError:
            # A client changed its outbox's type since the round: the next round names it.
            self._stop.wait(RACE_PAUSE_S)
            return False
        if item is None:
            return False
        key, message = item
        owner = keys[as_text(key)]
        rest, self._drained = self._rest_of(owner)
        batches = self._within_budget([(owner, [as_bytes(message), *rest])])
        for owner, raw in interleaved(batches):
            self._handle_one(owner, raw)
        return True

    def _rest_of(self, owner: str) -> tuple[list[bytes], bool]:
        """After BRPOP woke on ``owner``'s outbox: what else it holds, up to its share of a round,
        oldest first, in one round trip; and whether that emptied it. Two brains race for every
        message; taking one per BRPOP made each of them pay a round and a BRPOP per result
        (bench/README.md, "The CPU rows"). Its own trouble (the outbox changed type) is left to
        the next round."""
        more = (SUSPENDED_POP_BATCH if owner in self.suspended else POP_BATCH) - 1
        if more <= 0:
            return [], False
        try:
            popped = self.s.hot.r.rpop(client_key(owner, CLIENT_OUTBOX), more)
        except redis.ResponseError:
            return [], False
        taken = [as_bytes(m) for m in popped] if isinstance(popped, list) else []
        return taken, len(taken) < more

    def _within_budget(self, batches: list[tuple[str, list[bytes]]]) -> list[tuple[str, list[bytes]]]:
        """Each client's batch cut to ``max_bytes`` (at least one message), the rest put back at
        the tail of its outbox, oldest last popped first, so it comes out first next round.

        Parsing is what a round costs: 32 messages of ~1 MB each took a round 13 s (the attacker
        trial), holding every other client's results that long; now one client's round is at
        most one largest message's worth."""
        kept: list[tuple[str, list[bytes]]] = []
        back: dict[str, list[bytes]] = {}
        for owner, msgs in batches:
            total, n = 0, 0
            while n < len(msgs) and (n == 0 or total + len(msgs[n]) <= self.max_bytes):
                total += len(msgs[n])
                n += 1
            kept.append((owner, msgs[:n]))
            if n < len(msgs):
                back[owner] = msgs[n:]
        if back:
            pipe = self.s.hot.r.pipeline(transaction=False)
            for owner, rest in back.items():
                pipe.rpush(client_key(owner, CLIENT_OUTBOX), *reversed(rest))
            for owner, reply in zip(back, pipe.execute(raise_on_error=False), strict=True):
                if isinstance(reply, Exception):  # its outbox changed type meanwhile: its own loss
                    log.warning(
                        "could not put back %d message(s) of client %r: %s", len(back[owner]), owner, reply
                    )
        return kept

    def _suspend(self, owner: str, cause: Cause) -> None:
        self.suspended.add(owner)
        self.clients.suspend(owner, cause)

    def _suspend_one(self, owner: str, cause: Cause) -> None:
        try:
            self._suspend(owner, cause)
        except Exception:
            log.exception("could not suspend client %r (%s); going on with the others", owner, cause.detail)

    def _handle_one(self, owner: str, raw: bytes) -> None:
        """``handle``, and if it fails (the store or Redis refused), log it and go on: the rest
        of the batch is already popped, and one message must not take the others with it.
        A result lost here is re-sent by the reconciler (its task stays queued)."""
        try:
            self.handle(owner, raw)
        except Exception:
            log.exception(
                "could not handle a %d-byte message from client %r; going on with the next", len(raw), owner
            )

    def _holding_messages(self, order: list[str]) -> list[str]:
        """The clients of ``order`` whose outbox key exists, in that order."""
        if self._holding is None:
            self._holding = self.s.hot.r.register_script(_HOLDING)
        found = self._holding(keys=[client_key(cid, CLIENT_OUTBOX) for cid in order])
        return [order[i - 1] for i in found]

    def _pop_round(self, order: list[str]) -> tuple[list[tuple[str, list[bytes]]], dict[str, Cause]]:
        """Per client: trim its outbox to the cap, keeping the oldest messages (the agent
        LPUSHes, so they are at the tail), and pop up to ``POP_BATCH`` of them, oldest first.

        Each reply is checked on its own (``raise_on_error=False``): a client whose outbox is
        not a list gets a refusal in its own replies and a cause (it popped nothing), and what
        was popped from every other outbox in the same transaction is handled, never lost."""
        if not order:
            return [], {}
        pipe = self.s.hot.r.pipeline(transaction=True)
        for cid in order:
            key = client_key(cid, CLIENT_OUTBOX)
            pipe.llen(key)
            pipe.ltrim(key, -self.max_messages, -1)
            pipe.rpop(key, SUSPENDED_POP_BATCH if cid in self.suspended else POP_BATCH)
        replies = pipe.execute(raise_on_error=False)
        batches: list[tuple[str, list[bytes]]] = []
        faults: dict[str, Cause] = {}
        for i, cid in enumerate(order):
            row = replies[3 * i : 3 * i + 3]
            cause = reply_cause("outbox", client_key(cid, CLIENT_OUTBOX), row)
            if cause is not None:
                faults[cid] = cause
                continue
            length, _, popped = row
            if length > self.max_messages:
                log.warning(
                    "dropped %d message(s) from client %r: its outbox %r held %d, over the cap of %d "
                    "(results among them are re-sent by the reconciler)",
                    length - self.max_messages,
                    cid,
                    client_key(cid, CLIENT_OUTBOX),
                    length,
                    self.max_messages,
                )
            if isinstance(popped, list) and popped:
                batches.append((cid, [as_bytes(m) for m in popped]))
        return batches, faults

    def run(self, stop: threading.Event) -> threading.Thread:
        self._stop = stop
        failing: set[str] = set()

        def step(what: str, action: Callable[..., _T], *args: object) -> _T | None:
            """``action(*args)``, or None when it failed: logged once until it works again, and the
            loop's other steps run regardless (a failed sweep never skips the outboxes)."""
            try:
                value = action(*args)
            except Exception:
                if what not in failing:
                    log.exception("client relay: %s failed; going on with the other steps", what)
                failing.add(what)
                return None
            if what in failing:
                log.info("client relay: %s works again", what)
                failing.discard(what)
            return value

        def loop() -> None:
            enrolled: list[str] = []
            refreshed = beat_checked = 0.0
            while not stop.is_set():
                now = time.monotonic()
                if now - refreshed > 2.0:
                    fresh = step("reading the enrollments", lambda: sorted(self.s.presence.enrolled()))
                    if fresh is not None:
                        enrolled, refreshed = fresh, now
                    marks = step("reading the suspended clients", self.clients.misbehaving.all)
                    if marks is not None:
                        self.suspended = set(marks)
                if now - beat_checked > HEARTBEAT_S / 2:
                    step("the heartbeat sweep", self.clients.sweep_heartbeats)
                    beat_checked = now
                polled = step("polling the outboxes", self.poll_once, enrolled)
                if polled is None:
                    stop.wait(0.5)  # Redis itself refused (down?): do not spin
                elif not polled and not enrolled:
                    stop.wait(POP_TIMEOUT_S)

        thread = threading.Thread(target=loop, name="vancetope-relay", daemon=True)
        thread.start()
        return thread
