"""A multi-host rehearsal on one machine (issue 28, item 3).

deploy/multihost.sh makes one network namespace per host, each with its own address on a
bridge of its own (and its own hostname). Each component runs in its host's namespace from a
folder of its own, with only the other hosts' addresses and its own credential:

- Redis with Sentinel: the primary on ``redis-a``, its replica on ``redis-b``, three sentinels
  (one on each Redis host, one on ``sentinel``), locked down as tests/fixtures/sentinel.py and
  docs/configuration.md say (no default user; each component the same user on the sentinels
  as on the nodes). Every component is given kombu's ``sentinel://`` URL with its own user:
  the brains ``vt-brain``, the pools ``vt-pool``, the gateway ``vt-gateway``, the workstation
  the user ``clients enroll`` made for it;
- two brains, ``vancetope brain`` on ``brain-a`` and on ``brain-b``;
- the default pool and pool ``batch`` (no store: MongoDB cannot run here, so they record
  through the brains, docs/pools.md);
- the MCP gateway, ``vancetope gateway`` on ``gateway``;
- a workstation with a real ``vancetope-agent run``.

One deviation from "no component sees another's files", stated in docs/deployment.md too: the
store is SQLite (MongoDB cannot run here), and a SQLite file cannot be reached over the
network. Both brains open the same file (brain-a's folder, ``store/vancetope.db``) and the
gateway reads it (read-only, as it opens any store): the namespaces separate the network, not
the filesystem. With MongoDB each would get the store's address and its own user instead.

A night batch, a client tree and calls through the gateway run across the hosts; then each
host dies in turn (SIGKILL to everything on it): a pool, a named pool, the workstation, the
gateway, each brain (the other carries the tree, nothing twice), the third sentinel's host,
the replica's host with its sentinel, and the Redis primary's host with its sentinel (the
other two fail over to the replica, every component follows without a restart). Each time the trees end done, each task recorded once.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import redis
import yaml

from brain.config import load_settings
from brain.core.models import TaskState, TreeRecord, TreeStatus
from brain.errors import BrainError
from brain.hot.acl import new_secret
from brain.runtime.service import Brain
from brain.stack.redis_server import ADMIN_USER, RedisLimits
from tests.conftest import EXAMPLES, ROOT, tree, wait_for_tree, wait_until
from tests.fixtures.sentinel import (
    MASTER,
    SENTINEL_USER,
    SetSecrets,
    node_acl_lines,
    redis_version,
    replication_args,
    sentinel_binaries,
    sentinel_conf,
)
from tests.integration.test_gateway import mcp_client, text_of, wait_served
from workers.contracts import key_presence, key_tree_running
from workers.urls import with_credentials

SCRIPT = ROOT / "deploy" / "multihost.sh"
REDIS_HOSTS = ("redis-a", "redis-b")  # the primary's, then the replica's
SENTINEL_HOSTS = ("redis-a", "redis-b", "sentinel")
BRAIN_HOSTS = ("brain-a", "brain-b")
HOSTS = (*REDIS_HOSTS, "sentinel", *BRAIN_HOSTS, "pool", "pool-batch", "gateway", "workstation")
REDIS_PORT, SENTINEL_PORT, GATEWAY_PORT = 6379, 26379, 8765
# Generous: a pool killed mid-call gives its call back within visibility_timeout_s + 5 s; a
# failover takes the sentinels' down-after (1 s) and election, then each consumer's reconnect.
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
    addresses: dict[str, str] = field(default_factory=dict)
    secrets: SetSecrets = field(
        default_factory=lambda: SetSecrets(new_secret(), new_secret(), new_secret()), repr=False
    )

    def script(self, *args: str) -> str:
        done = subprocess.run(
            [str(SCRIPT), args[0], self.id, *args[1:]],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"multihost.sh {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def addr(self, host: str) -> str:
        if host not in self.addresses:  # a host keeps its address while the rehearsal lasts
            self.addresses[host] = self.script("addr", host)
        return self.addresses[host]

    def folder(self, host: str) -> Path:
        path = self.root / host
        path.mkdir(parents=True, exist_ok=True)
        return path

    def sentinel_address(self) -> str:
        """kombu's form, as the Redis hosts' operator hands it out, without a credential."""
        return ";".join(f"sentinel://{self.addr(h)}:{SENTINEL_PORT}" for h in SENTINEL_HOSTS)

    def url_for(self, component: str) -> str:
        """What the Redis hosts' operator hands each component: its own user and secret."""
        return with_credentials(self.sentinel_address(), component, self.secrets.components[component])

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
        for proc in self.procs.pop(host, []):
            proc.wait(30)

    def alive(self, host: str) -> bool:
        return any(proc.poll() is None for proc in self.procs.get(host, []))

    def log(self, host: str) -> str:
        path = self.folder(host) / "host.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    # --- Redis with Sentinel ----------------------------------------------------------

    def start_redis_node(self, host: str, replica_of: str | None = None) -> None:
        """A data node on ``host``: its users, AOF and limits as compose.sentinel.yaml's;
        ``replica_of`` (a host) makes it a replica. A restart keeps its ACL file, with the
        client users the brain saved into it."""
        server = sentinel_binaries()[0]
        where = self.folder(host)
        acl = where / "users.acl"
        if not acl.exists():
            acl.write_text("\n".join(node_acl_lines(redis_version(server), self.secrets)) + "\n")
        follow = ["--replicaof", self.addr(replica_of), str(REDIS_PORT)] if replica_of else []
        argv = [
            server, "--bind", self.addr(host), "--port", str(REDIS_PORT),
            "--dir", str(where), "--appendonly", "yes", "--appendfsync", "everysec",
            "--maxmemory-policy", "noeviction", *RedisLimits().args(), "--save", "",
            "--aclfile", str(acl), "--daemonize", "no", "--logfile", str(where / "redis.log"),
            *replication_args(self.secrets), *follow,
        ]  # fmt: skip
        self.start(host, argv, {})

    def start_sentinel(self, host: str, master: str) -> None:
        """A sentinel on ``host`` watching ``master`` (a host). Restarted, it keeps the config
        file it rewrote (the current master, its peers, the users the brain flushed there)."""
        where = self.folder(host) / "sentinel"
        where.mkdir(exist_ok=True)
        conf = where / "sentinel.conf"
        if not conf.exists():
            master_at = (self.addr(master), REDIS_PORT)
            conf.write_text(sentinel_conf(self.addr(host), SENTINEL_PORT, where, master_at, self.secrets))
        self.start(host, [sentinel_binaries()[1], str(conf)], {})

    def node(self, host: str) -> redis.Redis:
        return redis.Redis(
            host=self.addr(host), port=REDIS_PORT, username=ADMIN_USER, password=self.secrets.admin,
            socket_timeout=5, socket_connect_timeout=1, decode_responses=True,
        )  # fmt: skip

    def sentinel(self, host: str) -> redis.Redis:
        return redis.Redis(
            host=self.addr(host), port=SENTINEL_PORT, username=SENTINEL_USER, password=self.secrets.sentinel,
            socket_timeout=5, socket_connect_timeout=1, decode_responses=True,
        )  # fmt: skip

    def master_host(self) -> str | None:
        """The host the live sentinels agree is the master's, with a live master there."""
        named = set()
        for host in SENTINEL_HOSTS:
            if not self.alive(host):
                continue
            try:
                with self.sentinel(host) as s:
                    named.add(s.sentinel_get_master_addr_by_name(MASTER)[0])
            except (redis.RedisError, TypeError):
                return None
        if len(named) != 1:
            return None
        address = named.pop()
        master = next((h for h in REDIS_HOSTS if self.addr(h) == address), None)
        if master is None:
            return None
        try:
            with self.node(master) as n:
                return master if n.info("replication").get("role") == "master" else None
        except redis.RedisError:
            return None

    def sentinels_ready(self) -> bool:
        """Every node up, the replica in sync, every sentinel knowing the replica and two peers."""
        master = self.master_host()
        if master is None:
            return False
        try:
            for host in REDIS_HOSTS:
                if host != master:
                    with self.node(host) as n:
                        if n.info("replication").get("master_link_status") != "up":
                            return False
            for host in SENTINEL_HOSTS:
                with self.sentinel(host) as s:
                    if len(s.sentinel_slaves(MASTER)) < 1 or len(s.sentinel_sentinels(MASTER)) < 2:
                        return False
        except redis.RedisError:
            return False
        return True

    def wait_sentinels(self) -> None:
        logs = "\n".join(self.log(h) for h in SENTINEL_HOSTS)
        wait_until(self.sentinels_ready, WAIT_S, f"the replica to sync and three sentinels to agree:\n{logs}")

    # --- the stack's hosts ------------------------------------------------------------

    def store_url(self) -> str:
        """The one SQLite file both brains and the gateway open (the deviation the module
        docstring states): in brain-a's folder."""
        path = self.folder("brain-a") / "store"
        path.mkdir(exist_ok=True)
        return f"sqlite:///{path / 'vancetope.db'}"

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
            "VANCETOPE_REDIS_SENTINEL_MASTER": MASTER,
            "VANCETOPE_REGISTRY": str(where / "registry.yaml"),
            "VANCETOPE_MCP_CONFIG": str(where / "server-mcp.json"),
            "VANCETOPE_POOLS": json.dumps([{"name": "batch", "concurrency": 1}]),
            "VANCETOPE_VISIBILITY_TIMEOUT_S": "10",
            "VANCETOPE_RECONCILE_INTERVAL_S": "1",
            "VANCETOPE_RECONCILE_GRACE_S": "2",
            "VANCETOPE_MCP_SANDBOX": "none",
            **extra,
        }

    def brain_env(self, host: str = "brain-a") -> dict[str, str]:
        return self.stack_env(
            host, "vt-brain",
            VANCETOPE_STORE_URL=self.store_url(),
            VANCETOPE_AGENT_BROKER_URL=self.sentinel_address(),
            VANCETOPE_USER="demo",
        )  # fmt: skip

    def start_brains(self, *hosts: str) -> None:
        """``vancetope brain`` on each of ``hosts``, once each says it is ready."""
        log = {host: self.folder(host) / "host.log" for host in hosts}
        since = {host: log[host].stat().st_size if log[host].exists() else 0 for host in hosts}
        for host in hosts:
            self.start(host, ["vancetope", "brain"], self.brain_env(host))

        for host in hosts:

            def ready(host: str = host) -> bool:
                with open(log[host], "rb") as out:
                    out.seek(since[host])
                    return b"brain ready" in out.read()

            wait_until(ready, WAIT_S, f"the brain on {host}:\n{self.log(host)}")

    def start_pool(self, host: str) -> None:
        # No store on a pool host (MongoDB cannot run here): the store URL names brain-a's
        # host, where nothing answers, so the pool records through the brains.
        store = f"mongodb://{self.addr('brain-a')}:27017/vancetope?serverSelectionTimeoutMS=300&connectTimeoutMS=300"
        argv = ["vancetope", "worker"] + (["--pool", "batch"] if host == "pool-batch" else [])
        self.start(host, argv, self.stack_env(host, "vt-pool", VANCETOPE_STORE_URL=store))

    def gateway_url(self) -> str:
        return f"http://{self.addr('gateway')}:{GATEWAY_PORT}/mcp"

    def start_gateway(self) -> None:
        env = self.stack_env("gateway", "vt-gateway", VANCETOPE_STORE_URL=self.store_url())
        argv = ["vancetope", "gateway", "--host", self.addr("gateway"), "--port", str(GATEWAY_PORT)]
        self.start("gateway", argv, env)
        wait_served(self.gateway_url(), WAIT_S)

    def gateway_token(self) -> str:
        """`vancetope users token demo` on brain-a's host, handed to the MCP client."""
        done = self.run("brain-a", ["vancetope", "users", "token", "demo"], self.brain_env())
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split("VANCETOPE_GATEWAY_TOKEN=", 1)[1].split()[0]

    def enroll_workstation(self) -> None:
        """`clients enroll` on brain-a's host; its credential file is copied to the workstation."""
        brain_dir = self.folder("brain-a")
        argv = ["vancetope", "clients", "enroll", "laptop", "--user", "demo", "--output", "laptop.credential"]
        done = self.run("brain-a", argv, self.brain_env())
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
    token: str

    def status(self) -> subprocess.CompletedProcess[str]:
        """`vancetope status` on brain-a's host, as its operator runs it."""
        return self.hosts.run("brain-a", ["vancetope", "status"], self.hosts.brain_env())

    def alarm(self, line: str) -> str | None:
        """Status's output once it raises the alarm ``line`` (work waiting, nobody consuming)."""
        out = self.status().stdout
        return out if "nobody consuming" in out and line in " ".join(out.split()) else None

    def submit(self, data: dict[str, Any]) -> str:
        return self.brain.scheduler.submit(tree(data), user="demo").tree_id

    def finish(self, tree_id: str) -> TreeRecord:
        """The tree ends done, each of its tasks recorded once (one record per task id, done,
        never delivered more than max_deliveries)."""
        rec = wait_for_tree(self.brain, tree_id, WAIT_S)
        tasks = self.brain.store.get_tasks(tree_id)
        assert rec.status is TreeStatus.DONE, {t.task_id: (t.state.value, t.error) for t in tasks}
        ids = [t.task_id for t in tasks]
        assert sorted(ids) == sorted(t.id for t in rec.tree.tasks), ids
        assert all(t.state is TaskState.DONE for t in tasks)
        assert all(t.deliveries <= self.brain.settings.max_deliveries for t in tasks), {
            t.task_id: t.deliveries for t in tasks
        }
        return rec

    def result(self, tree_id: str, task_id: str) -> Any:
        task = self.brain.store.get_task(tree_id, task_id)
        assert task is not None
        return task.result

    def state(self, tree_id: str, task_id: str) -> TaskState:
        task = self.brain.store.get_task(tree_id, task_id)
        assert task is not None
        return task.state

    def through_the_gateway(self) -> tuple[str, str]:
        """An MCP client's calls through the gateway host: a server built-in and the
        workstation's file (texts of their results)."""
        sandbox = self.hosts.folder("workstation") / "sandbox"

        async def calls() -> tuple[str, str]:
            async with mcp_client(self.hosts.gateway_url(), self.token) as mcp:
                echoed = await mcp.call_tool("echo", {"value": {"via": "gateway"}})
                read = await mcp.call_tool("read_local_file", {"path": str(sandbox / "notes.txt")})
                assert not echoed.is_error and not read.is_error, (text_of(echoed), text_of(read))
                return text_of(echoed), text_of(read)

        return anyio.run(calls)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """Every host made and its component started, once for the module: the tests below run
    in order, each leaving every host running again."""
    reason = _cannot_make_namespaces()
    if reason:
        pytest.skip(reason)
    sentinel_binaries()  # skips, saying why, without Debian's redis-sentinel
    hosts = Rehearsal(secrets.token_hex(3), tmp_path_factory.mktemp("hosts"))
    try:
        hosts.script("up", *HOSTS)
    except RuntimeError as exc:
        hosts.script("down")
        pytest.skip(f"this machine cannot make network namespaces: {exc}")
    brain: Brain | None = None
    try:
        hosts.start_redis_node("redis-a")
        hosts.start_redis_node("redis-b", replica_of="redis-a")
        for host in SENTINEL_HOSTS:
            hosts.start_sentinel(host, master="redis-a")
        hosts.wait_sentinels()
        hosts.start_brains(*BRAIN_HOSTS)
        brain = connect(hosts)
        hosts.start_pool("pool")
        hosts.start_pool("pool-batch")
        hosts.enroll_workstation()
        hosts.start_workstation()
        wait_until(lambda: connected(brain, "laptop"), WAIT_S, f"the agent:\n{hosts.log('workstation')}")
        token = hosts.gateway_token()
        hosts.start_gateway()
        yield Running(hosts, brain, token)
    finally:
        if brain is not None:
            brain.close()
        hosts.script("down")  # kills every process on the hosts, removes namespaces, links, bridge
        for procs in hosts.procs.values():
            for proc in procs:
                proc.wait(30)


def connect(hosts: Rehearsal) -> Brain:
    """The operator on brain-a's host: the brain's settings and store (this process runs in the
    root namespace, which reaches every host through the bridge)."""
    settings = load_settings(env=hosts.brain_env(), cwd=hosts.folder("brain-a"))

    def ready() -> Brain | None:
        try:
            return Brain.connect(settings, settings.redis_url or "")
        except BrainError:
            return None

    brain: Brain = wait_until(ready, WAIT_S, f"the brain to publish its registry:\n{hosts.log('brain-a')}")
    return brain


def connected(brain: Brain, client_id: str) -> bool:
    return bool(brain.hot.r.hexists(key_presence(), client_id))


MIXED_TASKS: list[dict[str, Any]] = [
        {"id": "batch", "tool": "text_transform", "pool": "batch", "args": {"op": "upper", "text": "notes.txt"}},
        {"id": "name", "tool": "text_transform", "depends_on": ["batch"],
         "args": {"op": "lower", "text": "${tasks.batch.result}"}},
        {"id": "read", "tool": "read_local_file", "depends_on": ["name"], "args": {"path": "${tasks.name.result}"}},
        {"id": "shout", "tool": "text_transform", "depends_on": ["read"],
         "args": {"op": "upper", "text": "${tasks.read.result.content}"}},
]  # fmt: skip
MIXED: dict[str, Any] = {"id": "mixed", "tasks": MIXED_TASKS}


def slow_mixed(tree_id: str) -> dict[str, Any]:
    """MIXED after a 3 s call on the default pool: long enough to kill a host in its middle."""
    first = {"id": "slow", "tool": "sleep", "args": {"seconds": 3}}
    return {"id": tree_id, "tasks": [first, {**MIXED_TASKS[0], "depends_on": ["slow"]}, *MIXED_TASKS[1:]]}


def test_a_night_batch_a_client_tree_and_gateway_calls_run_across_the_hosts(running: Running) -> None:
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
    echoed, read = running.through_the_gateway()
    assert json.loads(echoed) == {"via": "gateway"} and "kept on the laptop" in read
    # The pools kept no store of their own: every result they ran reached the store through a brain.
    for host in ("pool", "pool-batch", "workstation"):
        assert not list(running.hosts.folder(host).rglob("*.db")), host
    # Each host reaches the master from its own address as its own user, through the sentinels.
    hosts = running.hosts
    master = hosts.master_host()
    assert master == "redis-a"
    with hosts.node(master) as node:
        seen = {(c["user"], c["addr"].rsplit(":", 1)[0]) for c in node.client_list()}
    expected = {
        ("vt-brain", hosts.addr("brain-a")), ("vt-brain", hosts.addr("brain-b")),
        ("vt-pool", hosts.addr("pool")), ("vt-pool", hosts.addr("pool-batch")),
        ("vt-gateway", hosts.addr("gateway")), ("vtc-laptop", hosts.addr("workstation")),
    }  # fmt: skip
    assert expected <= seen, sorted(seen)
    # Two brains, each a Celery node named after its own host.
    nodes = {name for reply in running.brain.app.control.ping(timeout=5) for name in reply}
    assert {"brain@brain-a", "brain@brain-b"} <= nodes, nodes


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


def test_the_gateway_dies_the_trees_go_on_and_its_clients_come_back_when_it_restarts(
    running: Running,
) -> None:
    hosts = running.hosts
    hosts.kill("gateway")
    with pytest.raises(httpx2.TransportError):
        httpx2.post(hosts.gateway_url(), json={}, timeout=2)
    # Nothing else needs the gateway: a tree over both pools and the workstation ends.
    running.finish(running.submit(MIXED | {"id": "no-gateway"}))
    hosts.start_gateway()
    echoed, read = running.through_the_gateway()  # the same token: it lives in the store
    assert json.loads(echoed) == {"via": "gateway"} and "kept on the laptop" in read


@pytest.mark.parametrize("host", BRAIN_HOSTS)
def test_a_brain_host_dies_mid_tree_and_the_other_brain_carries_it(running: Running, host: str) -> None:
    hosts = running.hosts
    tree_id = running.submit(slow_mixed(f"orphan-{host}"))
    r = running.brain.hot.r
    wait_until(lambda: r.hexists(key_tree_running(tree_id), "slow"), WAIT_S, "the first call to start")
    hosts.kill(host)
    # Not restarted: the other brain records the pools' results and dispatches the rest (the
    # operator's Brain in this process runs no consumer and no sweep).
    running.finish(tree_id)
    assert running.result(tree_id, "shout") == "KEPT ON THE LAPTOP\n"
    assert running.brain.store.get_task(tree_id, "read").client_id == "laptop"  # type: ignore[union-attr]
    hosts.start_brains(host)


@pytest.mark.parametrize("host", ["sentinel", "redis-b"])
def test_a_sentinels_host_or_the_replicas_dies_and_the_trees_go_on(running: Running, host: str) -> None:
    hosts = running.hosts
    assert hosts.master_host() == "redis-a"
    hosts.kill(host)  # a sentinel; on redis-b the replica too
    # The components that ask the sentinels where the master is go to the two left.
    running.finish(running.submit(MIXED | {"id": f"without-{host}"}))
    if host == "redis-b":
        hosts.start_redis_node("redis-b", replica_of="redis-a")  # resyncs from the master
    hosts.start_sentinel(host, master="redis-a")  # on its own config file: the master, its peers
    hosts.wait_sentinels()


def test_the_redis_primarys_host_dies_mid_tree_and_every_host_follows_the_failover(running: Running) -> None:
    hosts = running.hosts
    assert hosts.master_host() == "redis-a"
    agent = hosts.procs["workstation"][-1]
    tree_id = running.submit(slow_mixed("failover"))
    r = running.brain.hot.r
    wait_until(lambda: r.hexists(key_tree_running(tree_id), "slow"), WAIT_S, "the first call to start")
    hosts.kill("redis-a")  # the primary and one of the three sentinels
    killed_at = time.monotonic()
    wait_until(lambda: hosts.master_host() == "redis-b", WAIT_S, "the two sentinels left to promote redis-b")
    print(f"promoted {time.monotonic() - killed_at:.1f} s after the kill")
    # Nobody restarted: the brains, pools, gateway and agent find the new master themselves.
    running.finish(tree_id)
    assert running.result(tree_id, "shout") == "KEPT ON THE LAPTOP\n"
    redelivered = {
        t.task_id: t.deliveries for t in running.brain.store.get_tasks(tree_id) if t.deliveries > 1
    }
    print(f"re-delivered after the failover: {redelivered or 'none'}")
    assert agent.poll() is None  # the same agent process, reconnected by itself
    echoed, read = running.through_the_gateway()
    assert json.loads(echoed) == {"via": "gateway"} and "kept on the laptop" in read
    # The old primary's host comes back as a replica of the new master, its sentinel with it.
    hosts.start_redis_node("redis-a", replica_of="redis-b")
    hosts.start_sentinel("redis-a", master="redis-b")
    hosts.wait_sentinels()
    assert hosts.master_host() == "redis-b"
    running.finish(running.submit(MIXED | {"id": "after-failover"}))
