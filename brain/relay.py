"""Messages from client agents (layer: brain, Redis glue).

Each enrolled client writes to its own ``c:<id>:outbox`` (it can reach no other
key); the relay pops every outbox, checks size and shape, and hands announcements,
disconnects and results to the brain. The outbox a message came through — not
what the message claims — says which client sent it.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from pydantic import ValidationError

from brain.clientwork import ClientWork
from brain.events import HEARTBEAT_S
from brain.hotstate import as_bytes, as_text
from brain.scheduler import Scheduler
from workers.contracts import (
    CLIENT_ACK,
    CLIENT_MESSAGE,
    CLIENT_OUTBOX,
    MAX_ANNOUNCEMENT_BYTES,
    AnnouncementAck,
    ClientConnected,
    ClientDisconnected,
    ClientToolResult,
    client_key,
)

log = logging.getLogger("vancetope.brain")

POP_TIMEOUT_S = 1
_ENVELOPE_SLACK = 64 * 1024


class Relay:
    def __init__(self, scheduler: Scheduler, clients: ClientWork) -> None:
        self.s = scheduler
        self.clients = clients
        self.max_bytes = max(MAX_ANNOUNCEMENT_BYTES, scheduler.settings.max_result_bytes + _ENVELOPE_SLACK)

    def handle(self, owner: str, raw: bytes) -> None:
        """Act on one message popped from ``owner``'s outbox. Bad messages are logged and dropped:
        a lost result is re-sent by the reconciler, a refused announcement is acked as refused."""
        if len(raw) > self.max_bytes:
            log.warning(
                "dropped a %d-byte message from client %r: over the %d-byte limit",
                len(raw),
                owner,
                self.max_bytes,
            )
            # Not parsed, not even to ack it: parsing is what an oversized message would cost us.
            return
        try:
            msg = CLIENT_MESSAGE.validate_json(raw)
        except ValidationError as exc:
            reason = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
            log.warning("dropped a malformed message from client %r: %s", owner, reason)
            self._refuse_if_announcement(owner, raw, f"malformed announcement: {reason}")
            return
        if isinstance(msg, ClientConnected):
            self.clients.on_connected(msg, owner)
        elif isinstance(msg, ClientDisconnected):
            if msg.client_id == owner:
                self.clients.on_disconnected(owner, msg.session_id, f"graceful disconnect ({msg.reason})")
        elif isinstance(msg, ClientToolResult):
            self.s.on_result(msg.result, from_client=owner)

    def _refuse_if_announcement(self, owner: str, raw: bytes, reason: str) -> None:
        try:
            data = json.loads(raw)
        except ValueError:
            return
        if (
            isinstance(data, dict)
            and data.get("type") == "client_connected"
            and isinstance(data.get("session_id"), str)
        ):
            ack = AnnouncementAck(session_id=data["session_id"][:128], accepted=False, reason=reason)
            self.s.hot.r.set(client_key(owner, CLIENT_ACK), ack.model_dump_json())

    def poll_once(self, enrolled: list[str]) -> bool:
        if not enrolled:
            return False
        keys = {client_key(cid, CLIENT_OUTBOX): cid for cid in enrolled}
        item = self.s.hot.r.brpop(list(keys), timeout=POP_TIMEOUT_S)
        if item is None:
            return False
        key, raw = item
        self.handle(keys[as_text(key)], as_bytes(raw))
        return True

    def run(self, stop: threading.Event) -> threading.Thread:
        def loop() -> None:
            enrolled: list[str] = []
            refreshed = beat_checked = 0.0
            while not stop.is_set():
                try:
                    now = time.monotonic()
                    if now - refreshed > 2.0:
                        enrolled, refreshed = sorted(self.s.presence.enrolled()), now
                    if now - beat_checked > HEARTBEAT_S / 2:
                        self.clients.sweep_heartbeats()
                        beat_checked = now
                    if not self.poll_once(enrolled) and not enrolled:
                        stop.wait(POP_TIMEOUT_S)
                except Exception:
                    log.exception("client relay step failed")
                    stop.wait(0.5)

        thread = threading.Thread(target=loop, name="vancetope-relay", daemon=True)
        thread.start()
        return thread
