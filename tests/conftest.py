"""Shared fixtures: real redis-server, real Celery workers, real MCP servers.

Every wait here is bounded; nothing sleeps to wait for readiness.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from filelock import FileLock

from brain.config import Settings, load_settings
from brain.core.models import TaskTree, TreeRecord, TreeStatus
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack
from brain.stack.redis_server import RedisServer, free_port
from workers.contracts import queue_keys

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
EXAMPLES = ROOT / "examples"


def write_mcp_config(path: Path, servers: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def demo_server(*extra: str) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(FIXTURES / "mcp_demo_server.py"), *extra]}


def time_server() -> dict[str, Any]:
    return {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}


# The MCP project's reference server from npm: images, embedded resources, structured content,
# progress. Pinned, installed once per machine into a cache; CI sets VANCETOPE_TEST_REQUIRE_NPM
# so that a missing npm fails instead of skipping.
EVERYTHING_PACKAGE = "@modelcontextprotocol/server-everything@2026.8.31"
NPM_CACHE = Path(os.environ.get("VANCETOPE_TEST_NPM_DIR", Path.home() / ".cache" / "vancetope-tests" / "npm"))


class NpmMissing(RuntimeError):
    """npm is not on PATH."""


def npm_install(packages: tuple[str, ...], binary: str, prefix: Path = NPM_CACHE) -> Path:
    """``binary`` of the pinned npm ``packages``, installed together once per machine into
    ``prefix`` (raises ``NpmMissing`` without npm). Outside pytest too: tests/conformance/run.py.

    Several pytest-xdist workers (or two checkouts) may ask at once: the install runs under a
    file lock, and the others wait for it and find the binary installed."""
    path = prefix / "node_modules" / ".bin" / binary
    if path.exists():
        return path
    npm = shutil.which("npm")
    if npm is None:
        raise NpmMissing(f"npm not found: {' and '.join(packages)} cannot be installed")
    prefix.mkdir(parents=True, exist_ok=True)
    with FileLock(str(prefix / ".install.lock"), timeout=900):
        if not path.exists():
            subprocess.run(
                [npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(prefix), *packages],
                check=True,
                timeout=600,
            )
    return path


def npm_required(needed_for: str, why: str) -> None:
    """Without npm: skipped locally, a failure in CI (VANCETOPE_TEST_REQUIRE_NPM)."""
    if os.environ.get("VANCETOPE_TEST_REQUIRE_NPM"):
        pytest.fail(f"npm is needed for {needed_for} (VANCETOPE_TEST_REQUIRE_NPM is set)")
    pytest.skip(f"{why}: {needed_for}")


def npm_binary(package: str, binary: str, needed_for: str) -> Path:
    """``binary`` of the pinned npm ``package``, installed once per machine into ``NPM_CACHE``.
    Without npm: skipped locally, a failure in CI (VANCETOPE_TEST_REQUIRE_NPM)."""
    try:
        return npm_install((package,), binary)
    except NpmMissing:
        npm_required(needed_for, f"npm not found, needed for {package}")
        raise


@pytest.fixture(scope="session")
def everything_server() -> dict[str, Any]:
    """An mcpServers entry that starts the reference 'everything' MCP server over stdio."""
    binary = npm_binary(EVERYTHING_PACKAGE, "mcp-server-everything", "the MCP interoperability tests")
    return {"command": str(binary), "args": ["stdio"]}


# The MCP conformance scores (tests/conformance) in the terminal summary of every run, CI's log
# included, passed or failed: its test records the table as property "conformance_table", which
# pytest-xdist carries from the worker to the run that prints the summary.
_CONFORMANCE_TABLES: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        _CONFORMANCE_TABLES.extend(
            str(value) for name, value in report.user_properties if name == "conformance_table"
        )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for text in _CONFORMANCE_TABLES:
        terminalreporter.write_sep("=", "MCP conformance through the gateway (tests/conformance)")
        terminalreporter.write_line(text.strip("\n"))


# Headless Chromium from the distribution's packages (Debian: `chromium`) opens Flower's
# dashboard as an operator would. CI sets VANCETOPE_TEST_REQUIRE_CHROMIUM (and .ci/run
# installs it), so a missing browser fails there instead of skipping.
@pytest.fixture(scope="session")
def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        if os.environ.get("VANCETOPE_TEST_REQUIRE_CHROMIUM"):
            pytest.fail(
                "chromium is needed for the Flower dashboard test (VANCETOPE_TEST_REQUIRE_CHROMIUM is set)"
            )
        pytest.skip("chromium not found: the Flower dashboard test needs it (apt-get install chromium)")
    return found


@pytest.fixture(autouse=True)
def own_gateway_port(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """`vancetope up` serves the MCP gateway on gateway_port (default 8765) unless told
    otherwise: each integration and security test gets a free port of its own in
    VANCETOPE_GATEWAY_PORT, so tests running at the same time (pytest-xdist workers, another
    checkout's suite) never find it taken ("MCP gateway not started")."""
    parts = request.node.path.parts
    if "integration" in parts or "security" in parts:
        monkeypatch.setenv("VANCETOPE_GATEWAY_PORT", str(free_port()))
        # And the web view `up` serves (default 8766).
        monkeypatch.setenv("VANCETOPE_WEB_PORT", str(free_port()))


def agent_with_servers(tmp_path: Path, servers: dict[str, Any]) -> Path:
    """agent.toml of client "laptop" (user "ada") whose mcp.json holds ``servers``; an empty
    sandbox. The stack replaces its broker_url with the agent's enrolled credential."""
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir(exist_ok=True)
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
    agent = tmp_path / "agent.toml"
    agent.write_text(
        "[agent]\n"
        'client_id = "laptop"\nuser = "ada"\nclient_type = "cli"\n'
        'broker_url = "redis://127.0.0.1:1/0"\n'
        f'sandbox_roots = ["{sandbox}"]\nmcp_json = "{tmp_path / "mcp.json"}"\n'
        "heartbeat_interval_s = 0.5\nheartbeat_ttl_s = 2.0\n"
        # What a user writes after reviewing mcp.json; without it each server waits for approval.
        f"trust_mcp_servers = {json.dumps(sorted(servers))}\n"
    )
    return agent


def brain_with_client(
    stack_factory: Any, brain_factory: Any, tmp_path: Path, servers: dict[str, Any]
) -> Brain:
    """A stack with client agent "laptop" connected whose mcp.json holds ``servers``, and no
    server-side MCP servers: every MCP tool is one only the client offers."""
    stack = stack_factory(
        services=("brain", "server-pool", "client-agent"),
        agent_config=agent_with_servers(tmp_path, servers),
        mcp_config=write_mcp_config(tmp_path / "server-mcp.json", {}),
    )
    assert stack.wait_connected("laptop", 120)
    return brain_factory(stack)


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "registry": EXAMPLES / "registry.yaml",
        "reconcile_interval_s": 0.5,
        "reconcile_grace_s": 1.0,
        "server_concurrency": 2,
        "default_timeout_s": 30.0,
    }
    values.update(overrides)
    return load_settings(env={}, cwd=tmp_path, **values)


def start_stack(
    where: Path, started: list[EmbeddedStack], services: tuple[str, ...] | None = None, **overrides: Any
) -> EmbeddedStack:
    """An embedded stack with its data in ``where`` (by default with the time and demo MCP
    servers), appended to ``started`` before it starts, so that a failed start is stopped too."""
    if "mcp_config" not in overrides:
        overrides["mcp_config"] = write_mcp_config(
            where / "server-mcp.json", {"time": time_server(), "demo": demo_server()}
        )
    stack = EmbeddedStack(make_settings(where, **overrides), only=services)
    started.append(stack)
    return stack.start()


@pytest.fixture
def stack_factory(tmp_path: Path) -> Iterator[Callable[..., EmbeddedStack]]:
    """Start an embedded stack (redis-server + brain + server pool) for this test."""
    started: list[EmbeddedStack] = []

    def start(services: tuple[str, ...] | None = None, **overrides: Any) -> EmbeddedStack:
        return start_stack(tmp_path, started, services, **overrides)

    yield start
    for stack in started:
        stack.stop()


@pytest.fixture(scope="module")
def module_stack_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., EmbeddedStack]]:
    """Like ``stack_factory``, for a stack that the tests of one module share (each call: a
    data dir of its own). Only for tests that do not need a fresh stack: they must not depend
    on what other tests left in it (trees, queues, logs), and must leave it usable."""
    started: list[EmbeddedStack] = []

    def start(services: tuple[str, ...] | None = None, **overrides: Any) -> EmbeddedStack:
        return start_stack(tmp_path_factory.mktemp("stack"), started, services, **overrides)

    yield start
    for stack in started:
        stack.stop()


@pytest.fixture
def brain_factory() -> Iterator[Callable[[EmbeddedStack], Brain]]:
    opened: list[Brain] = []

    def connect(stack: EmbeddedStack) -> Brain:
        brain = Brain.connect(stack.settings, stack.redis_url)
        opened.append(brain)
        return brain

    yield connect
    for brain in opened:
        brain.close()


# The flags every headless Chromium of the suite runs with: without the background-networking
# ones, Chromium's own connections are refused by CI's closed network, many at a time.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",  # tests run as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def pool_processes(
    tmp_path: Path,
) -> Iterator[Callable[[EmbeddedStack, list[str], str], subprocess.Popen[bytes]]]:
    """Start another pool worker process of ``stack`` (``argv``, its output in ``<log_name>.log``),
    connected as the pool's ACL user, as a machine of its own would be; killed after the test."""
    import signal

    from brain.stack.embedded import stack_env

    started: list[subprocess.Popen[bytes]] = []

    def start(stack: EmbeddedStack, argv: list[str], log_name: str) -> subprocess.Popen[bytes]:
        with open(tmp_path / f"{log_name}.log", "ab") as log:  # the process keeps its own copy
            proc = subprocess.Popen(
                argv,
                cwd=tmp_path,
                env=stack_env(stack.settings, stack.service_url("server-pool")),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def wait_for_tree(brain: Brain, tree_id: str, timeout: float = 120.0) -> TreeRecord:
    """Block until the tree is no longer running (bounded), woken by the brain's events.

    The bound is only a backstop (see ``wait_until``): a test that bounds how long a tree may
    take says so with its own ``timeout`` and its own measurement."""
    from workers.contracts import channel_tree_events

    pubsub = brain.hot.r.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel_tree_events(tree_id))
    deadline = time.monotonic() + timeout
    try:
        while True:
            rec = brain.store.get_tree(tree_id)
            assert rec is not None
            if rec.status is not TreeStatus.RUNNING:
                return rec
            if time.monotonic() > deadline:
                states = {t.task_id: t.state.value for t in brain.store.get_tasks(tree_id)}
                raise AssertionError(f"tree {tree_id} still running after {timeout}s: {states}")
            pubsub.get_message(timeout=0.5)
    finally:
        pubsub.close()


def waiting_on(r: redis.Redis, queue: str) -> int:
    """Messages waiting on a pool's ``queue``: kombu keeps one list per priority step."""
    return sum(int(r.llen(key)) for key in queue_keys(queue))


def messages_on(r: redis.Redis, queue: str) -> list[bytes]:
    """The messages waiting on ``queue``, the first a worker would take last, step by step."""
    return [raw for key in queue_keys(queue) for raw in r.lrange(key, 0, -1)]


def wait_until(predicate: Callable[[], Any], timeout: float = 120.0, what: str = "condition") -> Any:
    """``predicate()``'s first true value, polled until ``timeout``.

    The default is generous on purpose: a passing test returns as soon as the condition holds,
    so a long bound costs nothing; a short one failed CI when the suite's own load (two xdist
    workers with their redis-servers, Celery pools and agents) made a start take 31 s of 30.
    Pass a short ``timeout`` only where the bound is what the test asserts."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class InThread:
    """``fn()`` running in a daemon thread. A test waits for ``done`` with ``wait_until``, then
    reads ``result()`` (which raises what ``fn`` raised): "it returns long before the work it
    stops would have ended" is then a wait on a condition, not a wall-clock assert."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), name="test:in-thread", daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test by result()
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> Any:
        assert self.done()
        if self._error is not None:
            raise self._error
        return self._value


def tree(data: dict[str, Any]) -> TaskTree:
    return TaskTree.model_validate(data)


def server_runs_started(brain: Brain, tree_id: str) -> dict[str, str]:
    """Task id -> run id of the tree's server calls a worker has begun (``Store.begin_run``
    moves each to running and counts the start: ``TaskRecord.deliveries``)."""
    from brain.core.models import TaskState

    return {
        t.task_id: t.run_id or ""
        for t in brain.store.get_tasks(tree_id)
        if t.state is TaskState.RUNNING and t.client_id is None and t.deliveries > 0
    }


def result_for(brain: Brain, tree_id: str, task_id: str, client_id: str | None, value: Any = "forged") -> Any:
    """A successful ToolResult for the task's current run, as its worker (or a forger who
    knows the run id: it travels in the client's message) would send it."""
    from workers.contracts import ToolResult

    task = brain.store.get_task(tree_id, task_id)
    assert task is not None and task.run_id
    return ToolResult(
        run_id=task.run_id, tree_id=tree_id, task_id=task_id, tool=task.tool, ok=True, value=value,
        client_id=client_id, started_at=0, finished_at=0,
    )  # fmt: skip


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"), appendonly=False).start()
    yield server
    server.stop()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def brain_on_redis(tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[Brain]:
    """A brain wired to a real Redis and a SQLite store, with no workers: for tests that
    drive the scheduler directly and read what it published."""
    brain = Brain.connect(make_settings(tmp_path), redis_server.url, example_registry())
    yield brain
    brain.close()


def example_registry() -> Any:
    """The built-in tools and examples/registry.yaml, as a brain worker would publish them."""
    from brain.core.models import Location
    from brain.core.snapshot import RegistrySnapshot
    from brain.core.treefile import load_engines, load_registry, merge_registry, spec_from_descriptor
    from workers.tools.builtin import builtin_descriptors

    builtins = {d.name: spec_from_descriptor(d, Location.SERVER) for d in builtin_descriptors()}
    return RegistrySnapshot(
        tools=merge_registry(builtins, load_registry(EXAMPLES / "registry.yaml")),
        engines=load_engines(EXAMPLES / "registry.yaml"),
    )
