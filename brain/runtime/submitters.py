"""Submit credentials bound to one user (layer: brain/runtime; pure rules, then the Redis/store glue).

Issue 20 (H5): one shared submitter user let any app submit a tree *as anyone* (``user: bob``
in the message), so it ran on bob's workstation. Now `vancetope submit-url --user U` issues a
credential for U only: Redis ACL user ``vts-<U>``, which may put messages on queue
``submit.<U>`` and nothing else. The brain consumes each such queue with the user bound to
the queue it came through (``brain.runtime.submit_queue``), never to what a message says. As for the
per-client users (``brain.hot.acl``), the store holds the user and the SHA-256 of the secret; the
ACL user is derived from it, so a Redis restart loses nothing the brain cannot put back
(``SubmitterUsers.sync``), and the secret itself is never stored.
"""

from __future__ import annotations

import time

import redis

from brain.core.models import SubmitCredential
from brain.hot.acl import StoreUsers, new_secret, secret_sha256
from brain.store import Store
from workers.contracts import submit_queue_of

SUBMIT_USER_PREFIX = "vts-"
# What kombu does to send a task: SADD/SMEMBERS the exchange's binding set, then LPUSH the
# queue (in MULTI when it declares). Nothing reads a queue, nothing touches another key.
SUBMIT_COMMANDS: tuple[str, ...] = (
    "lpush", "llen", "sadd", "smembers", "multi", "exec", "discard",
    "ping", "select", "echo", "info", "client|setname", "client|setinfo", "client|id",
)  # fmt: skip
# After the queue's name: kombu's priority suffix (``\x06\x16<n>``) may follow, never a character
# a user name may hold, so ``submit.alice`` never reaches ``submit.alice2``'s queue.
_NOT_A_NAME_CHAR = "[^-A-Za-z0-9_.]"  # "-" first: after a character it would make a range


def submit_username(user: str) -> str:
    submit_queue_of(user)  # validates the name
    return SUBMIT_USER_PREFIX + user


def submitter_acl_rules(credential: SubmitCredential) -> list[str]:
    """The ACL SETUSER rules of one user's submit credential: its queue only, no channel.
    ``reset`` first, so a new credential replaces the old and nothing granted before survives."""
    queue = submit_queue_of(credential.user)
    return [
        "reset",
        "on",
        f"#{credential.secret_sha256}",
        f"~{queue}",
        f"~{queue}{_NOT_A_NAME_CHAR}*",
        f"~_kombu.binding.{queue}",
        f"~_kombu.binding_permanent.{queue}",  # newer kombu keeps a second binding set
        "resetchannels",
        "-@all",
        *(f"+{command}" for command in SUBMIT_COMMANDS),
    ]


class SubmitterUsers(StoreUsers[SubmitCredential]):
    """The submit ACL users on one Redis (and its sentinels), kept equal to the store's submit
    credentials."""

    prefix = SUBMIT_USER_PREFIX
    what = "submit credential"

    def key(self, record: SubmitCredential) -> str:
        return record.user

    def username(self, key: str) -> str:
        return submit_username(key)

    def rules(self, record: SubmitCredential) -> list[str]:
        return submitter_acl_rules(record)

    def secret_sha256(self, record: SubmitCredential) -> str:
        return record.secret_sha256


def issue(store: Store, r: redis.Redis, user: str, now: float | None = None) -> str:
    """A new submit credential for ``user`` (the old one, if any, stops working): recorded in
    the store (its SHA-256 only), then made an ACL user. Returns the secret, shown once."""
    secret = new_secret()
    credential = SubmitCredential(
        user=user, secret_sha256=secret_sha256(secret), created_at=now or time.time()
    )
    store.put_submitter(credential)
    SubmitterUsers(r).provision(credential)
    return secret


def revoke(store: Store, r: redis.Redis, user: str) -> bool:
    found = store.delete_submitter(user)
    SubmitterUsers(r).revoke(user)
    return found


__all__ = [
    "SUBMIT_USER_PREFIX", "SubmitterUsers", "issue", "revoke", "submit_username", "submitter_acl_rules",
]  # fmt: skip
