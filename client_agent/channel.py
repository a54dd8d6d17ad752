"""The client agent's own keys on the broker (layer: client_agent).

One job: the agent's side of the client <-> brain protocol in Redis, and nothing
beyond it. Every key is ``client_keyprefix(client_id) + name`` from
``workers.contracts``; no KEYS/SCAN, no pub/sub, no unprefixed key, so a Redis ACL
``~c:<id>:*`` is all this agent needs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis
from pydantic import BaseModel, ValidationError

from client_agent.errors import BrokerUnavailable
from client_agent.outage import BrokerOutage, is_outage
from workers.contracts import (
    CLIENT_ACK,
    CLIENT_HEARTBEAT,
    CLIENT_OUTBOX,
    CLIENT_ROUND_TRIP,
    AnnouncementAck,
    client_keyprefix,
)
from workers.redis_connect import redis_client

log = logging.getLogger("vancetope.agent.channel")

# A result must survive a short network blip; past this, the task fails and the brain's
# reconciler owns it.
SEND_RETRY_DELAYS_S = (0.2, 0.5, 1.0, 2.0, 4.0, 8.0)
# A message bigger than this is written on a connection of its own whose socket timeout grows
# with its size: Redis answers an LPUSH only once the whole value has crossed the link, and
# 1 MB at 256 kbit/s takes 33 s, past the 10 s every other command may wait. The slowest link
# a workstation is expected to have (a bad hotel Wi-Fi, a phone's 3G) sets the pace.
BULK_BYTES = 64 * 1024
SLOWEST_LINK_BYTES_PER_S = 16_000  # 128 kbit/s


def bulk_timeout_s(size: int, base_s: float = 10.0) -> float:
    """The socket timeout for writing ``size`` bytes over the slowest expected link."""
    return base_s + size / SLOWEST_LINK_BYTES_PER_S


@dataclass(frozen=True)
class Beat:
    """What a heartbeat found: how long its round trip took, and the brain's ack (None: none)."""

    round_trip_s: float
    ack: AnnouncementAck | None


def parse_ack(raw: bytes | str | None) -> AnnouncementAck | None:
    if raw is None:
        return None
    try:
        return AnnouncementAck.model_validate_json(raw)
    except ValidationError as exc:
        log.error("ignoring an acknowledgement that is not an AnnouncementAck: %s", exc)
        return None


def connect_redis(broker_url: str, socket_timeout_s: float = 10.0, master: str | None = None) -> redis.Redis:
    """A redis-py client for the agent's own keys; timeouts so no call hangs on a dead network.
    ``master``: the Sentinel master's name when ``broker_url`` is a sentinel:// URL."""
    return redis_client(
        broker_url,
        master=master,
        socket_connect_timeout=5,
        socket_timeout=socket_timeout_s,
        health_check_interval=15,
    )


class AgentChannel:
    """Outbox, acknowledgement and heartbeat of one client, under its key prefix."""

    def __init__(
        self,
        client: redis.Redis,
        client_id: str,
        outage: BrokerOutage | None = None,
        broker_url: str | None = None,
        master: str | None = None,
    ) -> None:
        self.client = client
        # For big messages, a connection of their own (``_bulk_client``); without it (tests'
        # channels) they go through ``client`` as any other.
        self.broker_url = broker_url
        self.master = master
        self.client_id = client_id
        self.prefix = client_keyprefix(client_id)
        # While it says the broker cannot be reached, each retry here is not said again.
        self.outage = outage

    def check_credentials(self) -> None:
        """One PING. The broker refusing the credentials is an answer, not an outage: raise
        ``redis.AuthenticationError`` (WRONGPASS/NOAUTH); any other RedisError means "not now"."""
        self.client.ping()

    def key(self, name: str) -> str:
        return self.prefix + name

    def send(
        self,
        message: BaseModel,
        retry_delays: tuple[float, ...] = SEND_RETRY_DELAYS_S,
        expire: tuple[str, int] | None = None,
    ) -> None:
        """LPUSH a message to the outbox, retrying a lost connection a bounded number of times.
        ``expire``: (key name, seconds) given a new TTL in the same round trip (EXPIRE of a key
        that is not there does nothing)."""
        body = message.model_dump_json()
        for delay in (*retry_delays, None):
            try:
                if len(body) > BULK_BYTES:
                    with self._bulk_client(len(body)) as bulk:
                        self._push(bulk, body, expire)
                else:
                    self._push(self.client, body, expire)
                return
            except redis.RedisError as exc:
                if delay is None:
                    raise BrokerUnavailable(
                        f"could not write to the outbox {self.key(CLIENT_OUTBOX)!r}: {exc}"
                    ) from exc
                quiet = self.outage is not None and self.outage.down and is_outage(exc)
                log.log(
                    logging.DEBUG if quiet else logging.WARNING,
                    "writing to the outbox failed (%s); retrying in %gs",
                    exc,
                    delay,
                )
                time.sleep(delay)

    def _push(self, client: redis.Redis, body: str, expire: tuple[str, int] | None) -> None:
        if expire is None:
            client.lpush(self.key(CLIENT_OUTBOX), body)
            return
        pipe = client.pipeline(transaction=False)
        pipe.lpush(self.key(CLIENT_OUTBOX), body)
        pipe.expire(self.key(expire[0]), expire[1])
        pipe.execute()

    def _bulk_client(self, size: int) -> redis.Redis:
        """A client of its own, from the same URL (credentials, TLS), whose socket timeout lets
        ``size`` bytes cross the slowest expected link; closed after use (big messages are rare:
        one connection more each is cheap beside their bytes)."""
        if self.broker_url is None:
            return redis.Redis(connection_pool=self.client.connection_pool)
        return connect_redis(self.broker_url, socket_timeout_s=bulk_timeout_s(size), master=self.master)

    def announce(self, body: str) -> None:
        """Clear the previous ack and push the announcement in one transaction, so an ack read
        afterwards answers this announcement (or a later one), never an older one."""
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(self.key(CLIENT_ACK))
        pipe.lpush(self.key(CLIENT_OUTBOX), body)
        pipe.execute()

    def read_ack(self) -> AnnouncementAck | None:
        return parse_ack(self.client.get(self.key(CLIENT_ACK)))

    def beat(self, session_id: str, ttl_s: float, round_trip_ms: float | None = None) -> Beat:
        """Renew the heartbeat (and say the round trip last measured), and read the ack, in one
        round trip; how long that took is the round trip measured now."""
        ttl_ms = max(1, int(ttl_s * 1000))
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.key(CLIENT_HEARTBEAT), session_id, px=ttl_ms)
        if round_trip_ms is not None:
            pipe.set(self.key(CLIENT_ROUND_TRIP), f"{round_trip_ms:.1f}", px=ttl_ms)
        pipe.get(self.key(CLIENT_ACK))
        started = time.monotonic()
        replies = pipe.execute()
        return Beat(round_trip_s=time.monotonic() - started, ack=parse_ack(replies[-1]))

    def clear_heartbeat(self) -> None:
        self.client.delete(self.key(CLIENT_HEARTBEAT))
