"""The sentinel users as an attacker and an operator at 03:00 meet them, on real processes
(a review of the first version found each of these broken): a pool's or Flower's host cannot
move the master with a forged hello; a running agent outlives a restart of every sentinel from
a fresh config while the brain is away; a sentinel that is down is said to be unreachable, not
to refuse the brain."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from brain.hot.acl import client_username
from tests.conftest import agent_with_servers, make_settings, wait_until, write_mcp_config
from tests.fixtures.sentinel import (  # noqa: F401 - the fixture
    COMPONENT_SECRETS,
    SentinelSet,
    SentinelStack,
    sentinel_binaries,
    sentinel_set,
)

pytestmark = pytest.mark.integration


def restart_sentinels_fresh(sentinels: SentinelSet) -> None:
    """What compose.sentinel.yaml does at each sentinel start: the config file written anew from
    the operator's lines, so the users the brain added (vtc-*, vts-*) are gone. All three at once
    (a host reboot, `docker compose restart`)."""
    for node in sentinels.sentinels:
        node.process.kill()
        node.process.wait(10)
    for index, old in enumerate(sentinels.sentinels):
        folder = sentinels.folder / f"sentinel{index}"
        conf = folder / "sentinel.conf"
        lines = conf.read_text().splitlines()
        conf.write_text(
            "".join(f"{line}\n" for line in lines if not line.startswith(("user vtc-", "user vts-")))
        )
        process = sentinels._spawn([sentinel_binaries()[1], str(conf)], folder / "sentinel.log")
        sentinels.sentinels[index] = type(old)(old.port, process, old.username, old.password)
    sentinels._wait(sentinels._ready, 120, "the sentinels to be back")


def sentinels_know(sentinels: SentinelSet, user: str) -> bool:
    for node in sentinels.sentinels:
        with node.client() as s:
            if user.encode() not in s.execute_command("ACL", "USERS"):
                return False
    return True


@pytest.fixture
def redteam_stack(tmp_path: Path, sentinel_set: SentinelSet) -> Iterator[SentinelStack]:  # noqa: F811
    (tmp_path / "laptop").mkdir()
    agent = agent_with_servers(tmp_path / "laptop", {})
    # A shorter grace than the default 60 s, to keep the test short: the same happens with 60 s
    # when the brain is away longer than that.
    agent.write_text(agent.read_text().replace("[agent]\n", "[agent]\nrefused_grace_s = 10\n"))
    settings = make_settings(
        tmp_path, redis_url=sentinel_set.url, agent_config=agent,
        mcp_config=write_mcp_config(tmp_path / "server-mcp.json", {}),
    )  # fmt: skip
    stack = SentinelStack(settings, only=("brain", "client-agent"))
    try:
        yield stack.start()
    finally:
        stack.stop()


def test_a_running_agent_outlives_a_restart_of_every_sentinel_while_the_brain_is_away(
    redteam_stack: SentinelStack,
    sentinel_set: SentinelSet,  # noqa: F811
) -> None:
    """Without Sentinel the data nodes keep their users across a restart (their ACL file), so an
    agent that reconnects while the brain is away sees an outage and waits. Behind Sentinel each
    sentinel's config is written anew at start (compose.sentinel.yaml): every client user is gone
    from the sentinels until the brain's next sync, and an agent that reconnects meanwhile is
    told "refused" — it takes itself for revoked and exits 3, for good (a service manager does not
    restart exit 3). Nothing about the client changed: it should still be running."""
    user = client_username("laptop")
    agent = redteam_stack.service("client-agent")
    brain = redteam_stack.service("brain")

    # 1. The brain up: how long until it restores the client's sentinel user.
    restart_sentinels_fresh(sentinel_set)
    assert not sentinels_know(sentinel_set, user)
    began = time.monotonic()
    wait_until(
        lambda: sentinels_know(sentinel_set, user), timeout=120, what="the brain to restore vtc-laptop"
    )
    print(f"brain restored {user} on every sentinel {time.monotonic() - began:.1f}s after the restart")

    # 2. The brain away (restarting, its host rebooting) while the sentinels restart, and the
    # agent's connection to the master dropped (a network blip; a failover does the same).
    os.killpg(brain.process.pid, signal.SIGKILL)  # type: ignore[union-attr]
    brain.process.wait(10)  # type: ignore[union-attr]
    restart_sentinels_fresh(sentinel_set)
    with sentinel_set.master().client() as admin:
        admin.execute_command("CLIENT", "KILL", "USER", user)
    # The agent's grace is 10 s; the brain comes back after 25 s.
    deadline = time.monotonic() + 25
    while time.monotonic() < deadline and agent.process.poll() is None:  # type: ignore[union-attr]
        time.sleep(0.5)
    code = agent.process.poll()  # type: ignore[union-attr]
    log = agent.log_path.read_text() if agent.log_path else ""
    assert code is None, f"the agent exited with {code} though nothing about it changed:\n{log[-1500:]}"


def test_the_brain_logs_an_unreachable_sentinel_as_unreachable(
    sentinel_set: SentinelSet,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sentinel that is down is not one that refused the brain's user: the warning should not
    tell the operator to fix vt-brain's rules there."""
    from brain.hot.acl import AclUsers
    from brain.hot.presence import PresenceBook
    from brain.hot.state import HotState
    from brain.runtime.enrollment import enroll
    from brain.store.sqlite import SQLiteStore

    hot = HotState.from_url(sentinel_set.url)
    store = SQLiteStore(tmp_path / "store.db")
    try:
        enroll(PresenceBook(hot.r, store), "laptop", "ada", sentinel_set.url)
        down = sentinel_set.sentinels[2]
        down.process.kill()
        down.process.wait(10)
        with caplog.at_level("WARNING", logger="vancetope.brain.acl"):
            AclUsers(hot.r).sync(store.list_enrollments())
        said = [r.getMessage() for r in caplog.records if str(down.port) in r.getMessage()]
        assert said, "nothing said about the sentinel that is down"
        assert not any("refused a user change" in m or "give the brain's user" in m for m in said), said
        assert any("cannot be reached" in m for m in said), said
    finally:
        store.close()
        hot.close()


# A fake Redis master: answers what sentinels and redis-py ask (PING, INFO role:master, AUTH)
# and records every command, as an attacker's server would.
_FAKE_INFO = (
    b"# Server\r\nrun_id:" + b"f" * 40 + b"\r\n# Replication\r\nrole:master\r\nconnected_slaves:0\r\n"
)


def _resp_commands(buf: bytes) -> tuple[list[list[bytes]], bytes]:
    commands: list[list[bytes]] = []
    while buf.startswith(b"*"):
        try:
            end = buf.index(b"\r\n")
            count, pos, args = int(buf[1:end]), end + 2, []
            for _ in range(count):
                head = buf.index(b"\r\n", pos)
                size = int(buf[pos + 1 : head])
                args.append(buf[head + 2 : head + 2 + size])
                pos = head + 2 + size + 2
                if pos > len(buf):
                    raise ValueError
        except ValueError:
            break
        commands.append(args)
        buf = buf[pos:]
    return commands, buf


def _fake_answer(args: list[bytes]) -> bytes:
    name = args[0].upper()
    if name == b"PING":
        return b"+PONG\r\n"
    if name == b"INFO":
        return b"$%d\r\n%s\r\n" % (len(_FAKE_INFO), _FAKE_INFO)
    if name == b"HELLO":
        return b"-ERR unknown command 'HELLO'\r\n"
    if name == b"SUBSCRIBE":
        return b"*3\r\n$9\r\nsubscribe\r\n$%d\r\n%s\r\n:1\r\n" % (len(args[1]), args[1])
    return b"+OK\r\n"


def start_fake_master(seen: list[bytes]) -> int:
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(50)

    def serve(conn: socket.socket) -> None:
        buf = b""
        with conn:
            while data := conn.recv(65536):
                commands, buf = _resp_commands(buf + data)
                for command in commands:
                    seen.append(b" ".join(command))
                    conn.sendall(_fake_answer(command))

    def accept() -> None:
        while True:
            conn, _ = server.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return int(server.getsockname()[1])


@pytest.mark.parametrize("publisher", ["vt-pool", "vt-flower"])
def test_a_component_host_cannot_move_the_master_with_one_forged_hello(
    sentinel_set: SentinelSet,  # noqa: F811
    publisher: str,
) -> None:
    """A hello on `__sentinel__:hello` carries a master address and a config epoch, and a
    sentinel adopts a newer one at once (+config-update-from, +switch-master): one PUBLISH as
    vt-pool or vt-flower, while they could publish on every channel, moved every sentinel to the
    attacker's server, where vt-sentinel logged in within seconds and vt-brain's password
    followed as the brain reconnected. They may publish on Celery's channels only now."""
    from brain.stack.redis_server import free_port
    from tests.fixtures.sentinel import MASTER
    from workers.redis_connect import redis_client

    seen: list[bytes] = []
    fake = start_fake_master(seen)
    real = sentinel_set.master_port()
    hello = f"127.0.0.1,{free_port()},{'e' * 40},1000,{MASTER},127.0.0.1,{fake},1000"
    with sentinel_set.master().client(username=publisher, password=COMPONENT_SECRETS[publisher]) as c:
        try:
            c.publish("__sentinel__:hello", hello)
        except redis.exceptions.NoPermissionError:
            return  # the fix: the component may not publish on the sentinels' channel
    time.sleep(3)  # a sentinel reads hello messages as they come; nothing to wait for but them
    brain = redis_client(sentinel_set.url_for("vt-brain"), socket_timeout=5, protocol=2)
    try:
        brain.ping()
    except redis.RedisError:
        pass
    finally:
        brain.close()
    moved = [
        n.port
        for n in sentinel_set.sentinels
        if int(n.ask("sentinel_get_master_addr_by_name", MASTER)[1]) != real
    ]
    leaked = sorted({line.split(b" ")[1].decode() for line in seen if line.upper().startswith(b"AUTH ")})
    assert not moved and not leaked, (
        f"one PUBLISH as {publisher}: sentinels {moved} now name 127.0.0.1:{fake} as the master, "
        f"which received the passwords of {leaked}"
    )
