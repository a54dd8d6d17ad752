"""A TCP fault proxy on loopback: a network between a client agent and redis-server (issue 25).

This machine's kernel has no ``netem``, so the link a workstation has to the broker is made
here: every connection to ``FaultProxy.port`` is forwarded to the upstream (a redis-server),
and a test or a benchmark changes the link while real agents use it:

- ``delay(s)``: every byte arrives ``s`` seconds after it was sent, each way (order kept);
- ``bandwidth(bytes_per_s)``: each direction of the link at most that fast, shared by every
  connection in 50 ms slices (a heartbeat waits its turn behind a big result);
- ``cut()``: every byte dropped, both ways, sockets left open (a train in a tunnel: nobody
  is told, TCP just goes quiet); new connections are accepted and go quiet too;
- ``cut_after(marker)``: ``cut()`` right after the next chunk carrying ``marker`` passed (a
  fault placed between one message and what the other end sends next);
- ``reset()``: every open connection closed at once (RST), as a NAT or Wi-Fi drop does;
- ``flaky(p)``: each second, each open connection is reset with probability ``p``;
- ``heal()``: the link carries bytes again (delay and bandwidth stay as set).

It runs its own asyncio loop in a daemon thread; every method may be called from any thread.
``python -m bench.faultproxy --upstream 127.0.0.1:6379 --delay-ms 50`` runs one by hand, so an
operator can put a workstation's agent behind it (its broker URL with the proxy's port).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Self

_CHUNK = 64 * 1024


@dataclass
class LinkStats:
    """What went through: connections accepted, closed by a reset, bytes each way and dropped."""

    accepted: int = 0
    resets: int = 0
    up_bytes: int = 0  # client -> upstream
    down_bytes: int = 0  # upstream -> client
    dropped_bytes: int = 0


@dataclass
class _Link:
    delay_s: float = 0.0
    bytes_per_s: float | None = None
    cut: bool = False
    flaky_p: float = 0.0
    # ``cut_after``: (direction, marker) - the next chunk going that way with the marker in it
    # is the last one through.
    cut_marker: tuple[bool, bytes] | None = None
    stats: LinkStats = field(default_factory=LinkStats)
    # When each direction of the link is free again: its capacity is shared by every
    # connection, as one Wi-Fi link's is (a heartbeat waits behind a big result's pieces).
    free_at: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})

    async def take(self, up: bool, size: int, rate: float) -> None:
        """Wait for this direction's turn to send ``size`` bytes at ``rate``."""
        start = max(time.monotonic(), self.free_at[up])
        self.free_at[up] = start + size / rate
        if (wait := self.free_at[up] - time.monotonic()) > 0:
            await asyncio.sleep(wait)


class _Pipe:
    """One direction of one connection: read, hold each chunk ``delay_s``, pace it, write."""

    def __init__(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: bool
    ) -> None:
        self.link, self.reader, self.writer, self.up = link, reader, writer, up
        self.queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

    async def read(self) -> None:
        try:
            while data := await self.reader.read(_CHUNK):
                if self.link.cut:
                    self.link.stats.dropped_bytes += len(data)
                    continue
                self.queue.put_nowait((time.monotonic() + self.link.delay_s, data))
        except (ConnectionError, OSError):
            pass
        finally:
            self.queue.put_nowait(None)

    async def write(self) -> None:
        try:
            while (item := await self.queue.get()) is not None:
                due, data = item
                if (wait := due - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                marker = self.link.cut_marker
                marked = marker is not None and marker[0] == self.up and marker[1] in data
                if self.link.cut and not marked:  # cut while it was on its way
                    self.link.stats.dropped_bytes += len(data)
                    continue
                if marked:
                    # Cut before this chunk is written: nothing the other end answers gets through.
                    self.link.cut_marker = None
                    self.link.cut = True
                rate = self.link.bytes_per_s
                step = _CHUNK if rate is None else max(1, int(rate / 20))  # 50 ms of the link
                for at in range(0, len(data), step):
                    piece = data[at : at + step]
                    if rate is not None:
                        await self.link.take(self.up, len(piece), rate)
                    self.writer.write(piece)
                    await self.writer.drain()
                if self.up:
                    self.link.stats.up_bytes += len(data)
                else:
                    self.link.stats.down_bytes += len(data)
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                self.writer.close()


class FaultProxy:
    """A proxy to ``upstream`` (host, port) on 127.0.0.1:``port`` (0: a free one)."""

    def __init__(self, upstream: tuple[str, int], port: int = 0, seed: int | None = None) -> None:
        self.upstream = upstream
        self._want_port = port
        self.port = 0
        self.link = _Link()
        self._random = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="faultproxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._flaky_task: asyncio.Task[None] | None = None

    # --- lifecycle --------------------------------------------------------------------
    def start(self) -> Self:
        self._thread.start()
        self._call(self._listen)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def url(self, redis_url: str) -> str:
        """``redis_url`` (an agent's broker URL) with this proxy's port instead of the upstream's."""
        host_port = f"{self.upstream[0]}:{self.upstream[1]}"
        if host_port not in redis_url:
            raise ValueError(f"{redis_url!r} does not name the upstream {host_port}")
        return redis_url.replace(host_port, f"127.0.0.1:{self.port}", 1)

    # --- the link -----------------------------------------------------------------------
    def delay(self, seconds_each_way: float) -> None:
        self.link.delay_s = max(0.0, seconds_each_way)

    def bandwidth(self, bytes_per_s: float | None) -> None:
        self.link.bytes_per_s = bytes_per_s if bytes_per_s and bytes_per_s > 0 else None

    def cut(self) -> None:
        self.link.cut = True

    def cut_after(self, marker: bytes, up: bool = False) -> None:
        """Cut the link (as ``cut``) right after the next chunk carrying ``marker`` goes through,
        towards the client (``up``: towards the upstream): a test places a cut exactly between
        one message and whatever the other end would send next (a reply, an agent's writes
        after its pop)."""
        self.link.cut_marker = (up, marker)

    def heal(self) -> None:
        self.link.cut = False
        self.link.cut_marker = None

    def reset(self) -> int:
        """Close every open connection at once; how many there were."""
        return self._call(self._reset_all)

    def flaky(self, p: float) -> None:
        """From now on, each second, reset each open connection with probability ``p`` (0: stop)."""
        self.link.flaky_p = max(0.0, min(1.0, p))
        self._call(self._ensure_flaky)

    @property
    def stats(self) -> LinkStats:
        return self.link.stats

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def upstream_ports(self) -> set[int]:
        """The local ports of the open connections to the upstream: how redis-server (its
        ``CLIENT LIST``, ``MONITOR``) names what came through this proxy."""
        return self._call(self._upstream_ports)

    # --- on the loop ----------------------------------------------------------------------
    def _call(self, fn: Callable[[], Any]) -> Any:
        async def run() -> Any:
            result = fn()
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self._want_port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.link.stats.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _abort(writer)
            return
        self._open.add(writer)
        self._open.add(up_writer)
        pipes = (_Pipe(self.link, reader, up_writer, True), _Pipe(self.link, up_reader, writer, False))
        try:
            await asyncio.gather(*(p.read() for p in pipes), *(p.write() for p in pipes))
        except asyncio.CancelledError:
            pass  # stopping: asyncio's server callback would log a cancelled handler as an error
        finally:
            self._open.discard(writer)
            self._open.discard(up_writer)
            _abort(writer)
            _abort(up_writer)

    def _upstream_ports(self) -> set[int]:
        names = (w.get_extra_info("sockname") for w in self._open if not _is_client_side(w, self.port))
        return {name[1] for name in names if name}

    def _reset_all(self) -> int:
        clients = [w for w in self._open if _is_client_side(w, self.port)]
        for w in list(self._open):
            _abort(w)
        self.link.stats.resets += len(clients)
        return len(clients)

    def _ensure_flaky(self) -> None:
        if self._flaky_task is None or self._flaky_task.done():
            self._flaky_task = self._loop.create_task(self._flake())

    async def _flake(self) -> None:
        while self.link.flaky_p > 0:
            await asyncio.sleep(1.0)
            for w in [w for w in self._open if _is_client_side(w, self.port)]:
                if self._random.random() < self.link.flaky_p:
                    self.link.stats.resets += 1
                    _abort(w)

    async def _close(self) -> None:
        self.link.flaky_p = 0.0
        if self._server is not None:
            self._server.close()
        for w in list(self._open):
            _abort(w)
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)


def _is_client_side(writer: asyncio.StreamWriter, port: int) -> bool:
    sock = writer.get_extra_info("sockname")
    return bool(sock) and sock[1] == port


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with a RST (SO_LINGER 0), as a dropped NAT entry looks to both ends."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faultproxy", description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="HOST:PORT of the redis-server")
    parser.add_argument(
        "--port", type=int, default=0, help="port to listen on (127.0.0.1; default: a free one)"
    )
    parser.add_argument("--delay-ms", type=float, default=0.0, help="delay each way")
    parser.add_argument("--kbit", type=float, default=None, help="bandwidth cap per direction, kbit/s")
    args = parser.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    proxy = FaultProxy((host or "127.0.0.1", int(port)), args.port).start()
    proxy.delay(args.delay_ms / 1000)
    proxy.bandwidth(args.kbit * 1000 / 8 if args.kbit else None)
    print(f"faultproxy: 127.0.0.1:{proxy.port} -> {args.upstream}; Ctrl-C to stop", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        proxy.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
