"""A restarted embedded Redis lets enrolled workstations straight back in: the client and submit
users the brain saved to the ACL file are kept; the stack's own users are written anew."""

from __future__ import annotations

from pathlib import Path

import redis

from brain.core.models import Enrollment, SubmitCredential
from brain.hot.acl import CLIENT_USER_PREFIX, AclUsers, client_username, secret_sha256, set_user
from brain.runtime.service import sync_users
from brain.runtime.submitters import SUBMIT_USER_PREFIX, SubmitterUsers
from brain.stack.redis_server import ACL_FILE, KEPT_USER_PREFIXES, RedisServer, kept_user_lines
from brain.store import open_store
from workers.urls import with_credentials


def test_the_kept_prefixes_are_the_brains_users() -> None:
    assert KEPT_USER_PREFIXES == (f"user {CLIENT_USER_PREFIX}", f"user {SUBMIT_USER_PREFIX}")


def test_a_client_user_saved_before_a_restart_can_log_in_after_it(tmp_path: Path) -> None:
    secret = "s3cret-of-the-laptop"
    enrollment = Enrollment(
        client_id="laptop", user="ada", enrolled_at=1.0, secret_sha256=secret_sha256(secret)
    )
    server = RedisServer(tmp_path / "redis", appendonly=False).start()
    try:
        admin = redis.Redis.from_url(server.url)
        AclUsers(admin).provision(enrollment)  # SETUSER and ACL SAVE, as enrolling does
        admin.close()
    finally:
        server.stop()
    assert [line.split()[1] for line in kept_user_lines(tmp_path / "redis" / ACL_FILE)] == [
        client_username("laptop")
    ]

    again = RedisServer(tmp_path / "redis", port=server.port, appendonly=False).start()
    try:
        url = with_credentials(again.address_url, client_username("laptop"), secret)
        laptop = redis.Redis.from_url(url)
        assert laptop.ping()  # no wait for the brain to restore it
        laptop.close()
        assert redis.Redis.from_url(again.url_for("vt-brain")).ping()  # the stack's users still work
    finally:
        again.stop()


def test_no_acl_file_keeps_nothing(tmp_path: Path) -> None:
    assert kept_user_lines(tmp_path / ACL_FILE) == []


class CountingSaves(AclUsers):
    saves = 0

    def _save(self, nodes: bool, sentinels: bool) -> None:
        CountingSaves.saves += 1
        super()._save(nodes, sentinels)


def test_restoring_many_clients_saves_the_acl_file_once(tmp_path: Path) -> None:
    """Each ACL SAVE rewrites the whole file: one per user made restoring 1,000 clients take about
    a minute (bench/fleet.py's storm), while their agents were refused."""
    server = RedisServer(tmp_path / "redis", appendonly=False).start()
    try:
        admin = redis.Redis.from_url(server.url)
        users = CountingSaves(admin)
        enrollments = [
            Enrollment(client_id=f"c{i}", user="ada", enrolled_at=1.0, secret_sha256=secret_sha256(f"s{i}"))
            for i in range(50)
        ]
        users.sync(enrollments)
        assert users.client_users() == {f"c{i}" for i in range(50)}
        assert CountingSaves.saves == 1
        users.sync(enrollments[:10])  # 40 revoked while Redis was away
        assert users.client_users() == {f"c{i}" for i in range(10)}
        assert CountingSaves.saves == 2
        assert len(kept_user_lines(tmp_path / "redis" / ACL_FILE)) == 10
        admin.close()
    finally:
        server.stop()


def acl_calls(node: redis.Redis) -> int:
    """ACL commands the node ran since CONFIG RESETSTAT (Redis 7 counts each subcommand apart)."""
    stats = node.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_acl"))


def test_a_sweeps_sync_of_both_kinds_lists_the_users_once_and_saves_once(tmp_path: Path) -> None:
    """The brain syncs the client and the submit users every sweep: one ``ACL USERS`` and one
    ``ACL SAVE`` per node for both, not one of each per kind."""
    server = RedisServer(tmp_path / "redis", appendonly=False).start()
    store = open_store(f"sqlite:///{tmp_path}/store.db")
    try:
        admin = redis.Redis.from_url(server.url)
        for i in range(3):
            store.put_enrollment(
                Enrollment(
                    client_id=f"c{i}", user="ada", enrolled_at=1.0, secret_sha256=secret_sha256(f"s{i}")
                )
            )
        store.put_submitter(SubmitCredential(user="bob", secret_sha256=secret_sha256("b"), created_at=1.0))
        set_user(admin, client_username("gone"), ["reset", "on", ">x"])  # revoked while Redis was away
        admin.config_resetstat()
        sync_users(admin, store)
        # ACL USERS once, DELUSER gone, SETUSER for 3 clients and bob, ACL SAVE once (a pass
        # per kind: 9, with USERS and SAVE twice).
        assert acl_calls(admin) == 7
        assert AclUsers(admin).client_users() == {"c0", "c1", "c2"}
        assert SubmitterUsers(admin).present() == {"bob"}
        admin.config_resetstat()
        sync_users(admin, store)  # nothing to change: the users listed once, nothing saved
        assert acl_calls(admin) == 1
        admin.close()
    finally:
        store.close()
        server.stop()
