"""Per-client Redis credentials (layer: brain/hot; pure rules, then the Redis glue).

docs/security.md ("A workstation"): each client agent connects as its own Redis ACL user, confined to
its own keys ``c:<id>:*``, no pub/sub channel, and only the commands the agent uses.
The store holds the enrollment and the SHA-256 of the client's secret; the ACL user is
derived from it (``ACL SETUSER ... #<sha256>``), so a Redis restart or flush loses
nothing the brain cannot put back (``AclUsers.sync``), and the secret itself is never
stored anywhere but on the workstation.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

import redis

from brain.core.models import Enrollment
from brain.hot.sentinel_acl import flush_config, on_every_sentinel, sentinel_user_rules
from brain.hot.state import as_text
from workers.contracts import (
    GATE_NS,
    GATEWAY_QUEUE,
    KEY_NS,
    channel_resource_updates,
    channel_tree_events,
    client_keyprefix,
    key_cancelled,
    key_deliveries,
    key_pool_registry,
    key_presence,
    key_registry,
    key_registry_loaded_at,
    key_retry_at,
    key_tree_running,
)
from workers.redis_connect import every_node, node_address

log = logging.getLogger("vancetope.brain.acl")
T = TypeVar("T")

CLIENT_USER_PREFIX = "vtc-"
# The answers to sampling/elicitation requests (workers.contracts.key_answer, client_answer_key).
ANSWER_KEYS = f"{KEY_NS}answer:*"
CLIENT_ANSWER_KEYS = "c:*:answer:*"

# What a client agent sends: its kombu/Celery worker on the c:<id>: prefix, its
# outbox/ack/heartbeat channel, the run_tool task's cancel and running marks. This is
# the list seen working with celery and kombu 5.7 plus incrby/sismember, with nothing outside the
# data-structure and transaction families. No scripting (EVAL, EVALSHA, SCRIPT, FUNCTION,
# FCALL): a script runs to its end with Redis serving nobody else, so one busy loop stopped
# every user's work (issue 20, H3); what the agent does atomically is a MULTI/EXEC
# (workers.tasks.HotState.begin_run). No INFO: the server's memory, clients and keyspace are
# not a workstation's business, and neither kombu, Celery nor redis-py asks for it (a whole
# agent session shows no refusal in ACL LOG but redis-py's CLIENT SETINFO, unknown to Redis
# 6.2 anyway: tests/security/test_redis_limits.py). MONITOR of a running agent saw BRPOP
# EXEC EXPIRE GET HDEL HSET INCRBY LPUSH MULTI SET SISMEMBER WATCH ZADD ZRANGE ZREM; the
# rest serve start-up, restore and shutdown.
CLIENT_COMMANDS: tuple[str, ...] = (
    # kombu Redis transport: queues, the unacked hash/zset and its mutex, bindings
    "brpop", "lpush", "rpush", "lpop", "rpop", "llen", "lrange", "lrem",
    "zadd", "zrem", "zrange", "zrangebyscore", "zrevrangebyscore", "zscore", "zcard",
    "hset", "hget", "hdel", "hgetall", "hlen", "hmget",
    "sadd", "srem", "smembers", "sismember",
    "set", "get", "setnx", "del", "exists", "expire", "pexpire", "incrby",
    "multi", "exec", "discard", "watch", "unwatch",
    # connection housekeeping by redis-py and kombu (no SELECT: in another database a client's
    # keys would be out of its quota's sight; redis-py sends none for db 0)
    "ping", "time", "client|setname", "client|setinfo", "echo",
)  # fmt: skip


# The stack's own processes, each with only what it needs (docs/security.md, "The parties"). The brain
# manages client users, so it may run ACL SETUSER/DELUSER; nothing else may. The server
# pool and Flower never see a client's keys. No component may FLUSHALL, CONFIG, KEYS,
# MONITOR or DEBUG (-@dangerous). Operators: compose.yaml gives the same rules.
_HOUSEKEEPING = ("+info", "+client|setname", "+client|setinfo", "+client|id")
# The pub/sub channels of Celery's broadcast and events on the stack's database (0: client
# agents may not SELECT), kombu's fanout keyprefix "/0.": remote control (pidbox), workers'
# gossip and task events, and Flower's view of them all. kombu subscribes by PSUBSCRIBE, whose
# pattern Redis matches literally against these, so each is written as kombu sends it. No other
# channel: the sentinels learn their peers from hello messages on ``__sentinel__:hello``, and a
# user who may publish there could announce a sentinel of its own, which the real sentinels then
# log in to with their password (docs/security.md, "Redis with Sentinel").
CELERY_CHANNELS = ("resetchannels", "&/0.celery.pidbox", "&/0.celeryev/*", "&/0.celeryev/worker.*")
COMPONENT_RULES: dict[str, tuple[str, ...]] = {
    "vt-brain": (
        "~*", "&*", "+@all", "-@dangerous", *_HOUSEKEEPING,
        "+acl|setuser", "+acl|deluser", "+acl|users", "+acl|save",
    ),
    # The server pool: its own queues and kombu's bookkeeping, results and client dependents to
    # the brain's queue, and of the hot state only what a server run writes — its pool's
    # liveness, the tree's running marks, a run's delivery counter, the cancel set it checks
    # (workers.tasks.HotState.begin_run), the retry timer of a failed attempt it records
    # (brain.hot.retries: a forged timer starts nothing the store does not say is retrying) —
    # the admission gate (brain.hot.gate: it puts dependents with limits there, runs the gate's
    # script and gives back a slot when a run ends), and the pools' copy of the registry snapshot (Redis 6.2
    # cannot make the brain's read-only), and the answers to its gateway calls' sampling and
    # elicitation requests (``key_answer``, written by the gateway). No presence, no parked lists, no tool pins, no client
    # key, not the registry others route with: work that needs presence to route goes to the
    # brain (brain.runtime.recorder), so a pool cannot reroute anyone's client calls (issue 20, M6).
    # kombu adds priority suffixes to queue keys (server\x06\x163 ...): hence the stars.
    "vt-pool": (
        "~server*", "~brain*", "~unacked", "~unacked_index", "~unacked_mutex", "~_kombu.*",
        f"~{KEY_NS}pool:*:workers", f"~{key_tree_running('*')}", f"~{key_deliveries('*')}",
        f"~{key_cancelled()}", f"~{key_pool_registry()}", f"~{key_retry_at()}", f"~{ANSWER_KEYS}",
        f"~{GATE_NS}*", "~*.reply.celery.pidbox*", "~celeryev.*", *CELERY_CHANNELS,
        f"&{channel_resource_updates()}", f"&{channel_tree_events('*')}", "+@all", "-@dangerous", *_HOUSEKEEPING,
    ),
    # Celery beat (brain.beat) puts run_schedule jobs on the brain's queue, and nothing else: no
    # other queue, no hot state, no events (task_send_sent_event is off), no reading a queue (LLEN:
    # kombu's declare asks for its length).
    "vt-beat": (
        "~brain*", "~_kombu.binding*.brain", "resetchannels", "-@all",
        "+lpush", "+llen", "+sadd", "+smembers", "+multi", "+exec", "+discard", "+ping", "+select", "+echo",
        *_HOUSEKEEPING,
    ),
    # Redis 6.2 has no read-only key patterns (7's %R~): Flower may still write the server
    # and brain queues it reads the length of, but no client's key, and runs no admin command.
    "vt-flower": (
        "~_kombu.*", "~*.reply.celery.pidbox*", "~celeryev.*", "~server*", "~brain*", "~unacked*", *CELERY_CHANNELS,
        "+@all", "-@dangerous", *_HOUSEKEEPING,
    ),
    # The MCP gateway (brain.gateway) asks the brain to submit and cancel (queue `gateway`, with
    # the caller's token: brain.runtime.gateway_door) and waits for its reply; it reads the registry and
    # presence the brain publishes and wakes on tree events and on resources/updated. It answers its calls' sampling and
    # elicitation requests (issue 24) into the answer keys (the pool's, and each client's own
    # ``c:<id>:answer:<ask id>``, the one kind of a client's key it reaches: LPUSH there, nothing
    # a client agent would read as work). No EXPIRE: on the registry or presence it would be a
    # way to make them vanish; the asker deletes its answer key when it stops waiting, and the
    # gateway writes none after that (``ToolAsk.answer_by``). No other client key, no store key it
    # could write with these commands (reads only there), no SCAN/KEYS, PSUBSCRIBE, scripts or admin.
    "vt-gateway": (
        f"~{key_registry()}", f"~{key_registry_loaded_at()}", f"~{key_presence()}",
        f"~{GATEWAY_QUEUE}", f"~{GATEWAY_QUEUE}.reply.*", f"~{ANSWER_KEYS}", f"~{CLIENT_ANSWER_KEYS}",
        "resetchannels", f"&{channel_tree_events('*')}", f"&{channel_resource_updates()}",
        "-@all", "+get", "+hget", "+hgetall", "+lpush", "+blpop", "+subscribe", "+unsubscribe",
        "+ping", "+select", "+echo", *_HOUSEKEEPING,
    ),
    # Other Celery apps submit trees with a credential of one user (`vancetope submit-url --user
    # U`): ACL users vts-<user>, made by the brain from the store (brain.runtime.submitters), not here.
}  # fmt: skip


def component_acl_lines(secrets_by_user: dict[str, str]) -> list[str]:
    """ACL file lines of the stack's own users, each with the SHA-256 of its secret."""
    return [
        f"user {user} on #{secret_sha256(secrets_by_user[user])} {' '.join(rules)}"
        for user, rules in COMPONENT_RULES.items()
    ]


def client_username(client_id: str) -> str:
    client_keyprefix(client_id)  # validates the id
    return CLIENT_USER_PREFIX + client_id


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def secret_sha256(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def client_acl_rules(enrollment: Enrollment) -> list[str]:
    """The ACL SETUSER rules of one client: its keys only, no channels, the agent's commands.

    ``reset`` first, so re-enrolling replaces the old secret and nothing granted before survives.
    """
    if not enrollment.secret_sha256:
        raise ValueError(f"client {enrollment.client_id!r} has no credential to provision")
    return [
        "reset",
        "on",
        f"#{enrollment.secret_sha256}",
        f"~{client_keyprefix(enrollment.client_id)}*",
        "resetchannels",
        "-@all",
        *(f"+{command}" for command in CLIENT_COMMANDS),
    ]


# Redis refuses a whole ACL SETUSER for one grant it does not know: Redis 7.0 (Debian 12's)
# has no CLIENT SETINFO (7.2), which redis-py sends and CLIENT_COMMANDS grants. Its words:
# "ERR Error in ACL SETUSER modifier '+client|setinfo': Unknown command or category name in ACL".
_REFUSED_MODIFIER = re.compile(r"modifier '([^']+)': Unknown command")


def refused_grant(error: str, rules: Sequence[str]) -> str | None:
    """The ``+command`` grant of ``rules`` that ``error`` says this Redis does not know, if that
    is what it says. Only grants are ever dropped: a key pattern or a secret never is."""
    found = _REFUSED_MODIFIER.search(error)
    if found is None or not found.group(1).startswith("+") or found.group(1) not in rules:
        return None
    return found.group(1)


def set_user(node: redis.Redis, username: str, rules: Sequence[str]) -> None:
    """ACL SETUSER on one node, without the grants of commands this node's Redis does not have
    (the client never sends those to it: redis-py ignores CLIENT SETINFO's refusal)."""
    rules = list(rules)
    while True:
        try:
            node.execute_command("ACL", "SETUSER", username, *rules)
            return
        except redis.ResponseError as exc:
            grant = refused_grant(str(exc), rules)
            if grant is None:
                raise
            log.info(
                "Redis at %s does not know %s: ACL user %s goes without it", _where(node), grant, username
            )
            rules.remove(grant)


def delete_user(node: redis.Redis, username: str) -> bool:
    return bool(node.execute_command("ACL", "DELUSER", username))


def users_named(node: redis.Redis, prefix: str) -> set[str]:
    """The ACL users of one node whose name starts with ``prefix``, without it."""
    return {
        name[len(prefix) :]
        for name in map(as_text, node.execute_command("ACL", "USERS"))
        if name.startswith(prefix)
    }


def save_acl(node: redis.Redis, restored_from: str) -> None:
    # The store is the record; the ACL file (when Redis has one) only spares a re-sync.
    try:
        node.execute_command("ACL", "SAVE")
    except redis.ResponseError as exc:
        log.debug(
            "ACL SAVE on %s: %s (the brain restores %s from the store)", _where(node), exc, restored_from
        )


def _where(node: redis.Redis) -> str:
    host, port = node_address(node)
    return f"{host}:{port}"


def on_every_node(r: redis.Redis, change: Callable[[redis.Redis], T]) -> list[T]:
    """``change`` applied to each data node behind ``r``, the master's result first. Redis
    replicates data but not ACL changes: behind Sentinel an enrolment or revocation must reach
    every replica too, or a replica promoted later would let a revoked client back in (or
    keep an enrolled one out). A replica that cannot be reached now is left to the brain's
    next sync (the reconciler runs ``sync`` every sweep); the master's failure is raised."""
    nodes = every_node(r)
    results: list[T] = []
    try:
        for index, node in enumerate(nodes):
            try:
                results.append(change(node))
            except redis.ConnectionError as exc:
                if index == 0:
                    raise
                log.warning(
                    "ACL change not sent to replica %s (%s): the next sync sends it", _where(node), exc
                )
    finally:
        for node in nodes:
            if node is not r:
                node.close()
    return results


class StoreUsers(Generic[T]):
    """ACL users ``prefix + key`` on one Redis, kept equal to records of the store: on each of
    its data nodes behind Sentinel, and on each sentinel as a user that may only find the
    master (brain.hot.sentinel_acl), the same name and secret on both."""

    prefix: ClassVar[str]
    what: ClassVar[str]  # for the logs: "client", "submit credential"

    def __init__(self, r: redis.Redis) -> None:
        self.r = r

    def key(self, record: T) -> str:
        raise NotImplementedError

    def username(self, key: str) -> str:
        raise NotImplementedError

    def rules(self, record: T) -> list[str]:
        """The data nodes' ACL SETUSER rules, ``reset`` first."""
        raise NotImplementedError

    def secret_sha256(self, record: T) -> str:
        raise NotImplementedError

    def provision(self, record: T, save: bool = True) -> None:
        name, rules = self.username(self.key(record)), self.rules(record)
        on_every_node(self.r, lambda node: set_user(node, name, rules))
        sentinel = sentinel_user_rules(self.secret_sha256(record))
        on_every_sentinel(self.r, lambda node: set_user(node, name, sentinel))
        if save:
            self._save(nodes=True, sentinels=True)

    def revoke(self, key: str, save: bool = True) -> bool:
        """Delete the ACL user, which also closes its open connections (a disabled user's
        connections would stay open), on every node and sentinel. True if the master had it."""
        name = self.username(key)
        deleted = on_every_node(self.r, lambda node: delete_user(node, name))[0]
        on_every_sentinel(self.r, lambda node: delete_user(node, name))
        if save:
            self._save(nodes=True, sentinels=True)
        return deleted

    def present(self) -> set[str]:
        """The keys of the master's users of this kind."""
        return users_named(self.r, self.prefix)

    def wanted(self, records: Iterable[T]) -> dict[str, T]:
        """The users the store says should exist, by key."""
        return {self.key(record): record for record in records}

    def sync(self, records: Iterable[T]) -> None:
        """Create the users the store says should exist and delete the rest, on each node and
        each sentinel (after a Redis restart without an ACL file, a revocation whose DELUSER
        did not reach Redis, or a node or sentinel that was away when it was sent)."""
        sync_users_of(self.r, [(self, records)])

    def _sync_node(
        self, node: redis.Redis, listed: set[str], wanted: dict[str, T], rules: Callable[[T], list[str]]
    ) -> bool:
        present = {name[len(self.prefix) :] for name in listed if name.startswith(self.prefix)}
        missing, extra = sorted(wanted.keys() - present), sorted(present - wanted.keys())
        for key in missing:
            log.info("restoring the Redis ACL user of %s %r on %s", self.what, key, _where(node))
            set_user(node, self.username(key), rules(wanted[key]))
        for key in extra:
            log.warning(
                "deleting the Redis ACL user of %s %r on %s: the store has none", self.what, key, _where(node)
            )
            delete_user(node, self.username(key))
        return bool(missing or extra)

    def _sentinel_rules(self, record: T) -> list[str]:
        return sentinel_user_rules(self.secret_sha256(record))

    def _save(self, nodes: bool, sentinels: bool) -> None:
        if nodes:
            on_every_node(self.r, lambda node: save_acl(node, "its ACL users"))
        if sentinels:
            on_every_sentinel(self.r, flush_config)


def sync_users_of(r: redis.Redis, kinds: Sequence[tuple[StoreUsers[Any], Iterable[Any]]]) -> None:
    """Each kind's ACL users made equal to its records, in one pass over the data nodes and
    one over the sentinels: one connection and one ``ACL USERS`` per node for every kind (the
    brain syncs clients and submit credentials every sweep; a pass per kind listed every
    node's users twice and, behind Sentinel, connected to each node and sentinel twice), and
    one ``ACL SAVE`` / ``FLUSHCONFIG`` for all (each rewrites the whole file: one per user made
    restoring 1,000 clients after a Redis restart take about a minute, bench/fleet.py's storm,
    and an agent that reconnected meanwhile was refused)."""
    plans = [(users, users.wanted(records)) for users, records in kinds]

    def on(node: redis.Redis, sentinel: bool) -> bool:
        listed = set(map(as_text, node.execute_command("ACL", "USERS")))
        changed = False
        for users, wanted in plans:  # every kind, even once one has changed something
            rules = users._sentinel_rules if sentinel else users.rules
            changed = users._sync_node(node, listed, wanted, rules) or changed
        return changed

    nodes = on_every_node(r, lambda node: on(node, sentinel=False))
    sentinels = on_every_sentinel(r, lambda node: on(node, sentinel=True))
    if plans and (any(nodes) or any(sentinels)):
        plans[0][0]._save(nodes=any(nodes), sentinels=any(sentinels))


class AclUsers(StoreUsers[Enrollment]):
    """The client ACL users on one Redis (and its sentinels), kept equal to the store's enrollments."""

    prefix = CLIENT_USER_PREFIX
    what = "client"

    def key(self, record: Enrollment) -> str:
        return record.client_id

    def username(self, key: str) -> str:
        return client_username(key)

    def rules(self, record: Enrollment) -> list[str]:
        return client_acl_rules(record)

    def secret_sha256(self, record: Enrollment) -> str:
        if not record.secret_sha256:
            raise ValueError(f"client {record.client_id!r} has no credential to provision")
        return record.secret_sha256

    def client_users(self) -> set[str]:
        return self.present()

    def wanted(self, records: Iterable[Enrollment]) -> dict[str, Enrollment]:
        return super().wanted(e for e in records if e.secret_sha256)
