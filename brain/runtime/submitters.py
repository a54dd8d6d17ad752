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

import logging
import time
from collections.abc import Iterable

import redis

from brain.core.models import SubmitCredential
from brain.hot.acl import (
    delete_user,
    new_secret,
    on_every_node,
    save_acl,
    secret_sha256,
    set_user,
    users_named,
)
from brain.store import Store
from workers.contracts import submit_queue_of

log = logging.getLogger("vancetope.brain.submitters")

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


class SubmitterUsers:
    """The submit ACL users on one Redis (behind Sentinel: on each of its nodes), kept equal to
    the store's submit credentials."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = r

    def provision(self, credential: SubmitCredential) -> None:
        name, rules = submit_username(credential.user), submitter_acl_rules(credential)
        on_every_node(self.r, lambda node: set_user(node, name, rules))
        self._save()

    def revoke(self, user: str) -> bool:
        """Delete the user's ACL user, which also closes its open connections."""
        name = submit_username(user)
        deleted = on_every_node(self.r, lambda node: delete_user(node, name))[0]
        self._save()
        return deleted

    def present(self) -> set[str]:
        return users_named(self.r, SUBMIT_USER_PREFIX)

    def sync(self, credentials: Iterable[SubmitCredential]) -> None:
        """Create the ACL users the store says should exist and delete the rest, on each node."""
        wanted = {c.user: c for c in credentials}
        if any(on_every_node(self.r, lambda node: self._sync_node(node, wanted))):
            self._save()

    def _sync_node(self, node: redis.Redis, wanted: dict[str, SubmitCredential]) -> bool:
        present = users_named(node, SUBMIT_USER_PREFIX)
        for user in sorted(wanted.keys() - present):
            log.info("restoring the Redis ACL user of the submit credential of user %r", user)
            set_user(node, submit_username(user), submitter_acl_rules(wanted[user]))
        for user in sorted(present - wanted.keys()):
            log.warning(
                "deleting Redis ACL user %s: the store has no such submit credential", submit_username(user)
            )
            delete_user(node, submit_username(user))
        return bool(wanted.keys() ^ present)

    def _save(self) -> None:
        on_every_node(self.r, lambda node: save_acl(node, "submit users"))


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
