"""kombu's mutex without a Redis script (layer: workers, redis-py glue).

kombu's Redis transport guards its restore of unacked messages with redis-py's ``Lock``,
whose release is a Lua script (EVALSHA). A client agent's Redis user may run no script (a
script holds Redis for everyone until it ends: issue 20, H3), so the agent's first restore
failed with NOPERM and its worker stopped. ``TransactionLock`` is the same lock — taken by
``SET NX PX`` as before — released by a ``WATCH``/``GET``/``MULTI DEL EXEC``: deleted only
if it still holds this owner's token, and not if anyone touched it in between.
"""

from __future__ import annotations

from typing import Any, Literal

import redis
from redis.exceptions import LockError, LockNotOwnedError, WatchError
from redis.lock import Lock


class TransactionLock(Lock):
    """redis-py's ``Lock``, released by a transaction instead of its Lua script. Extending or
    reacquiring it (which kombu never does) is refused rather than done by a script."""

    def do_release(self, expected_token: str) -> None:
        # The client may add a key prefix (kombu's PrefixedStrictRedis) to the commands it
        # knows, which do not include GET: name the full key on a plain client instead.
        key = getattr(self.redis, "global_keyprefix", "") + str(self.name)
        plain = redis.Redis(connection_pool=self.redis.connection_pool)
        token = (
            expected_token if isinstance(expected_token, bytes) else str(expected_token).encode()
        )  # bytes in fact
        with plain.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key)
                held = pipe.get(key)
                if held is None or (held if isinstance(held, bytes) else str(held).encode()) != token:
                    raise LockNotOwnedError("cannot release a lock that is no longer owned", lock_name=key)
                pipe.multi()
                pipe.delete(key)
                pipe.execute()
            except WatchError:
                raise LockNotOwnedError(
                    "the lock changed hands while it was released", lock_name=key
                ) from None

    def do_extend(self, additional_time: Any, replace_ttl: bool) -> Literal[True]:
        raise LockError("this lock cannot be extended (it would take a Redis script)", lock_name=self.name)

    def do_reacquire(self) -> Literal[True]:
        raise LockError("this lock cannot be reacquired (it would take a Redis script)", lock_name=self.name)


class ScriptFreeLocks:
    """Mixed into a redis-py client: its ``lock()`` makes ``TransactionLock``s."""

    def lock(self, name: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("lock_class", TransactionLock)
        return super().lock(name, *args, **kwargs)  # type: ignore[misc]
