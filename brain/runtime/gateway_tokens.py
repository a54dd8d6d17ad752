"""Gateway tokens (layer: brain/runtime; store glue): one per user, kept only as a SHA-256.

``vancetope users token U`` issues one (printing it once), ``--revoke`` deletes it; the
gateway turns a request's ``Authorization: Bearer <token>`` into the user it acts for.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

from brain.core.models import GatewayToken
from brain.store import Store

TOKEN_PREFIX = "vtg_"
TOKEN_VARIABLE = "VANCETOPE_GATEWAY_TOKEN"


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue(store: Store, user: str, now: float | None = None) -> str:
    """A new token for ``user``; the old one, if any, stops working."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    store.put_gateway_token(
        GatewayToken(user=user, token_sha256=token_sha256(token), created_at=now or time.time())
    )
    return token


def revoke(store: Store, user: str) -> bool:
    return store.delete_gateway_token(user)


def user_of(store: Store, token: str) -> str | None:
    """The user ``token`` belongs to, or None."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 256:
        return None
    digest = token_sha256(token)
    record = store.find_gateway_token(digest)
    # The store matched on the digest; compare again in constant time all the same.
    if record is None or not hmac.compare_digest(record.token_sha256, digest):
        return None
    return record.user


__all__ = ["TOKEN_PREFIX", "TOKEN_VARIABLE", "issue", "revoke", "token_sha256", "user_of"]
