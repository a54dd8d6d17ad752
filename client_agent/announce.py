"""Telling the brain this agent is here (layer: client_agent).

One job: the presence side of the protocol. ``encode_announcement`` (pure) builds the
``ClientConnected`` JSON within the brain's size cap (leaving out, in order, what the brain
and a host can best do without); the ``Announcer`` thread pushes it
on connect and whenever the tools change, waits (bounded) for the brain's
``AnnouncementAck`` and retries with exponential backoff until one is accepted (a broker
that refuses the agent's credentials is not retried: ``on_refused`` stops the agent); the
``Heartbeat`` thread keeps ``heartbeat`` alive with a TTL, so an agent that dies
without saying goodbye disappears on its own.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import redis

from client_agent.channel import AgentChannel
from client_agent.errors import AnnouncementTooLarge
from client_agent.outage import BrokerOutage, is_outage
from workers.contracts import (
    MAX_ANNOUNCED_TOOLS,
    MAX_ANNOUNCEMENT_BYTES,
    AnnouncementAck,
    ClientConnected,
    ClientType,
    ToolDescriptor,
)

log = logging.getLogger("vancetope.agent.announce")

BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 30.0
_ACK_POLL_S = 0.1
# Heartbeats whose round trips make the one reported (their median: one slow beat is no trend).
ROUND_TRIPS_KEPT = 5


def retry_delay(attempt: int, base: float = BACKOFF_BASE_S, cap: float = BACKOFF_CAP_S) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): base, 2*base, 4*base, ... capped."""
    return float(min(cap, base * 2.0 ** min(attempt, 32)))


def encode_announcement(
    client_id: str,
    session_id: str,
    client_type: ClientType,
    tools: Sequence[ToolDescriptor],
    sent_at: float,
    max_bytes: int = MAX_ANNOUNCEMENT_BYTES,
) -> tuple[str, str]:
    """The ``ClientConnected`` JSON, and what had to be left out to fit ``max_bytes`` ("" when
    nothing was: else "icons and _meta, tool descriptions", …).

    Left out in ``_TRIMS`` order, each step kept for the next, until it fits: first what only a
    host's display or its validation of results uses, then descriptions, and last the hints a
    host acts on (annotations such as ``destructiveHint``); the brain can route without any of
    them, never without names and input schemas. Still too big: AnnouncementTooLarge.
    Fields left unset (None) are not sent, so an older brain reads an announcement without
    metadata as before.
    """
    if len(tools) > MAX_ANNOUNCED_TOOLS:
        raise AnnouncementTooLarge(
            f"{len(tools)} tools to announce, over the brain's limit of {MAX_ANNOUNCED_TOOLS}; "
            "narrow allowed_tools in the agent config or remove servers from mcp.json"
        )
    candidate, left_out = list(tools), []
    for label, trim in ((None, None), *_TRIMS):
        if trim is not None:
            trimmed = [trim(t) for t in candidate]
            if trimmed != candidate:
                left_out.append(label)
            candidate = trimmed
        message = ClientConnected(
            client_id=client_id, session_id=session_id, client_type=client_type,
            available_tools=candidate, sent_at=sent_at,
        )  # fmt: skip
        body = message.model_dump_json(exclude_none=True)
        if len(body.encode("utf-8")) <= max_bytes:
            return body, ", ".join(str(what) for what in left_out)
    raise AnnouncementTooLarge(_too_large(tools, len(body.encode("utf-8")), max_bytes))


# What an announcement too big for the brain's cap leaves out, step by step.
SHORT_SURFACE = 20
_TRIMS: tuple[tuple[str, Callable[[ToolDescriptor], ToolDescriptor]], ...] = (
    ("icons and _meta", lambda t: t.model_copy(update={"icons": None, "meta": None})),
    ("output schemas", lambda t: t.model_copy(update={"output_schema": None})),
    (f"resources and prompts beyond the first {SHORT_SURFACE} of a server", lambda t: _shorter(t)),
    ("tool descriptions", lambda t: t.model_copy(update={"description": ""})),
    (
        "descriptions inside input schemas",
        lambda t: t.model_copy(update={"input_schema": _strip(t.input_schema)}),
    ),
    (
        "titles, annotations and execution hints",
        lambda t: t.model_copy(update={"title": None, "annotations": None, "execution": None}),
    ),
)


def _shorter(tool: ToolDescriptor) -> ToolDescriptor:
    """A surface tool listing at most SHORT_SURFACE of each kind: a read of one left out is
    still routed to its server (``McpSurface.truncated``)."""
    surface = tool.surface
    if surface is None:
        return tool
    kept = {
        "resources": surface.resources[:SHORT_SURFACE],
        "resource_templates": surface.resource_templates[:SHORT_SURFACE],
        "prompts": surface.prompts[:SHORT_SURFACE],
    }
    cut = any(len(getattr(surface, k)) > len(v) for k, v in kept.items())
    if not cut:
        return tool
    return tool.model_copy(update={"surface": surface.model_copy(update={**kept, "truncated": True})})


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if not (k == "description" and isinstance(v, str))}
    if isinstance(node, list):
        return [_strip(item) for item in node]
    return node


def _too_large(tools: Sequence[ToolDescriptor], size: int, cap: int) -> str:
    biggest = sorted(tools, key=lambda t: len(t.model_dump_json()), reverse=True)[:3]
    named = ", ".join(f"{t.name} ({len(t.model_dump_json())} bytes)" for t in biggest)
    return (
        f"the announcement of {len(tools)} tools is {size} bytes even with only names and input schemas, over the "
        f"brain's cap of {cap} bytes (largest: {named}); narrow allowed_tools or mcp.json"
    )


class Announcer(threading.Thread):
    """Pushes ``ClientConnected`` when asked, until the brain accepts it (backoff capped at 30 s)."""

    def __init__(
        self,
        channel: AgentChannel,
        session_id: str,
        build: Callable[[], str],
        stop: threading.Event,
        ack_timeout_s: float,
        backoff: Callable[[int], float] = retry_delay,
        on_refused: Callable[[redis.AuthenticationError], None] | None = None,
        outage: BrokerOutage | None = None,
    ) -> None:
        super().__init__(name="vancetope-announcer", daemon=True)
        # Says once what to do while the broker cannot be reached (shared with the heartbeat).
        self.outage = outage
        # Called when the broker refuses the agent's credentials: retrying cannot help.
        self.on_refused = on_refused
        self.channel = channel
        self.session_id = session_id
        self.build = build
        self.stop = stop
        self.ack_timeout_s = ack_timeout_s
        self.backoff = backoff
        self._wanted = threading.Event()
        self.accepted = threading.Event()
        # An announcement is on its way and not yet answered (its ack key was cleared for it).
        self.pending = threading.Event()

    def request(self, same_session: bool = False) -> None:
        """Announce (again) as soon as possible: the agent just started, the brain dropped or
        suspended it, or (``same_session``) its tools changed. The brain keeps an accepted
        session, with its old tools, until it answers the new announcement, so then the agent
        stays accepted (connected, for `vancetope-agent status`) meanwhile."""
        if not same_session:
            self.accepted.clear()
        self.pending.set()
        self._wanted.set()

    def run(self) -> None:
        attempt = 0
        while not self.stop.is_set():
            if not self._wanted.wait(0.2):
                continue
            self._wanted.clear()
            if self._announce_once():
                attempt = 0
                continue
            delay = self.backoff(attempt)
            attempt += 1
            log.info("announcing again in %gs", delay)
            self._pause(delay)
            self._wanted.set()  # the retry, or the newer tool set that cut the pause short

    def _pause(self, delay: float) -> None:
        """Wait up to ``delay``; a stop or a new request (tools changed) ends it early."""
        deadline = time.monotonic() + delay
        while not self.stop.is_set() and not self._wanted.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.stop.wait(min(0.2, left))

    def _announce_once(self) -> bool:
        """True when done (accepted, or nothing to retry); False to retry after a backoff."""
        try:
            body = self.build()
        except AnnouncementTooLarge as exc:
            log.error("cannot announce: %s", exc)
            return True  # nothing to retry until the tools change
        try:
            self.channel.announce(body)
            ack = self._wait_for_ack(self.session_id)
        except redis.AuthenticationError as exc:
            if self.on_refused is None:
                log.error("the broker refused this agent's credentials: %s", exc)
                return False
            self.on_refused(exc)
            return self.stop.is_set()  # stopping: nothing to retry; else tried again
        except redis.RedisError as exc:
            if self.outage is not None and is_outage(exc):
                self.outage.lost(exc)
                log.debug("announcing failed: cannot reach the broker (%s)", exc)
            else:
                log.warning("announcing failed: cannot reach the broker (%s)", exc)
            return False
        except Exception:
            # A dead announcer thread would leave the brain without this agent's tools for good.
            log.exception("announcing failed unexpectedly")
            return False
        return self._judge(ack)

    def _wait_for_ack(self, session_id: str) -> AnnouncementAck | None:
        deadline = time.monotonic() + self.ack_timeout_s
        while time.monotonic() < deadline and not self.stop.is_set():
            ack = self.channel.read_ack()
            if ack is not None and ack.session_id == session_id:
                return ack
            self.stop.wait(_ACK_POLL_S)
        return None

    def _judge(self, ack: AnnouncementAck | None) -> bool:
        if ack is None:
            if not self.stop.is_set():
                log.warning("the brain did not acknowledge the announcement within %gs", self.ack_timeout_s)
            return self.stop.is_set()
        if not ack.accepted:
            log.warning("the brain rejected the announcement: %s", ack.reason or "(no reason given)")
            self.accepted.clear()
            return False
        log.info("the brain accepted the announcement (%d tools registered)", ack.tools)
        self.accepted.set()
        self.pending.clear()
        return True


class Heartbeat(threading.Thread):
    """``SET heartbeat <session_id> PX ttl`` every interval; the brain reads a missing key as gone.

    The brain deletes the ack when it drops this agent (say, a beat arrived too late), or
    replaces it with a refusal saying why when it suspends it: seeing either after it was
    accepted, the heartbeat asks the announcer to announce again, or the agent would stay
    alive but never be sent work.
    """

    def __init__(
        self,
        channel: AgentChannel,
        session_id: str,
        interval_s: float,
        ttl_s: float,
        stop: threading.Event,
        announcer: Announcer | None = None,
        on_refused: Callable[[redis.AuthenticationError], None] | None = None,
        on_beat: Callable[[], None] | None = None,
        outage: BrokerOutage | None = None,
    ) -> None:
        super().__init__(name="vancetope-heartbeat", daemon=True)
        self.outage = outage
        self.on_refused = on_refused
        # Called after each heartbeat the broker took (the agent records it for `status`).
        self.on_beat = on_beat
        self.channel = channel
        self.session_id = session_id
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        self.stop = stop
        self.announcer = announcer
        # The last heartbeats' round trips (s): their median goes with the next heartbeat.
        self.round_trips: deque[float] = deque(maxlen=ROUND_TRIPS_KEPT)

    def round_trip_ms(self) -> float | None:
        """The median of the last heartbeats' round trips, in ms (None before the first)."""
        return statistics.median(self.round_trips) * 1000 if self.round_trips else None

    def _check_remembered(self, ack: AnnouncementAck | None) -> None:
        # While an announcement waits for its answer its ack key is empty: nothing was dropped.
        if self.announcer is None or not self.announcer.accepted.is_set() or self.announcer.pending.is_set():
            return
        if ack is None:
            log.warning("the brain dropped this agent (its ack is gone); announcing again")
            self.announcer.request()
        elif not ack.accepted:  # the brain suspended it, and says why (brain.hot.misbehaving)
            log.warning("the brain suspended this agent: %s; announcing again", ack.reason or "(no reason)")
            self.announcer.request()

    def run(self) -> None:
        failing = False
        while not self.stop.is_set():
            try:
                beat = self.channel.beat(self.session_id, self.ttl_s, self.round_trip_ms())
                self.round_trips.append(beat.round_trip_s)
                self._check_remembered(beat.ack)
                if self.on_beat is not None:
                    self.on_beat()
                if self.outage is not None:
                    self.outage.restored()
                if failing:
                    log.info("heartbeat restored")
                failing = False
            except redis.AuthenticationError as exc:
                if self.on_refused is not None:
                    self.on_refused(exc)  # stops the agent, or waits a refusal out (Agent._on_refused)
                    if self.stop.is_set():
                        return
                elif not failing:
                    log.error("heartbeat refused: the broker refused this agent's credentials: %s", exc)
                failing = True
            except Exception as exc:  # noqa: BLE001 - the heartbeat thread must outlive any one failure
                if self.outage is not None and is_outage(exc):
                    self.outage.lost(exc)  # says what to do, once per outage
                elif not failing:  # once per outage, not every two seconds
                    log.warning("heartbeat failed: %s (retrying every %gs)", exc, self.interval_s)
                failing = True
            self.stop.wait(self.interval_s)
