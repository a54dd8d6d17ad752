"""Redis Sentinel everywhere (issue 28 item 1): Debian's redis-server and redis-sentinel, one
primary, one replica and three sentinels (tests/fixtures/sentinel.py); the primary SIGKILLed.

Every component connects with kombu's ``sentinel://...;sentinel://...`` URL through
workers.redis_connect and follows the promoted replica without a restart. Redis replicates
no ACL change: the brain sends each to every node (brain.hot.acl.on_every_node), so a
client enrolled before the failover gets in afterwards and a revoked one stays out.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from brain.hot.acl import AclUsers, client_username
from brain.hot.presence import PresenceBook
from brain.runtime.enrollment import enroll
from brain.store.sqlite import SQLiteStore
from tests.fixtures.sentinel import SentinelSet, sentinel_set  # noqa: F401 - the fixture
from workers.contracts import client_key
from workers.redis_connect import every_node, redis_client
from workers.urls import parse_sentinel_url

pytestmark = pytest.mark.integration


def test_a_revoked_client_stays_out_and_an_enrolled_one_gets_in_after_a_failover(
    tmp_path: Path, sentinel_set: SentinelSet  # noqa: F811 - the fixture
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

        old = sentinel_set.kill_primary()
        sentinel_set.wait_failover(old)

        own = redis_client(laptop.broker_url, socket_timeout=5)
        own.lpush(client_key("laptop", "probe"), b"x")  # its own keys, on the promoted replica
        with pytest.raises(redis.exceptions.NoPermissionError):
            own.get("vt:registry")  # and nothing else
        with pytest.raises(redis.AuthenticationError):
            redis_client(desk.broker_url, socket_timeout=5).ping()
        own.close()
    finally:
        store.close()
        admin.close()
