"""The broker cannot be reached: say once, in one line, what to do (layer: client_agent).

The heartbeat, the announcer and Celery's consumer each retry a broker that refuses
connections or went away, and each used to log every attempt (``Error 111 connecting to
127.0.0.1:55805`` for ever, issue 22). One ``BrokerOutage`` per agent says what to do the
first time any of them fails, and nothing more until the broker answered again.
"""

from __future__ import annotations

import logging
import threading

import redis

from workers.urls import url_address

log = logging.getLogger("vancetope.agent")

# Celery's consumer logs each failed attempt to reach the broker on this logger, starting so.
CELERY_CONSUMER_LOGGER = "celery.worker.consumer.consumer"
_CELERY_CANNOT_CONNECT = "consumer: Cannot connect to"


def is_outage(exc: BaseException) -> bool:
    """A broker that refuses the connection, drops it or does not answer (not one that
    answered with an error, nor refused the credentials: those are said otherwise)."""
    return isinstance(exc, (redis.ConnectionError, redis.TimeoutError)) and not isinstance(
        exc, redis.AuthenticationError
    )


def broker_address(broker_url: str) -> str:
    """``host:port`` of a broker URL, never its credentials."""
    return url_address(broker_url)


class BrokerOutage:
    """Shared by the agent's threads: ``lost`` logs the hint when an outage begins, ``restored``
    when it ends; in between every failure is silent (they are retried all the same)."""

    def __init__(self, broker_url: str, client_id: str, user: str) -> None:
        self.address = broker_address(broker_url)
        self.client_id = client_id
        self.user = user
        self._lock = threading.Lock()
        self._down = False

    def hint(self) -> str:
        return (
            f"cannot reach the broker at {self.address}: is the stack running (`vancetope up`)? "
            "if its address changed, enroll again: "
            f"`vancetope clients enroll {self.client_id} --user {self.user} --output FILE`"
        )

    @property
    def down(self) -> bool:
        return self._down

    def lost(self, exc: object) -> None:
        with self._lock:
            first, self._down = not self._down, True
        if first:
            log.error("%s (%s); retrying", self.hint(), exc)

    def restored(self) -> None:
        with self._lock:
            was, self._down = self._down, False
        if was:
            log.info("the broker at %s answers again", self.address)

    def celery_filter(self) -> logging.Filter:
        """A filter for Celery's consumer logger: its "Cannot connect to …" line, logged at each
        retry, becomes this outage's one line."""
        outage = self

        class _CannotConnect(logging.Filter):
            def filter(self, record: logging.LogRecord) -> bool:
                message = record.getMessage()
                if not message.startswith(_CELERY_CANNOT_CONNECT):
                    return True
                # "consumer: Cannot connect to redis://u:**@host:port/0: Error 111 ….\nTrying again …"
                outage.lost(message.split("\n", 1)[0].rsplit(": ", 1)[-1].rstrip("."))
                return False

        return _CannotConnect()
