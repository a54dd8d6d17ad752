"""Enrolling and revoking client agents (layer: brain/runtime; glue over the store, ACL users and
client work).

Enrollment records the client in the store (the record) with the SHA-256 of a new
secret, creates its Redis ACL user, and hands back the one URL the agent needs. The
secret is shown once and kept nowhere else. Revocation forgets the record, deletes the
ACL user (which drops its connections) and takes its work back as for a disconnect.
"""

from __future__ import annotations

from dataclasses import dataclass

from brain.core.models import Enrollment
from brain.hot.acl import AclUsers, client_username, new_secret, secret_sha256
from brain.hot.presence import PresenceBook
from brain.runtime.clientwork import ClientWork
from workers.urls import with_credentials

AGENT_URL_VARIABLE = "VANCETOPE_AGENT_BROKER_URL"


@dataclass(frozen=True)
class Credential:
    enrollment: Enrollment
    broker_url: str  # carries the secret: print it once, or write it to a 0600 file

    @property
    def env_line(self) -> str:
        return f"{AGENT_URL_VARIABLE}={self.broker_url}"


def enroll(presence: PresenceBook, client_id: str, user: str, address_url: str) -> Credential:
    """Enroll (or re-enroll, replacing the old secret) ``client_id`` for ``user``.
    ``address_url``: the Redis URL as agents reach it (credentials in it are ignored)."""
    secret = new_secret()
    enrollment = presence.enroll(client_id, user, secret_sha256=secret_sha256(secret))
    acl = AclUsers(presence.r)
    # Redis keeps connections open that were authenticated with the old secret: a running
    # agent went on taking calls it could no longer answer (its new connections refused), and
    # they stuck. Deleting the user first closes them; that agent then meets the refusal and
    # stops with the reason, as a revoked one does.
    acl.revoke(client_id)
    acl.provision(enrollment)
    return Credential(enrollment, with_credentials(address_url, client_username(client_id), secret))


def revoke(clients: ClientWork, client_id: str) -> bool:
    """Revoke ``client_id``: True if it was enrolled. Its unfinished calls come back as for a disconnect."""
    known = clients.store.delete_enrollment(client_id)
    AclUsers(clients.hot.r).revoke(client_id)
    clients.on_disconnected(client_id, None, "credential revoked")
    return known
