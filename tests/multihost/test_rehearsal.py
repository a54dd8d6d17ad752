"""A multi-host rehearsal on one machine (issue 28, item 3).

deploy/multihost.sh makes one network namespace per host, each with its own address on a
bridge of its own. Each component runs in its host's namespace from a folder of its own, with
only the other hosts' addresses and its own credential: Redis, the brain (the store is its
SQLite file), the default pool and a named pool (no store: MongoDB cannot run here, so they
record through the brain, docs/pools.md), and a workstation with a real ``vancetope-agent
run``. A night batch and a client tree run across them; then each host dies in turn.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from brain.config import load_settings
from brain.core.models import TaskState, TreeRecord, TreeStatus
from brain.errors import BrainError
from brain.hot.acl import COMPONENT_RULES, component_acl_lines, new_secret, secret_sha256
from brain.runtime.service import Brain
from brain.stack.redis_server import ADMIN_USER, RedisLimits, component_secret, find_redis_server
from tests.conftest import EXAMPLES, ROOT, tree, wait_for_tree, wait_until
from workers.contracts import BRAIN_QUEUE, key_presence, key_tree_running
from workers.urls import with_credentials

SCRIPT = ROOT / "deploy" / "multihost.sh"
HOSTS = ("redis", "brain", "pool", "pool-batch", "workstation")
REDIS_PORT = 6379
# Generous: a pool killed mid-call gives its call back within visibility_timeout_s + 5 s.
WAIT_S = 120.0


def _cannot_make_namespaces() -> str | None:
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2): the rehearsal makes network namespaces with it"
    if os.geteuid() != 0:
        return "not root: making network namespaces and veth links needs root"
    return None


@dataclass
class Rehearsal:
    """The hosts of one rehearsal and the processes started on them."""

    id: str
    root: Path
    procs: dict[str, list[subprocess.Popen[bytes]]] = field(default_factory=dict)
    admin_secret: str = field(default_factory=new_secret, repr=False)

    def script(self, *args: str) -> str:
        done = subprocess.run(
            [str(SCRIPT), args[0], self.id, *args[1:]],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"multihost.sh {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def addr(self, host: str) -> str:
        return self.script("addr", host)

    def folder(self, host: str) -> Path:
        path = self.root / host
        path.mkdir(parents=True, exist_ok=True)
        return path

    def redis_address(self) -> str:
        return f"redis://{self.addr('redis')}:{REDIS_PORT}/0"

    def url_for(self, component: str) -> str:
        """What the redis host's operator hands each component: its own user and secret."""
        return with_credentials(
            self.redis_address(), component, component_secret(self.admin_secret, component)
        )

    def admin_url(self) -> str:
        return with_credentials(self.redis_address(), ADMIN_USER, self.admin_secret)

    def host_env(self, host: str, env: dict[str, str]) -> dict[str, str]:
        """``env`` and nothing of this process's environment but PATH: no setting reaches a
        host that the host would not have."""
        path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        return {"PATH": path, "HOME": str(self.folder(host)), **env}

    def start(self, host: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """``argv`` on ``host``, from its folder, its output in the host's log."""
        where = self.folder(host)
        with open(where / "host.log", "ab") as log:
            proc = subprocess.Popen(
                [str(SCRIPT), "exec", self.id, host, *argv],
                cwd=where,
                env=self.host_env(host, env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.setdefault(host, []).append(proc)
        return proc

    def run(self, host: str, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        """A command on ``host`` to its end (an operator's `vancetope` command)."""
        return subprocess.run(
            [str(SCRIPT), "exec", self.id, host, *argv],
            cwd=self.folder(host),
            env=self.host_env(host, env),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def kill(self, host: str) -> None:
        """The host dies: every process on it, SIGKILL."""
        self.script("kill", host)
        for proc in self.procs.get(host, []):
            proc.wait(30)

    def log(self, host: str) -> str:
        path = self.folder(host) / "host.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    # --- the hosts --------------------------------------------------------------------

    def start_redis(self) -> None:
        where = self.folder("redis")
        components = {user: component_secret(self.admin_secret, user) for user in COMPONENT_RULES}
        acl = where / "users.acl"
        if not acl.exists():  # a restart keeps the client users the brain saved
            lines = [
                "user default off resetkeys resetchannels -@all",
                f"user {ADMIN_USER} on #{secret_sha256(self.admin_secret)} ~* &* +@all",
                *component_acl_lines(components),
            ]
            acl.write_text("\n".join(lines) + "\n")
        argv = [
            find_redis_server(), "--bind", self.addr("redis"), "--port", str(REDIS_PORT),
            "--dir", str(where), "--appendonly", "yes", "--appendfsync", "everysec",
            "--maxmemory-policy", "noeviction", *RedisLimits().args(), "--save", "",
            "--aclfile", str(acl), "--daemonize", "no", "--logfile", str(where / "redis.log"),
        ]  # fmt: skip
        self.start("redis", argv, {})
        admin = redis.Redis.from_url(self.admin_url(), socket_connect_timeout=0.5)

        def answers() -> bool:
            try:
                return bool(admin.ping())
            except redis.exceptions.ConnectionError:
                return False

        try:
            wait_until(answers, WAIT_S, f"redis-server on its host:\n{self.log('redis')}")
        finally:
            admin.close()

    def stack_env(self, host: str, user: str, **extra: str) -> dict[str, str]:
        """A stack component's settings: its own copies of the registry and mcpServers file."""
        where = self.folder(host)
        shutil.copy(EXAMPLES / "registry.yaml", where / "registry.yaml")
        (where / "server-mcp.json").write_text(
            json.dumps(
                {"mcpServers": {"time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]}}}
            )
        )
        return {
            "VANCETOPE_DATA_DIR": str(where / "data"),
            "VANCETOPE_REDIS_URL": self.url_for(user),
            "VANCETOPE_REGISTRY": str(where / "registry.yaml"),
            "VANCETOPE_MCP_CONFIG": str(where / "server-mcp.json"),
            "VANCETOPE_POOLS": json.dumps([{"name": "batch", "concurrency": 1}]),
            "VANCETOPE_VISIBILITY_TIMEOUT_S": "10",
            "VANCETOPE_RECONCILE_INTERVAL_S": "1",
            "VANCETOPE_RECONCILE_GRACE_S": "2",
            "VANCETOPE_MCP_SANDBOX": "none",
            **extra,
        }

    def brain_env(self) -> dict[str, str]:
        return self.stack_env(
            "brain", "vt-brain", VANCETOPE_AGENT_BROKER_URL=self.redis_address(), VANCETOPE_USER="demo"
        )

    def start_brain(self) -> None:
        self.start("brain", ["vancetope", "brain"], self.brain_env())

    def start_pool(self, host: str) -> None:
        # No store on a pool host (MongoDB cannot run here): the store URL names the brain's
        # host, where nothing answers, so the pool records through the brain.
        store = f"mongodb://{self.addr('brain')}:27017/vancetope?serverSelectionTimeoutMS=300&connectTimeoutMS=300"
        argv = ["vancetope", "worker"] + (["--pool", "batch"] if host == "pool-batch" else [])
        self.start(host, argv, self.stack_env(host, "vt-pool", VANCETOPE_STORE_URL=store))

    def enroll_workstation(self) -> None:
        """`clients enroll` on the brain's host; its credential file is copied to the workstation."""
        brain_dir = self.folder("brain")
        argv = ["vancetope", "clients", "enroll", "laptop", "--user", "demo", "--output", "laptop.credential"]
        done = self.run("brain", argv, self.brain_env())
        assert done.returncode == 0, done.stderr
        where = self.folder("workstation")
        shutil.copy(brain_dir / "laptop.credential", where / "credential")
        (brain_dir / "laptop.credential").unlink()
        sandbox = where / "sandbox"
        sandbox.mkdir(exist_ok=True)
        (sandbox / "notes.txt").write_text("kept on the laptop\n")
        (where / "mcp.json").write_text(json.dumps({"mcpServers": {}}))
        (where / "agent.toml").write_text(
            "[agent]\n"
            'client_id = "laptop"\nuser = "demo"\nclient_type = "cli"\n'
            f'credential_file = "credential"\nsandbox_roots = ["{sandbox}"]\nmcp_json = "mcp.json"\n'
            f'data_dir = "{where / "agent-data"}"\n'
            "heartbeat_interval_s = 0.5\nheartbeat_ttl_s = 2.0\n"
        )

    def start_workstation(self) -> None:
        self.start("workstation", ["vancetope-agent", "run", "--config", "agent.toml"], {})


@dataclass
class Running:
    """The rehearsal's hosts, every component started, and the operator's brain connection."""

    hosts: Rehearsal
    brain: Brain

    def status(self) -> subprocess.CompletedProcess[str]:
        """`vancetope status` on the brain's host, as its operator runs it."""
        return self.hosts.run("brain", ["vancetope", "status"], self.hosts.brain_env())

    def alarm(self, line: str) -> str | None:
        """Status's output once it raises the alarm ``line`` (work waiting, nobody consuming)."""
        out = self.status().stdout
        return out if "nobody consuming" in out and line in " ".join(out.split()) else None

    def submit(self, data: dict[str, Any]) -> str:
        return self.brain.scheduler.submit(tree(data), user="demo").tree_id

    def finish(self, tree_id: str) -> TreeRecord:
        rec = wait_for_tree(self.brain, tree_id, WAIT_S)
        tasks = {t.task_id: (t.state.value, t.error) for t in self.brain.store.get_tasks(tree_id)}
        assert rec.status is TreeStatus.DONE, tasks
        return rec

    def result(self, tree_id: str, task_id: str) -> Any:
        task = self.brain.store.get_task(tree_id, task_id)
        assert task is not None
        return task.result

    def state(self, tree_id: str, task_id: str) -> TaskState:
        task = self.brain.store.get_task(tree_id, task_id)
        assert task is not None
        return task.state


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """Every host made and its component started, once for the module: the tests below run
    in order, each leaving every host running again."""
    reason = _cannot_make_namespaces()
    if reason:
        pytest.skip(reason)
    hosts = Rehearsal(secrets.token_hex(3), tmp_path_factory.mktemp("hosts"))
    try:
        hosts.script("up", *HOSTS)
    except RuntimeError as exc:
        hosts.script("down")
        pytest.skip(f"this machine cannot make network namespaces: {exc}")
    brain: Brain | None = None
    try:
        hosts.start_redis()
        hosts.start_brain()
        brain = connect(hosts)
        hosts.start_pool("pool")
        hosts.start_pool("pool-batch")
        hosts.enroll_workstation()
        hosts.start_workstation()
        wait_until(lambda: connected(brain, "laptop"), WAIT_S, f"the agent:\n{hosts.log('workstation')}")
        yield Running(hosts, brain)
    finally:
        if brain is not None:
            brain.close()
        hosts.script("down")  # kills every process on the hosts, removes namespaces, links, bridge
        for procs in hosts.procs.values():
            for proc in procs:
                proc.wait(30)


def connect(hosts: Rehearsal) -> Brain:
    """The operator on the brain's host: the brain's settings and store (this process runs in the
    root namespace, which reaches every host through the bridge)."""
    settings = load_settings(env=hosts.brain_env(), cwd=hosts.folder("brain"))

    def ready() -> Brain | None:
        try:
            return Brain.connect(settings, settings.redis_url or "")
        except BrainError:
            return None

    brain: Brain = wait_until(ready, WAIT_S, f"the brain to publish its registry:\n{hosts.log('brain')}")
    return brain


def connected(brain: Brain, client_id: str) -> bool:
    return bool(brain.hot.r.hexists(key_presence(), client_id))


MIXED = {
    "id": "mixed",
    "tasks": [
        {"id": "batch", "tool": "text_transform", "pool": "batch", "args": {"op": "upper", "text": "notes.txt"}},
        {"id": "name", "tool": "text_transform", "depends_on": ["batch"],
         "args": {"op": "lower", "text": "${tasks.batch.result}"}},
        {"id": "read", "tool": "read_local_file", "depends_on": ["name"], "args": {"path": "${tasks.name.result}"}},
        {"id": "shout", "tool": "text_transform", "depends_on": ["read"],
         "args": {"op": "upper", "text": "${tasks.read.result.content}"}},
    ],
}  # fmt: skip


def test_a_night_batch_and_a_client_tree_run_across_the_hosts(running: Running) -> None:
    night = yaml.safe_load((EXAMPLES / "night-batch.yaml").read_text())
    running.finish(running.submit(night))
    brief = (running.hosts.folder("workstation") / "sandbox" / "brief.txt").read_text()
    assert "KEPT ON THE LAPTOP" in brief

    tree_id = running.submit(MIXED)
    running.finish(tree_id)
    tasks = {t.task_id: t for t in running.brain.store.get_tasks(tree_id)}
    assert tasks["batch"].route == "server:batch"
    assert tasks["read"].client_id == "laptop"
    assert tasks["shout"].result == "KEPT ON THE LAPTOP\n"
    # The pools kept no store of their own: every result they ran reached the store through the brain.
    for host in ("pool", "pool-batch", "workstation"):
        assert not list(running.hosts.folder(host).rglob("*.db")), host


@pytest.mark.parametrize(("host", "pool"), [("pool", "default"), ("pool-batch", "batch")])
def test_a_pool_host_dies_mid_call_and_the_call_runs_again_when_it_is_back(
    running: Running, host: str, pool: str
) -> None:
    slow: dict[str, Any] = {"id": "slow", "tool": "sleep", "args": {"seconds": 3}}
    if pool != "default":
        slow["pool"] = pool
    after = {
        "id": "after",
        "tool": "text_transform",
        "depends_on": ["slow"],
        "args": {"op": "upper", "text": "x"},
    }
    tree_id = running.submit({"id": f"dies-{host}", "tasks": [slow, after]})
    r = running.brain.hot.r
    wait_until(lambda: r.hexists(key_tree_running(tree_id), "slow"), WAIT_S, f"the call to start on {host}")
    running.hosts.kill(host)
    # A clear state: the tree waits, and status names the pool nobody serves and what to start.
    alarm = f"pool '{pool}': 1 call(s) waiting"
    wait_until(lambda: running.alarm(alarm), WAIT_S, f"status to say {alarm!r}:\n{running.status().stdout}")
    assert running.brain.store.get_tree(tree_id).status is TreeStatus.RUNNING  # type: ignore[union-attr]
    running.hosts.start_pool(host)
    running.finish(tree_id)
    assert running.result(tree_id, "after") == "X"


def test_the_workstation_dies_and_its_work_waits_for_it(running: Running) -> None:
    hosts = running.hosts
    hosts.kill("workstation")
    wait_until(lambda: not connected(running.brain, "laptop"), WAIT_S, "the brain to see the agent gone")
    tree_id = running.submit(
        {"id": "notes", "tasks": [{"id": "read", "tool": "read_local_file", "args": {"path": "notes.txt"}}]}
    )
    # An autonomous run parks the call for any client of its user, and status says so.
    wait_until(lambda: running.state(tree_id, "read") is TaskState.PENDING_CLIENT, WAIT_S, "the call to park")
    alarm = "user 'demo': 1 task(s) parked"
    wait_until(lambda: running.alarm(alarm), WAIT_S, f"status to say {alarm!r}:\n{running.status().stdout}")
    hosts.start_workstation()
    running.finish(tree_id)
    assert running.result(tree_id, "read")["content"] == "kept on the laptop\n"


def test_the_brain_dies_and_results_wait_for_it_on_its_queue(running: Running) -> None:
    hosts = running.hosts
    hosts.kill("brain")
    # The pools have no store: the result of t0 goes to the brain as a record_result job and
    # waits on the brain's queue; nothing is recorded until a brain takes it.
    chain = [
        {"id": "t0", "tool": "text_transform", "args": {"op": "upper", "text": "a"}},
        {"id": "t1", "tool": "text_transform", "depends_on": ["t0"], "args": {"op": "lower", "text": "${tasks.t0.result}"}},
    ]  # fmt: skip
    tree_id = running.submit({"id": "headless", "tasks": chain})
    r = running.brain.hot.r
    wait_until(lambda: r.llen(BRAIN_QUEUE) > 0, WAIT_S, "t0's result to wait on the brain's queue")
    assert running.state(tree_id, "t0") is not TaskState.DONE
    hosts.start_brain()
    running.finish(tree_id)
    assert running.result(tree_id, "t1") == "a"


def test_redis_dies_and_every_host_comes_back_when_it_restarts_from_its_aof(running: Running) -> None:
    hosts = running.hosts
    hosts.kill("redis")
    # A clear state: the operator's status says which Redis it cannot reach (its password hidden).
    said = " ".join(running.status().stdout.split())
    assert f"cannot reach Redis at redis://vt-brain:***@{hosts.addr('redis')}:{REDIS_PORT}/0" in said, said
    hosts.start_redis()  # the same data dir: its AOF and the ACL file the brain saved
    # Every component reconnects by itself: a tree over both pools and the workstation ends.
    tree_id = running.submit(MIXED)
    running.finish(tree_id)
    assert running.result(tree_id, "shout") == "KEPT ON THE LAPTOP\n"
