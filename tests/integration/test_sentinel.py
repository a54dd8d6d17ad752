"""Redis Sentinel everywhere (issue 28 item 1): Debian's redis-server and redis-sentinel, one
primary, one replica and three sentinels (tests/fixtures/sentinel.py); the primary SIGKILLed.

Every component connects with kombu's ``sentinel://...;sentinel://...`` URL through
workers.redis_connect and follows the promoted replica without a restart. Redis replicates
no ACL change: the brain sends each to every node (brain.hot.acl.on_every_node), so a
client enrolled before the failover gets in afterwards and a revoked one stays out.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from redis.sentinel import MasterNotFoundError

from brain.core.models import SessionKind, TaskState, TreeStatus
from brain.hot.acl import AclUsers, client_username
from brain.hot.presence import PresenceBook
from brain.runtime.enrollment import enroll
from brain.runtime.service import Brain
from brain.stack.children import dies_with_this_process
from brain.stack.embedded import Service, agent_env, stack_env
from brain.store.sqlite import SQLiteStore
from client_agent.status import check_enrollment
from tests.conftest import (
    agent_with_servers,
    make_settings,
    tree,
    wait_for_tree,
    wait_until,
    write_mcp_config,
)
from tests.fixtures.sentinel import SentinelSet, SentinelStack, sentinel_set  # noqa: F401 - the fixture
from tests.integration.test_cli import vancetope
from tests.integration.test_gateway import mcp_client, start_gateway, token_for
from tests.integration.test_schedules_stack import runs_by, write_tree
from workers.contracts import client_key
from workers.redis_connect import async_redis_client, every_node, redis_client
from workers.urls import parse_sentinel_url, url_password, with_credentials

pytestmark = pytest.mark.integration


def test_a_revoked_client_stays_out_and_an_enrolled_one_gets_in_after_a_failover(
    tmp_path: Path,
    sentinel_set: SentinelSet,  # noqa: F811 - the fixture
) -> None:
    admin = redis_client(sentinel_set.url, socket_timeout=5)
    store = SQLiteStore(tmp_path / "store.db")
    try:
        book = PresenceBook(admin, store)
        laptop = enroll(book, "laptop", "ada", sentinel_set.url)
        desk = enroll(book, "desk", "ada", sentinel_set.url)
        # What `clients enroll` prints: kombu's form, the client's own user on every part.
        target = parse_sentinel_url(laptop.broker_url)
        assert target.sentinels == parse_sentinel_url(sentinel_set.url).sentinels
        assert laptop.broker_url.count(f"{client_username('laptop')}:") == 3
        AclUsers(admin).revoke("desk")
        store.delete_enrollment("desk")
        # Both nodes hold the same users (Redis 7.0's refused CLIENT SETINFO grant dropped there).
        nodes = every_node(admin)
        assert len(nodes) == 2
        assert all(AclUsers(n).client_users() == {"laptop"} for n in nodes)
        # A revocation that missed the replica (it was away): the brain's sync, run every
        # reconcile sweep, finds the user there and deletes it before the replica is promoted.
        nodes[1].execute_command("ACL", "SETUSER", client_username("desk"), "on", ">back-door", "+ping")
        # The same on a sentinel, as a user of the sentinels (they replicate no ACL change either).
        with sentinel_set.sentinels[2].client() as sentinel:
            sentinel.execute_command("ACL", "SETUSER", client_username("desk"), "on", ">back-door", "+ping")
        AclUsers(admin).sync(store.list_enrollments())
        assert AclUsers(nodes[1]).client_users() == {"laptop"}
        for s in sentinel_set.sentinels:
            with s.client() as sentinel:
                assert AclUsers(sentinel).client_users() == {"laptop"}
        for node in nodes:
            node.close()

        old = sentinel_set.kill_primary()
        sentinel_set.wait_failover(old)

        own = redis_client(laptop.broker_url, socket_timeout=5)
        own.lpush(client_key("laptop", "probe"), b"x")  # its own keys, on the promoted replica
        with pytest.raises(redis.exceptions.NoPermissionError):
            own.get("vt:registry")  # and nothing else
        # The revoked client: refused by the sentinels (it cannot even learn where the master
        # is) and by the promoted master itself.
        with pytest.raises(MasterNotFoundError, match="invalid username-password"):
            redis_client(desk.broker_url, socket_timeout=5).ping()
        desk_login = {"username": client_username("desk"), "password": url_password(desk.broker_url)}
        with pytest.raises(redis.AuthenticationError), sentinel_set.master().client(**desk_login) as direct:
            direct.ping()
        own.close()

        async def own_async() -> int:
            # The gateway's asyncio client follows the failover the same way.
            client = async_redis_client(laptop.broker_url, socket_timeout=5)
            try:
                return int(await client.lpush(client_key("laptop", "probe"), b"y"))
            finally:
                await client.aclose()

        assert asyncio.run(own_async()) == 2
    finally:
        store.close()
        admin.close()


# The bound from the primary's death to the first task dispatched after it.
FAILOVER_TO_DISPATCH_S = 30.0


@pytest.fixture
def sentinel_stack(
    tmp_path: Path,
    sentinel_set: SentinelSet,  # noqa: F811 - the fixture
) -> Iterator[SentinelStack]:
    """Brain, server pool, Celery beat (schedule "tick", every 2 s) and client agent "laptop"
    (user ada) on the Sentinel set's URL."""
    write_tree(tmp_path, "tick", "{id: hello, tool: echo, args: {value: tick}}")
    (tmp_path / "vancetope.toml").write_text(
        '[[schedules]]\nname = "tick"\ntree = "tick.yaml"\nevery_s = 2\n'
    )
    (tmp_path / "laptop").mkdir()
    agent = agent_with_servers(tmp_path / "laptop", {})
    (tmp_path / "laptop" / "sandbox" / "notes.txt").write_text("kept on the laptop\n")
    settings = make_settings(
        tmp_path,
        redis_url=sentinel_set.url,
        agent_config=agent,
        mcp_config=write_mcp_config(tmp_path / "server-mcp.json", {}),
        visibility_timeout_s=10,
    )
    stack = SentinelStack(settings, only=("brain", "server-pool", "beat", "client-agent"))
    try:
        yield stack.start()
    finally:
        stack.stop()


def cli(stack: SentinelStack, *args: str) -> str:
    """`vancetope ARGS` pointed at the Sentinel URL (VANCETOPE_REDIS_URL), as an operator runs it."""
    proc = vancetope(*args, data=stack.settings.data_dir, env=stack_env(stack.settings, stack.redis_url))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def start_desk(stack: SentinelStack, folder: Path) -> None:
    """Enroll client "desk" of ada with `vancetope clients enroll` and start its agent (a process
    of its own, as on a second workstation) with the URL it printed."""
    folder.mkdir()
    config = agent_with_servers(folder, {})
    config.write_text(config.read_text().replace('client_id = "laptop"', 'client_id = "desk"'))
    (folder / "sandbox" / "notes.txt").write_text("kept on the desk\n")
    line = cli(stack, "clients", "enroll", "desk", "--user", "ada").strip()
    variable, url = line.split("=", 1)
    assert variable == "VANCETOPE_AGENT_BROKER_URL"
    # kombu's Sentinel form, the client's own user on every part.
    assert url.startswith("sentinel://vtc-desk:") and url.count("vtc-desk:") == 3
    argv = [sys.executable, "-m", "client_agent", "run", "--config", str(config)]
    log_path = stack.settings.data_dir / "logs" / "desk-agent.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            dies_with_this_process(argv), env=agent_env(url), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    stack.services.append(Service("desk-agent", argv, proc, log_path))


def main_tree() -> Any:
    """Server sleeps and client reads side by side, then a chain of sleeps and reads that is
    dispatched one hop at a time: it is still being dispatched when the primary dies."""
    layer = [{"id": f"w{i}", "tool": "sleep", "args": {"seconds": 1.0}} for i in range(3)]
    reads = [{"id": f"r{i}", "tool": "read_local_file", "args": {"path": "notes.txt"}} for i in range(2)]
    chain: list[dict[str, Any]] = []
    previous = [t["id"] for t in layer + reads]
    for i in range(6):
        step = (
            {"id": f"c{i}", "tool": "sleep", "args": {"seconds": 1.0}}
            if i % 2 == 0
            else {"id": f"c{i}", "tool": "read_local_file", "args": {"path": "notes.txt"}}
        )
        chain.append({**step, "depends_on": previous})
        previous = [step["id"]]
    return tree({"id": "failover", "tasks": [*layer, *reads, *chain]})


def parked_tree() -> Any:
    return tree(
        {
            "id": "parked",
            "tasks": [
                {"id": f"p{i}", "tool": "read_local_file", "args": {"path": "notes.txt"}} for i in range(3)
            ],
        }
    )


def test_the_primary_killed_mid_tree_fails_over_and_the_tree_ends_done_each_task_once(
    tmp_path: Path,
    sentinel_set: SentinelSet,  # noqa: F811 - the fixture
    sentinel_stack: SentinelStack,
    brain_factory: Callable[[SentinelStack], Brain],
) -> None:
    stack = sentinel_stack
    brain = brain_factory(stack)
    gateway = start_gateway(stack)  # the MCP gateway too must follow the failover by itself
    laptop_agent = stack.service("client-agent").process
    assert laptop_agent is not None
    # Parked work: calls bound to a client known but not running yet (enrolled with its
    # credential after the failover, by the CLI).
    brain.scheduler.presence.enroll("desk", "ada")
    parked = brain.scheduler.submit(parked_tree(), client_id="desk", user="ada")
    assert brain.scheduler.parked.waiting() == {"client:desk": 3}
    rec = brain.scheduler.submit(main_tree(), client_id="laptop", user="ada", session=SessionKind.AUTONOMOUS)

    def dispatched() -> set[str]:
        return {t.task_id for t in brain.store.get_tasks(rec.tree_id) if t.run_id is not None}

    # Mid-tree: the first layer done or running, the chain not yet dispatched.
    wait_until(lambda: {"w0", "r0"} <= dispatched(), timeout=120, what="the first layer to be dispatched")
    before = dispatched()
    assert not {"c3", "c4", "c5"} & before, before

    old = sentinel_set.kill_primary()
    killed_at = time.time()
    sentinel_set.wait_failover(old)
    failed_over_at = time.time()

    def new_dispatches() -> list[float]:
        """When the brain dispatched each task it had not dispatched before the kill (its clock,
        as the store records it: the test's own polling on a loaded machine is not measured)."""
        tasks = brain.store.get_tasks(rec.tree_id)
        return [t.queued_at for t in tasks if t.task_id not in before and t.run_id and t.queued_at]

    first = min(wait_until(new_dispatches, timeout=120, what="a dispatch after the failover"))
    to_first_dispatch = first - killed_at
    print(f"failover to first new dispatch: {to_first_dispatch:.1f} s")
    assert to_first_dispatch <= FAILOVER_TO_DISPATCH_S

    start_desk(stack, tmp_path / "desk")  # the parked work's client comes after the failover
    done = wait_for_tree(brain, rec.tree_id, timeout=180)
    tasks = brain.store.get_tasks(rec.tree_id)
    assert done.status is TreeStatus.DONE, {t.task_id: (t.state.value, t.reason) for t in tasks}
    assert sorted(t.task_id for t in tasks) == sorted(t.id for t in main_tree().tasks)  # each recorded once
    assert all(t.state is TaskState.DONE and t.result is not None for t in tasks)
    reads = [t for t in tasks if t.tool == "read_local_file"]
    assert {t.client_id for t in reads} == {"laptop"}
    # A call re-executed is one whose message the failover lost and the reconciler re-sent:
    # counted by its deliveries, never more than max_deliveries.
    resent = {t.task_id: t.deliveries for t in tasks if t.deliveries > 1}
    print(f"re-delivered after the failover: {resent or 'none'}")
    assert all(d <= stack.settings.max_deliveries for d in resent.values())
    # The laptop's agent followed the failover by itself: the same process, no restart.
    assert laptop_agent.poll() is None

    parked_done = wait_for_tree(brain, parked.tree_id, timeout=120)
    parked_tasks = brain.store.get_tasks(parked.tree_id)
    assert parked_done.status is TreeStatus.DONE, {t.task_id: (t.state.value, t.reason) for t in parked_tasks}
    assert {t.client_id for t in parked_tasks} == {"desk"} and len(parked_tasks) == 3
    # The CLI reads the trees through the promoted replica too, and the gateway submits there.
    assert json.loads(cli(stack, "status", rec.tree_id, "--json"))["status"] == "done"
    # `submit-url` prints the Sentinel form with the submitter's own user, let in by the new master.
    variable, submit_url = cli(stack, "submit-url", "--user", "ada").strip().split("=", 1)
    assert variable == "VANCETOPE_SUBMIT_URL" and submit_url.count("vts-ada:") == 3
    submitter = redis_client(submit_url, socket_timeout=5)
    assert submitter.ping() and submitter.llen("submit.ada") == 0
    submitter.close()
    token = token_for(stack, "ada")

    async def through_the_gateway() -> Any:
        async with mcp_client(gateway, token) as mcp:
            return await mcp.call_tool("echo", {"value": {"after": "failover"}})

    echoed = anyio.run(through_the_gateway)
    assert echoed.is_error is False and echoed.structured_content == {"after": "failover"}
    # Celery beat followed the failover too: a schedule run fired after it ends done.
    wait_until(
        lambda: any(
            r.status is TreeStatus.DONE and r.submitted_at > failed_over_at for r in runs_by(brain, "tick")
        ),
        timeout=120,
        what="a scheduled run fired after the failover",
    )


def test_a_workstations_credential_may_only_ask_the_sentinels_where_the_master_is(
    tmp_path: Path,
    sentinel_set: SentinelSet,  # noqa: F811 - the fixture
) -> None:
    """An attacker who owns a workstation has its `sentinel://` URL. A sentinel that took its
    commands could be told to monitor a master of the attacker's, which would then collect the
    password of every component that reconnects (vt-brain's: the whole stack). Seen on Redis
    7.0.15 before sentinel users existed. Now each sentinel knows the client only as a user that
    may find the master, kept there by the brain (and written to the sentinel's config file)."""
    admin = redis_client(sentinel_set.url, socket_timeout=5)
    store = SQLiteStore(tmp_path / "store.db")
    try:
        laptop = enroll(PresenceBook(admin, store), "laptop", "ada", sentinel_set.url)
        login = {"username": client_username("laptop"), "password": url_password(laptop.broker_url)}
        master = sentinel_set.master_port()
        hostile = (
            ("SENTINEL", "REMOVE", "mymaster"),
            ("SENTINEL", "MONITOR", "evil", "127.0.0.1", "1", "1"),
            ("SENTINEL", "SET", "mymaster", "auth-pass", "x"),
            ("SENTINEL", "FAILOVER", "mymaster"),
            ("SENTINEL", "RESET", "*"),
            ("SENTINEL", "CONFIG", "SET", "resolve-hostnames", "yes"),
            ("SENTINEL", "FLUSHCONFIG"),
            ("ACL", "SETUSER", "evil", "on", ">x", "+@all"),
            ("ACL", "LIST"),
            ("CLIENT", "KILL", "TYPE", "normal"),
            ("SHUTDOWN",),
        )
        for node in sentinel_set.sentinels:
            with node.client(**login) as sentinel:
                assert sentinel.sentinel_get_master_addr_by_name("mymaster")[1] == master
                assert sentinel.sentinel_masters()["mymaster"]["port"] == master  # what redis-py asks
                for command in hostile:
                    with pytest.raises(redis.exceptions.NoPermissionError):
                        sentinel.execute_command(*command)
            with node.client() as anyone, pytest.raises(redis.AuthenticationError):
                anyone.execute_command("AUTH", "default", "")  # no default user to fall back on
            anonymous = redis.Redis(port=node.port, socket_timeout=5)
            with (
                anonymous,
                pytest.raises(
                    redis.exceptions.AuthenticationError, match="authenticated|Authentication required"
                ),
            ):
                anonymous.execute_command("SENTINEL", "REMOVE", "mymaster")
            # A component's own user is no stronger there: the pool's may not move the master,
            # nor the brain's directly (it may make users, so it is trusted as on the nodes).
            for user in ("vt-pool", "vt-brain"):
                pool_login = {"username": user, "password": url_password(sentinel_set.url_for(user))}
                with node.client(**pool_login) as sentinel, pytest.raises(redis.exceptions.NoPermissionError):
                    sentinel.execute_command("SENTINEL", "MONITOR", "evil", "127.0.0.1", "1", "1")
        assert sentinel_set.master_port() == master  # nothing moved

        # A sentinel restarted keeps the client's user (the brain's SENTINEL FLUSHCONFIG wrote it
        # into its config file): the workstation finds the master through it alone.
        back = sentinel_set.restart_sentinel(0)
        only_it = with_credentials(f"sentinel://127.0.0.1:{back.port}", login["username"], login["password"])
        own = redis_client(only_it, socket_timeout=5)
        assert own.lpush(client_key("laptop", "probe"), b"x") == 1
        own.close()
        # Revoked: gone from every sentinel too, so the URL no longer finds a master.
        AclUsers(admin).revoke("laptop")
        for node in sentinel_set.sentinels:
            with node.client() as sentinel:
                assert AclUsers(sentinel).client_users() == set()
        # To the agent that is a refused credential (it stops: not enrolled, or revoked), not an
        # outage to wait out.
        with pytest.raises(redis.AuthenticationError, match="invalid username-password"):
            redis_client(laptop.broker_url, socket_timeout=5).ping()
        enrollment = check_enrollment(laptop.broker_url)
        assert enrollment.enrolled is False and "not enrolled or revoked" in enrollment.detail
    finally:
        store.close()
        admin.close()
