"""brain.hot.acl: which grant a node's refusal names (pure), and ACL changes on a Redis without
Sentinel going to that one node (the embedded stack's case)."""

from __future__ import annotations

import redis

from brain.core.models import Enrollment
from brain.hot.acl import AclUsers, client_acl_rules, refused_grant, secret_sha256
from workers.redis_connect import every_node

REDIS_70 = "ERR Error in ACL SETUSER modifier '+client|setinfo': Unknown command or category name in ACL"
ENROLLMENT = Enrollment(client_id="laptop", user="ada", enrolled_at=1.0, secret_sha256=secret_sha256("s"))


def test_the_grant_an_older_redis_does_not_know_is_named_and_nothing_else_is_ever_dropped() -> None:
    rules = client_acl_rules(ENROLLMENT)
    assert refused_grant(REDIS_70, rules) == "+client|setinfo"
    # Only a grant that is in the rules: a refused key pattern, secret or category stays an error.
    assert refused_grant(REDIS_70, [r for r in rules if r != "+client|setinfo"]) is None
    assert refused_grant("ERR Error in ACL SETUSER modifier '~c:*': Syntax error", rules) is None
    assert (
        refused_grant("NOPERM this user has no permissions to run the 'acl|setuser' command", rules) is None
    )


def test_without_sentinel_every_node_is_the_client_itself(redis_client: redis.Redis) -> None:
    assert every_node(redis_client) == [redis_client]
    users = AclUsers(redis_client)
    others = users.client_users()  # the Redis is shared: other tests' clients may be there
    users.provision(ENROLLMENT)
    assert users.client_users() == others | {"laptop"}
    assert users.revoke("laptop") is True and users.client_users() == others - {"laptop"}
