"""Many client agents in one process, speaking the agent's protocol (issue 25, item 2).

    python -m bench.fleet_sim CLIENTS_JSON AGENT_TOML

A real agent (``client_agent.agent.Agent``) is one process with threads; 1,000 of them do
not fit on a 2-core machine, so this process holds many clients on asyncio
(``redis.asyncio``). The issue allows that only if each simulated client speaks exactly the
agent's protocol; what each one does, and from which code of the agent:

- the announcement is ``client_agent.announce.encode_announcement`` of the tools a real
  agent with ``AGENT_TOML`` announces (``Policy.announced_native``), pushed as
  ``AgentChannel.announce`` does (MULTI: DEL ack, LPUSH outbox), the ack polled every
  ``_ACK_POLL_S`` up to ``ack_timeout_s`` and retried with ``retry_delay`` backoff, as the
  ``Announcer`` thread does;
- the heartbeat is ``AgentChannel.beat`` (one pipeline: SET heartbeat PX ttl, SET rtt PX ttl
  with the median of the last ``ROUND_TRIPS_KEPT`` round trips, GET ack) every
  ``heartbeat_interval_s``, and a gone or refused ack asks for a new announcement, as the
  ``Heartbeat`` thread does;
- the Celery consumer is what kombu's Redis transport does on the client's prefix: the queue
  bindings (SADD ``_kombu.binding.*``), a ``BRPOP`` of the queue's four priority keys with
  kombu's 1 s timeout, on a connection of its own, a delivered message written to the
  ``unacked`` hash and ``unacked_index`` as kombu's ``QoS.append`` does (the simulated agent
  then holds the call: it runs no tool), and kombu's visibility restore every 10 s (mutex,
  ZRANGE BYSCORE REV, release in a WATCH/MULTI);
- a stop says goodbye as ``Agent._say_goodbye`` does (``ClientDisconnected``, DEL heartbeat).

The same connections per client as a real agent, as ``CLIENT LIST`` shows (bench/fleet.py
counts both and puts them in the row's notes): the channel's pool (one connection, a second
while the announcer and the heartbeat are in a command at once), kombu's BRPOP connection and
kombu's connection for its other commands.

stdin/stdout: prints ``ready N`` once every client's connections are open and its credential
checked (a PING each, ``AgentChannel.check_credentials``); ``go SPREAD_S`` starts them all,
each first announcement and heartbeat phase spread uniformly over SPREAD_S seconds (0: all at
once, a storm); prints ``accepted N SECONDS LAG`` when every one is accepted; ``stop`` says
goodbye for all, prints ``stopped RECEIVED LAG`` and exits. LAG: how late, at worst, this
process's timers fired since the last report (s): the simulated heartbeats are only as
punctual as that.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import resource
import statistics
import sys
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel

from client_agent.announce import _ACK_POLL_S, ROUND_TRIPS_KEPT, encode_announcement, retry_delay
from client_agent.channel import parse_ack
from client_agent.config import AgentConfig, load_config
from client_agent.policy import Policy
from workers.contracts import (
    CLIENT_ACK,
    CLIENT_HEARTBEAT,
    CLIENT_OUTBOX,
    CLIENT_ROUND_TRIP,
    KOMBU_UNACKED,
    KOMBU_UNACKED_INDEX,
    ClientDisconnected,
    ToolDescriptor,
    client_keyprefix,
    client_queue,
)

# kombu.transport.redis: Channel.sep, PRIORITY_STEPS, brpop_timeout, unacked_mutex_expire, and
# the hub's restore cycle (Transport.register_with_event_loop: every 10 s).
KOMBU_SEP = "\x06\x16"
KOMBU_PRIORITIES = (0, 3, 6, 9)
KOMBU_BRPOP_TIMEOUT_S = 1
KOMBU_MUTEX_EXPIRE_MS = 300_000
KOMBU_RESTORE_EVERY_S = 10.0
CONNECT_AT_ONCE = 200
LAG_TICK_S = 0.1  # connections opened concurrently (the listen backlog is not the test)


class SimClient:
    """One simulated agent: its four connections and its loops."""

    def __init__(self, client_id: str, url: str, tools: list[ToolDescriptor], config: AgentConfig) -> None:
        self.client_id = client_id
        self.url = url
        self.tools = tools
        self.config = config
        self.session_id = f"sess_{uuid.uuid4().hex}"
        self.prefix = client_keyprefix(client_id)
        self.queue = client_queue(client_id)
        self.accepted = asyncio.Event()
        self.first_beat = asyncio.Event()
        self.wanted = asyncio.Event()
        self.received = 0
        self.round_trips: deque[float] = deque(maxlen=ROUND_TRIPS_KEPT)
        # The agent's AgentChannel: one redis-py client whose pool the announcer and the
        # heartbeat share (``connect_redis``: same timeouts and health check); it holds a second
        # connection only when both are in a command at once, as the agent's two threads do.
        self.channel = aioredis.Redis.from_url(
            url, socket_connect_timeout=5, socket_timeout=10, health_check_interval=15
        )
        # kombu: BRPOP on a connection of its own, everything else on the channel's client.
        self.consumer_conn = self._dedicated(socket_timeout=None)  # BRPOP blocks server-side
        self.kombu_conn = self._dedicated(socket_timeout=10.0)

    def _dedicated(self, socket_timeout: float | None) -> aioredis.Redis:
        """One connection, pipelines included (``single_connection_client`` would leave them
        to a pool of their own, one connection more each)."""
        pool = aioredis.BlockingConnectionPool.from_url(
            self.url, max_connections=1, timeout=None, socket_connect_timeout=5, socket_timeout=socket_timeout
        )
        return aioredis.Redis(connection_pool=pool)

    def key(self, name: str) -> str:
        return self.prefix + name

    async def open(self) -> None:
        """Open the four connections; the PING on the channel's is ``check_credentials``."""
        for conn in (self.channel, self.consumer_conn, self.kombu_conn):
            await conn.ping()

    # --- announcer (client_agent.announce.Announcer) -------------------------------------
    async def announcer(self, first_delay: float) -> None:
        await asyncio.sleep(first_delay)
        # The agent's heartbeat thread, started first, has written its first beat (~1 ms) before
        # the announcer thread wakes; here the two tasks would overlap in the channel's pool and
        # open the second connection the agent only seldom has.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.first_beat.wait(), timeout=self.config.heartbeat_interval_s)
        self.wanted.set()
        attempt = 0
        while True:
            await self.wanted.wait()
            self.wanted.clear()
            if await self._announce_once():
                attempt = 0
                continue
            await asyncio.sleep(retry_delay(attempt))
            attempt += 1
            self.wanted.set()

    async def _announce_once(self) -> bool:
        body, _ = encode_announcement(
            self.client_id, self.session_id, self.config.client_type, self.tools, time.time()
        )
        conn = self.channel
        try:
            pipe = conn.pipeline(transaction=True)
            pipe.delete(self.key(CLIENT_ACK))
            pipe.lpush(self.key(CLIENT_OUTBOX), body)
            await pipe.execute()
            deadline = time.monotonic() + self.config.ack_timeout_s
            while time.monotonic() < deadline:
                ack = parse_ack(await conn.get(self.key(CLIENT_ACK)))
                if ack is not None and ack.session_id == self.session_id:
                    if ack.accepted:
                        self.accepted.set()
                    return ack.accepted
                await asyncio.sleep(_ACK_POLL_S)
        except aioredis.RedisError:
            return False
        return False

    # --- heartbeat (client_agent.announce.Heartbeat, AgentChannel.beat) ------------------
    async def heartbeat(self, first_delay: float) -> None:
        await asyncio.sleep(first_delay)
        cfg = self.config
        ttl_ms = max(1, int(cfg.heartbeat_ttl_s * 1000))
        while True:
            try:
                pipe = self.channel.pipeline(transaction=False)
                pipe.set(self.key(CLIENT_HEARTBEAT), self.session_id, px=ttl_ms)
                if self.round_trips:
                    rtt_ms = statistics.median(self.round_trips) * 1000
                    pipe.set(self.key(CLIENT_ROUND_TRIP), f"{rtt_ms:.1f}", px=ttl_ms)
                pipe.get(self.key(CLIENT_ACK))
                started = time.monotonic()
                replies = await pipe.execute()
                self.round_trips.append(time.monotonic() - started)
                ack = parse_ack(replies[-1])
                if self.accepted.is_set() and (ack is None or not ack.accepted):
                    self.accepted.clear()
                    self.wanted.set()
            except aioredis.RedisError:
                pass  # the agent logs it once and beats again next interval
            self.first_beat.set()
            await asyncio.sleep(cfg.heartbeat_interval_s)

    # --- kombu's Redis transport on the client's prefix -----------------------------------
    async def bind(self) -> None:
        """``Channel._queue_bind`` of the client's queue (the exchange is named after it)."""
        member = KOMBU_SEP.join([self.queue, "", self.queue])
        pipe = self.kombu_conn.pipeline(transaction=True)
        pipe.sadd(self.key(f"_kombu.binding.{self.queue}"), member)
        pipe.sadd(self.key(f"_kombu.binding_permanent.{self.queue}"), member)
        await pipe.execute()

    async def consume(self) -> None:
        keys = [self.key(self.queue if p == 0 else f"{self.queue}{KOMBU_SEP}{p}") for p in KOMBU_PRIORITIES]
        while True:
            try:
                got = await self.consumer_conn.brpop(keys, timeout=KOMBU_BRPOP_TIMEOUT_S)
            except aioredis.RedisError:
                await asyncio.sleep(1.0)  # kombu reconnects with its own backoff
                continue
            if got is not None:
                await self._hold(got[1])

    async def _hold(self, raw: bytes | str) -> None:
        """kombu's ``QoS.append``: the delivered message goes to the unacked hash and index."""
        try:
            message = json.loads(raw)
            tag = message["properties"]["delivery_tag"]
            info = message["properties"].get("delivery_info", {})
        except (ValueError, KeyError, TypeError):
            return
        pipe = self.kombu_conn.pipeline(transaction=True)
        pipe.zadd(self.key(KOMBU_UNACKED_INDEX), {tag: time.time()})
        pipe.hset(
            self.key(KOMBU_UNACKED),
            tag,
            json.dumps([message, info.get("exchange", ""), info.get("routing_key", "")]),
        )
        await pipe.execute()
        self.received += 1

    async def restore_cycle(self, first_delay: float) -> None:
        """kombu's ``QoS.restore_visible``: under a mutex, look for messages past the visibility
        timeout (none here: the calls are held, not lost)."""
        await asyncio.sleep(first_delay)
        mutex = self.key(KOMBU_UNACKED + "_mutex")
        while True:
            token = uuid.uuid4().hex
            try:
                if await self.kombu_conn.set(mutex, token, nx=True, px=KOMBU_MUTEX_EXPIRE_MS):
                    ceil = time.time() - 3600.0
                    await self.kombu_conn.zrange(
                        self.key(KOMBU_UNACKED_INDEX), ceil, 0, desc=True, byscore=True,
                        offset=0, num=10, withscores=True,
                    )  # fmt: skip
                    async with self.kombu_conn.pipeline(transaction=True) as pipe:
                        await pipe.watch(mutex)
                        if await pipe.get(mutex) == token.encode():
                            pipe.multi()
                            pipe.delete(mutex)
                            await pipe.execute()
            except aioredis.RedisError:
                pass
            await asyncio.sleep(KOMBU_RESTORE_EVERY_S)

    # --- goodbye (Agent._say_goodbye) ----------------------------------------------------
    async def goodbye(self) -> None:
        msg = ClientDisconnected(
            client_id=self.client_id,
            session_id=self.session_id,
            reason="graceful shutdown",
            sent_at=time.time(),
        )
        try:
            await self.channel.lpush(self.key(CLIENT_OUTBOX), _json(msg))
            await self.channel.delete(self.key(CLIENT_HEARTBEAT))
        except aioredis.RedisError:
            pass

    async def close(self) -> None:
        for conn in (self.channel, self.consumer_conn, self.kombu_conn):
            await conn.aclose()


def _json(message: BaseModel) -> str:
    return message.model_dump_json()


def raise_fd_limit(needed: int) -> None:
    """Up to four sockets a client: lift the soft limit of open files to the hard one if short."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def _gather_bounded(coros: list[Any], at_once: int) -> None:
    gate = asyncio.Semaphore(at_once)

    async def one(coro: Any) -> None:
        async with gate:
            await coro

    await asyncio.gather(*(one(c) for c in coros))


async def main(clients_json: Path, agent_toml: Path) -> None:
    config = load_config(agent_toml, environ={})
    tools = Policy.from_config(config, agent_toml).announced_native()
    entries: list[dict[str, str]] = json.loads(clients_json.read_text())
    raise_fd_limit(4 * len(entries) + 256)
    clients = [SimClient(e["client_id"], e["url"], tools, config) for e in entries]
    await _gather_bounded([c.open() for c in clients], CONNECT_AT_ONCE)
    await _gather_bounded([c.bind() for c in clients], CONNECT_AT_ONCE)
    print(f"ready {len(clients)}", flush=True)

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks: list[asyncio.Task[None]] = []
    lag = Lag()
    tasks.append(asyncio.create_task(lag.watch()))
    while line := (await reader.readline()).decode().split():
        if line[0] == "go":
            spread = float(line[1]) if len(line) > 1 else 0.0
            for c in clients:
                phase = random.uniform(0, spread)
                # The agent starts its heartbeat thread before it asks the announcer to announce
                # (Agent.start), so its first beat is written first; tasks start in this order.
                tasks += [
                    asyncio.create_task(c.heartbeat(phase)),
                    asyncio.create_task(c.announcer(phase)),
                    asyncio.create_task(c.consume()),
                    asyncio.create_task(c.restore_cycle(phase + random.uniform(0, KOMBU_RESTORE_EVERY_S))),
                ]
            tasks.append(asyncio.create_task(_say_accepted(clients, time.monotonic(), lag)))
        elif line[0] == "stop":
            break
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await _gather_bounded([c.goodbye() for c in clients], CONNECT_AT_ONCE)
    await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    print(f"stopped {sum(c.received for c in clients)} {lag.worst:.3f}", flush=True)


class Lag:
    """How late this process's timers fire (s): a heartbeat is only as punctual as this; a real
    agent, alone in its process, is not late. bench/fleet.py puts the worst in the notes."""

    def __init__(self) -> None:
        self.worst = 0.0

    async def watch(self) -> None:
        while True:
            planned = time.monotonic() + LAG_TICK_S
            await asyncio.sleep(LAG_TICK_S)
            self.worst = max(self.worst, time.monotonic() - planned)

    def reset(self) -> float:
        worst, self.worst = self.worst, 0.0
        return worst


async def _say_accepted(clients: list[SimClient], started: float, lag: Lag) -> None:
    await asyncio.gather(*(c.accepted.wait() for c in clients))
    print(f"accepted {len(clients)} {time.monotonic() - started:.3f} {lag.reset():.3f}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2])))
