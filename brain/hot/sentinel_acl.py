"""The sentinels' users (layer: brain/hot; the rules, then the glue that sends them).

docs/security.md ("Redis with Sentinel"): a sentinel that takes commands from anyone can be
told to monitor a master of an attacker's (``SENTINEL REMOVE`` + ``MONITOR``, or ``SET``),
and every component that reconnects then sends its Redis password to that server. So every
sentinel has its default user off, and each component connects to the sentinels as the same
user it is on the data nodes (workers.redis_connect sends the URL's credential to both),
allowed there only to ask where the master and its replicas are. The brain may also manage
users, to keep each client agent's and each submit credential's sentinel user in step with
the store, as it does on the data nodes (brain.hot.acl.StoreUsers). Nothing here may
change what a sentinel monitors, start a failover or read its configuration.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Final, TypeVar

import redis

from workers.redis_connect import every_sentinel, node_address

log = logging.getLogger("vancetope.brain.acl")
T = TypeVar("T")

# What following a master asks a sentinel: redis-py's Sentinel (kombu's too) finds the master
# with SENTINEL MASTERS and its replicas with SENTINEL SLAVES (REPLICAS in newer clients).
# CLIENT SETINFO is left out: Redis 7.0's sentinel does not know it, and redis-py ignores its
# refusal.
SENTINEL_FOLLOW_COMMANDS: Final[tuple[str, ...]] = (
    "sentinel|masters", "sentinel|master", "sentinel|get-master-addr-by-name",
    "sentinel|slaves", "sentinel|replicas",
    "ping", "hello", "client|setname",
)  # fmt: skip
# What the brain may do more: the users it keeps in step, and SENTINEL FLUSHCONFIG, which writes
# them into the sentinel's own config file (a sentinel has no ACL file: ACL SAVE is refused).
SENTINEL_BRAIN_COMMANDS: Final[tuple[str, ...]] = (
    "acl|setuser", "acl|deluser", "acl|users", "sentinel|flushconfig",
)  # fmt: skip
BRAIN_USER: Final = "vt-brain"


def sentinel_rules(manages_users: bool = False) -> tuple[str, ...]:
    """A user's rules on a sentinel: follow the master; the brain (``manages_users``), keep
    the other users too."""
    extra = SENTINEL_BRAIN_COMMANDS if manages_users else ()
    return ("resetchannels", "-@all", *(f"+{command}" for command in (*SENTINEL_FOLLOW_COMMANDS, *extra)))


def sentinel_user_rules(secret_sha256: str) -> list[str]:
    """ACL SETUSER rules of a client agent's or submit credential's sentinel user (the same
    name and secret as on the data nodes). ``reset`` first: a new secret replaces the old."""
    return ["reset", "on", f"#{secret_sha256}", *sentinel_rules()]


def component_sentinel_acl_lines(sha256_by_user: Mapping[str, str]) -> list[str]:
    """sentinel.conf ``user`` lines of the stack's own users (each with its secret's SHA-256);
    the operator adds a ``user default off`` line and the sentinels' own user (sentinel-user)."""
    return [
        f"user {user} on #{sha} {' '.join(sentinel_rules(manages_users=user == BRAIN_USER))}"
        for user, sha in sha256_by_user.items()
    ]


# The sentinels that refused a change, by address and reason: said once as a warning, then
# quietly, since the brain re-sends its users every sweep.
_refused: set[tuple[tuple[str, int], str]] = set()


def on_every_sentinel(r: redis.Redis, change: Callable[[redis.Redis], T]) -> list[T]:
    """``change`` applied to each sentinel behind ``r`` (none for a plain Redis). A sentinel
    that is away or refuses is left to the next sync: the data nodes are the ones that let a
    user in, and a sentinel that lacks a client's user only makes that client wait."""
    sentinels = every_sentinel(r)
    results: list[T] = []
    try:
        for sentinel in sentinels:
            try:
                results.append(change(sentinel))
            except redis.RedisError as exc:
                _say_refused(sentinel, exc)
    finally:
        for sentinel in sentinels:
            sentinel.close()
    return results


def _say_refused(sentinel: redis.Redis, exc: redis.RedisError) -> None:
    address = node_address(sentinel)
    reason = type(exc).__name__
    how = log.debug if (address, reason) in _refused else log.warning
    _refused.add((address, reason))
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)) and not isinstance(
        exc, redis.AuthenticationError
    ):
        how(
            "the sentinel at %s:%s cannot be reached (%s): its users are sent again at the next sync",
            *address, exc,
        )  # fmt: skip
        return
    how(
        "the sentinel at %s:%s refused a user change (%s): clients it lacks cannot find the master "
        "through it; give the brain's user %s there: %s (docs/configuration.md, Redis Sentinel)",
        *address, exc, BRAIN_USER, " ".join(sentinel_rules(manages_users=True)),
    )  # fmt: skip


def flush_config(sentinel: redis.Redis) -> None:
    """Have the sentinel write its users into its config file, so a restart keeps them."""
    sentinel.execute_command("SENTINEL", "FLUSHCONFIG")


__all__ = [
    "SENTINEL_BRAIN_COMMANDS",
    "SENTINEL_FOLLOW_COMMANDS",
    "component_sentinel_acl_lines",
    "flush_config",
    "on_every_sentinel",
    "sentinel_rules",
    "sentinel_user_rules",
]
