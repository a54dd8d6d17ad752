"""Send a transaction now, read its reply later (layer: workers, Redis glue).

On a workstation 50 ms from Redis, every reply a call waits for costs it 100 ms. A client
agent's run writes two things that need no answer before its tool starts: kombu's record of
the reserved message (the unacked hash) and the run's begin (the cancel check, the delivery
count, the mark; ``workers.tasks.begin_commands``). ``SentAhead.send`` writes a
``MULTI ... EXEC``'s bytes to a connection of the pool on the calling thread, so they have
left the process before the caller goes on (an agent killed a moment later has sent them all
the same: the kernel delivers what was written), and a reader thread takes the replies; the
returned future holds ``EXEC``'s replies.

Only the waiting moves: Redis runs each transaction whole, as a pipeline's would be, and a
caller that needs the answer (an ack, a restored message's poison count) waits for the future.
No WATCH and no Lua: a client's Redis user may run no script.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import redis

Command = tuple[Any, ...]
T = TypeVar("T")


class SentAhead:
    """Transactions sent on the caller's thread, their replies read on ``threads`` of its own."""

    def __init__(self, name: str, threads: int = 2) -> None:
        self._readers = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)

    def send(
        self, pool: redis.ConnectionPool, commands: Sequence[Command], answer: Callable[[list[Any]], T]
    ) -> Future[T]:
        """Write ``MULTI``, ``commands``, ``EXEC`` to a connection of ``pool`` now; the future
        holds ``answer`` of ``EXEC``'s replies, or the error that kept them (a command Redis
        refused, a lost connection). A connection error while writing is raised here."""
        connection = pool.get_connection()
        try:
            connection.send_packed_command(connection.pack_commands([("MULTI",), *commands, ("EXEC",)]))
        except BaseException:
            connection.disconnect()
            pool.release(connection)
            raise
        return self._readers.submit(lambda: answer(_read_exec(pool, connection, len(commands))))

    def close(self) -> None:
        # Replies still on their way are read to the end (each is bounded by the socket timeout).
        self._readers.shutdown(wait=False)


def _read_exec(pool: redis.ConnectionPool, connection: Any, queued: int) -> list[Any]:
    try:
        for _ in range(queued + 1):  # MULTI's OK, then QUEUED for each; a refused one raises
            connection.read_response()
        replies = connection.read_response()
    except BaseException:
        # Replies may be left unread on it: never hand the connection out again.
        connection.disconnect()
        raise
    finally:
        pool.release(connection)
    if not isinstance(replies, list):
        raise redis.ResponseError(f"EXEC answered {replies!r}")
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies
