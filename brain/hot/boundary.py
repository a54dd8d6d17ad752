"""Redis errors, in words a user can act on (layer: brain/hot).

Every place that meets a refused or unreachable Redis and must tell a person turns the error
into a ``StackNotRunning`` here, so the CLI, the Python API and the gateway say the same thing.
"""

from __future__ import annotations

import redis

from brain.errors import StackNotRunning
from workers.urls import redact_url


def unreachable(redis_url: str, exc: redis.RedisError) -> StackNotRunning:
    """Redis's refusal in words a user can act on (the URL without its password)."""
    where = redact_url(redis_url)
    if isinstance(exc, redis.AuthenticationError | redis.exceptions.NoPermissionError):
        return StackNotRunning(
            f"Redis at {where} refused these credentials ({exc}); check the user and password"
        )
    hint = (
        " (certificate not trusted: point ssl_ca_certs in the URL at the CA that signed the server's certificate)"
        if "CERTIFICATE_VERIFY_FAILED" in str(exc)
        else "; is the stack running (`vancetope up`), or is VANCETOPE_REDIS_URL right?"
    )
    return StackNotRunning(f"cannot reach Redis at {where}: {str(exc).rstrip('.')}{hint}")
