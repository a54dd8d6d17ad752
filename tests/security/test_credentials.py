"""Issue 20 item 4 (H5, H6): each credential is bound to an identity and sized to its job.

Real redis-server, real brain, server pool and client agent (client "laptop" of user "ada":
the victim). The attacker holds a submit credential of user "mallory", or the gateway's own
Redis credential.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import kombu.exceptions
import pytest
import redis
from celery import Celery

import vancetope
from brain.core.models import TaskState
from brain.errors import StoreError
from brain.runtime import gateway_door as door
from brain.runtime import submitters
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack
from brain.stack.redis_server import RedisServer
from brain.store import open_store
from tests.conftest import agent_with_servers, make_settings, wait_until, write_mcp_config
from tests.integration.test_gateway import mcp_client, start_gateway, token_for
from tests.integration.test_parking import connect
from workers.contracts import key_presence
from workers.urls import with_credentials

pytestmark = pytest.mark.integration

READ_ADAS_FILE = {
    "id": "steal",
    "tasks": [{"id": "grab", "tool": "read_local_file", "args": {"path": "hello.txt"}}],
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    tmp = tmp_path_factory.mktemp("creds")
    agent = agent_with_servers(tmp, {})
    (tmp / "sandbox" / "hello.txt").write_text("ada's secret notes\n")
    settings = make_settings(
        tmp,
        agent_config=agent,
        mcp_config=write_mcp_config(tmp / "server-mcp.json", {}),
        max_unfinished_tasks_per_user=5,
    )
    running = EmbeddedStack(settings).start()
    assert running.wait_connected("laptop", 120)
    yield running
    running.stop()


@pytest.fixture
def vt(stack: EmbeddedStack) -> Iterator[vancetope.Vancetope]:
    with vancetope.connect(stack.settings, redis_url=stack.redis_url) as client:
        yield client


def credential(stack: EmbeddedStack, user: str) -> str:
    """The URL `vancetope submit-url --user U` prints."""
    assert stack.redis is not None
    store, r = open_store(stack.settings.store), redis.Redis.from_url(stack.redis.url)
    try:
        return with_credentials(
            stack.redis.url, submitters.submit_username(user), submitters.issue(store, r, user)
        )
    finally:
        store.close()
        r.close()


def send(url: str, queue: str, **kwargs: Any) -> None:
    app = Celery("attacker", broker=url, set_as_current=False)
    try:
        app.send_task(vancetope.SUBMIT_TREE_TASK, kwargs=kwargs, queue=queue)
    finally:
        app.close()


def brain_log(stack: EmbeddedStack) -> str:
    return (stack.settings.data_dir / "logs" / "brain.log").read_text()


def laptop_calls(vt: vancetope.Vancetope) -> list[str]:
    """Every task of every recorded tree that was ever sent to ada's client."""
    return [
        f"{t.tree_id}/{t.task_id}"
        for tree in vt.trees(200)
        for t in vt.brain.store.get_tasks(tree.tree_id)
        if t.client_id == "laptop"
    ]


def test_a_submit_credential_of_mallory_naming_ada_is_refused_and_adas_client_gets_no_call(
    stack: EmbeddedStack, vt: vancetope.Vancetope
) -> None:
    url = credential(stack, "mallory")
    attacker = redis.Redis.from_url(url)
    attacker.lpush("submit.mallory", b"\xff not a message")  # harms nothing: dropped, the next is served
    attacker.close()
    send(url, "submit.mallory", tree=READ_ADAS_FILE, user="ada", tree_id="forged-as-ada")
    # without a user field the tree is mallory's: it waits for a client of mallory's, never ada's
    send(url, "submit.mallory", tree=READ_ADAS_FILE, tree_id="as-mallory")
    wait_until(lambda: vt.brain.store.get_tree("as-mallory"), timeout=120, what="mallory's own tree")
    wait_until(
        lambda: (
            "it names user 'ada', but it came with the submit credential of user 'mallory'"
            in brain_log(stack)
        ),
        timeout=120,
        what="the refusal in the brain's log",
    )
    assert vt.brain.store.get_tree("forged-as-ada") is None
    own = vt.brain.store.get_tree("as-mallory")
    assert own is not None and own.user == "mallory"
    (grab,) = vt.brain.store.get_tasks("as-mallory")
    assert grab.state in (TaskState.BLOCKED, TaskState.PENDING_CLIENT) and grab.client_id is None
    assert laptop_calls(vt) == []
    vt.tree("as-mallory").cancel()
    # and its own queue is all it reaches: ada's queue, another user's look-alike, the client's
    attacker = redis.Redis.from_url(url)
    try:
        for forbidden in (
            lambda: attacker.lpush("submit.ada", b"{}"),
            lambda: attacker.lpush("submit.mallory2", b"{}"),
            lambda: attacker.lpush("client.laptop", b"{}"),
            lambda: attacker.lpop("submit.mallory"),
            lambda: attacker.scan(0),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                forbidden()
    finally:
        attacker.close()


def big_tree(tasks: int, arg_bytes: int = 8) -> dict[str, Any]:
    return {
        "id": "flood",
        "tasks": [{"id": f"t{i}", "tool": "echo", "args": {"value": "x" * arg_bytes}} for i in range(tasks)],
    }


def test_an_8mb_tree_of_100000_tasks_and_a_10001_task_tree_are_refused_at_the_door(
    stack: EmbeddedStack, vt: vancetope.Vancetope
) -> None:
    flood = big_tree(100_000, arg_bytes=30)
    with pytest.raises(vancetope.TreeRefused, match=r"over max_tree_bytes \(VANCETOPE_MAX_TREE_BYTES\)"):
        vt.submit(flood, user="mallory")
    over = big_tree(10_001)
    with pytest.raises(vancetope.TreeRefused, match=r"10,001 tasks, over max_tasks_per_tree"):
        vt.submit(over, user="mallory")
    # through a submit credential's queue too: logged, nothing recorded
    url = credential(stack, "mallory")
    # 11 MB as a message: Redis itself refuses it (proto-max-bulk-len is the message limit) and
    # hangs up; nothing reaches the queue
    with pytest.raises(kombu.exceptions.OperationalError, match="Connection reset|Broken pipe"):
        send(url, "submit.mallory", tree=flood, tree_id="flood-8mb")
    send(url, "submit.mallory", tree=big_tree(100_000, arg_bytes=2), tree_id="flood-5mb")
    wait_until(
        lambda: "over max_tree_bytes (VANCETOPE_MAX_TREE_BYTES) = 4,194,304" in brain_log(stack),
        timeout=120,
        what="the brain to refuse the 5 MB flood",
    )
    send(url, "submit.mallory", tree=over, tree_id="over-limit")
    wait_until(
        lambda: (
            "10,001 tasks, over max_tasks_per_tree (VANCETOPE_MAX_TASKS_PER_TREE) = 10,000"
            in brain_log(stack)
        ),
        timeout=120,
        what="the brain to refuse the 10,001-task tree",
    )
    assert vt.brain.store.get_tree("over-limit") is None and vt.brain.store.get_tree("flood-8mb") is None
    assert vt.brain.store.get_tree("flood-5mb") is None
    assert not [t for t in vt.trees(200) if t.tree.id == "flood"]


def test_the_per_user_quota_of_unfinished_tasks_refuses_a_submit_naming_the_user_count_and_setting(
    vt: vancetope.Vancetope,
) -> None:
    waiting = {
        "id": "wait",
        "tasks": [{"id": f"w{i}", "tool": "read_local_file", "args": {"path": "x"}} for i in range(4)],
    }
    first = vt.submit(waiting, user="quota-user")  # 4 tasks waiting for a client of quota-user
    try:
        with pytest.raises(vancetope.TreeRefused) as refused:
            vt.submit(waiting, user="quota-user")
        text = str(refused.value)
        assert "user 'quota-user' already has 4 unfinished task(s)" in text
        assert "max_unfinished_tasks_per_user (VANCETOPE_MAX_UNFINISHED_TASKS_PER_USER) = 5" in text
        assert vt.submit(
            {"id": "one", "tasks": [{"id": "a", "tool": "echo", "args": {"value": 1}}]}, user="quota-user"
        )
        # another user is not held back by quota-user's backlog
        assert vt.submit(waiting, user="someone-else").cancel()
    finally:
        first.cancel()


def test_a_100000_task_tree_is_cancelled_in_a_few_batched_store_calls(
    tmp_path: Path, redis_server: Any
) -> None:
    from brain.core.models import Location
    from brain.core.snapshot import RegistrySnapshot
    from brain.core.treefile import load_registry, merge_registry, spec_from_descriptor, tree_from_data
    from tests.conftest import EXAMPLES
    from workers.tools.builtin import builtin_descriptors

    builtins = {d.name: spec_from_descriptor(d, Location.SERVER) for d in builtin_descriptors()}
    registry = RegistrySnapshot(tools=merge_registry(builtins, load_registry(EXAMPLES / "registry.yaml")))
    settings = make_settings(
        tmp_path, max_tasks_per_tree=200_000, max_unfinished_tasks_per_user=200_000, max_tree_bytes=64 << 20
    )
    brain = Brain.connect(settings, redis_server.url, registry)
    try:
        # one task waits for a client nobody runs; 99,999 wait on it
        data = {
            "id": "huge",
            "tasks": [{"id": "first", "tool": "read_local_file", "args": {"path": "x"}}]
            + [
                {"id": f"t{i}", "tool": "echo", "args": {"value": i}, "depends_on": ["first"]}
                for i in range(99_999)
            ],
        }
        record = brain.scheduler.submit(tree_from_data(data), user="nobody")
        calls: dict[str, int] = {"end_tasks": 0, "transition": 0}
        store = brain.store
        for name in calls:
            real = getattr(store, name)

            def counted(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
                calls[_name] += 1
                return _real(*a, **k)

            setattr(store, name, counted)
        started = time.monotonic()
        cancelled = brain.sweeps.cancel(record.tree_id)
        took = time.monotonic() - started
        print(f"cancelled {len(cancelled)} tasks in {took:.2f}s")  # the commit message reports it
        assert len(cancelled) == 100_000 and cancelled[:2] == ["first", "t0"]
        # Two bulk updates, no per-task CAS: the calls sent and not begun first (Flower is told
        # they were revoked: Scheduler._skip), then the rest.
        assert calls == {"end_tasks": 2, "transition": 0}, calls
        states = store.task_states(record.tree_id)
        assert set(states.values()) == {TaskState.SKIPPED}
        tree_rec = store.get_tree(record.tree_id)
        assert tree_rec is not None and tree_rec.status is vancetope.TreeStatus.FAILED
    finally:
        brain.close()


def test_the_gateway_credential_reaches_only_what_asking_the_brain_needs_and_a_call_still_works(
    stack: EmbeddedStack, vt: vancetope.Vancetope
) -> None:
    assert stack.redis is not None
    gateway_url = stack.redis.url_for("vt-gateway")
    r = redis.Redis.from_url(gateway_url)
    try:
        forged = b'{"body": "e30=", "properties": {"body_encoding": "base64", "delivery_tag": "x"}}'
        for forbidden in (
            lambda: r.lpush("client.laptop", forged),  # no run_tool on a workstation
            lambda: r.lpush("c:laptop:client.laptop", forged),
            lambda: r.lpush("server", forged),
            lambda: r.lpush("brain", forged),
            lambda: r.scan(0),
            lambda: r.keys("*"),
            lambda: r.eval("return 1", 0),
            lambda: r.hset("vt:presence", "laptop", b"{}"),  # no rewriting presence / routing
            lambda: r.set("vt:registry", b"{}"),
            lambda: r.execute_command("ACL", "SETUSER", "evil", "on"),
            lambda: r.execute_command("PSUBSCRIBE", "*"),  # refused before any subscription starts
            lambda: r.execute_command("SUBSCRIBE", "celeryev"),  # only tree events: wake-ups
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                forbidden()
        # garbage on its own queue harms nothing: the brain drops it and serves the next request
        r.lpush("gateway", b"\xff not a message")
        r.lpush("gateway", door.envelope({"kind": "run_tool", "user": "ada"}))
        # it cannot act as a user without that user's token: the brain checks the token itself
        with pytest.raises(door.DoorRefused, match="token is not valid"):
            door.ask(r, 30, token="vtg_forged", kind="submit", tree=READ_ADAS_FILE)
    finally:
        r.close()
    reader = open_store(stack.settings.store, read_only=True)
    try:
        with pytest.raises(StoreError, match="readonly"):
            reader.delete_gateway_token("ada")
    finally:
        reader.close()
    assert laptop_calls(vt) == []

    # while a tools/call of ada's still runs end to end on ada's client, through the brain
    url = start_gateway(stack)
    token = token_for(stack, "ada")

    async def call() -> Any:
        async with mcp_client(url, token) as session:
            return await session.call_tool("read_local_file", {"path": "hello.txt"})

    result = anyio.run(call)
    assert not result.is_error, result
    assert "ada's secret notes" in result.content[0].text
    assert len(laptop_calls(vt)) == 1
    assert "gateway: submitted tree mcp-read_local_file" in brain_log(stack)


def test_a_submit_credential_lost_by_redis_is_restored_from_the_store_and_a_revoked_one_is_not(
    stack: EmbeddedStack, vt: vancetope.Vancetope
) -> None:
    assert stack.redis is not None
    url = credential(stack, "restored")
    admin = redis.Redis.from_url(stack.redis.url)
    try:
        admin.execute_command("ACL", "DELUSER", "vts-restored")  # as a Redis restart without its ACL file

        def pings() -> bool:
            probe = redis.Redis.from_url(url)
            try:
                return bool(probe.ping())
            except redis.exceptions.AuthenticationError:
                return False
            finally:
                probe.close()

        wait_until(pings, timeout=120, what="the brain to restore vts-restored from the store")
        send(
            url,
            "submit.restored",
            tree={"id": "ok", "tasks": [{"id": "a", "tool": "echo", "args": {"value": 1}}]},
            tree_id="restored-run",
        )
        report = wait_until(lambda: vt.brain.store.get_tree("restored-run"), timeout=120, what="the run")
        assert report.user == "restored"
        store = open_store(stack.settings.store)
        try:
            assert submitters.revoke(store, admin, "restored")
            assert [c.user for c in store.list_submitters()].count("restored") == 0
        finally:
            store.close()
        assert not pings()
    finally:
        admin.close()


def test_a_presence_key_the_gateway_made_a_list_is_replaced_at_the_next_connect(
    redis_server: RedisServer, brain_on_redis: Brain, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis 6.2 has no read-only key patterns: the gateway's credential can LPUSH the presence key
    while no client is connected. The brain reads that as no session and replaces it."""
    brain = brain_on_redis
    gateway = redis.Redis.from_url(redis_server.url_for("vt-gateway"))
    try:
        gateway.lpush(key_presence(), b"not a session")
    finally:
        gateway.close()
    assert brain.scheduler.presence.sessions() == {}
    brain.scheduler.presence.enroll("laptop", "ada")
    connect(brain, "laptop")
    assert set(brain.scheduler.presence.sessions()) == {"laptop"}
    assert brain.scheduler.presence.session("laptop") is not None
    assert f"{key_presence()} was not a hash (another party wrote it)" in caplog.text
