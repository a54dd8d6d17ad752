"""The one way every component reaches Redis (layer: workers, redis-py and kombu glue).

A Redis URL is either one server (``redis://`` / ``rediss://``) or kombu's Sentinel form,
``sentinel://[user:pass@]h1:26379;sentinel://h2:26380;sentinel://h3:26381[/db][?tls options]``,
with the master's name from the setting ``redis_sentinel_master`` (env
``VANCETOPE_REDIS_SENTINEL_MASTER``, default ``mymaster``). The brain, pools, beat, gateway,
CLI, Python API and client agents all ask here for a redis-py client (``redis_client``,
``async_redis_client``) or for their Celery broker settings (``broker_settings``), so a
failover is followed the same way everywhere: redis-py's and kombu's Sentinel pools ask
the sentinels for the master again whenever a connection is lost or the node they reach
has become a replica.

Credentials and TLS options are those of the data nodes, and travel with every master
the sentinels name (``master_for`` with the same username, password and ``ssl_*``
arguments), so a client's ACL user and certificate checks survive a failover. The
sentinels get the same credential, the socket and the TLS options (``sentinel_kwargs``):
each component is a user of the sentinels too, allowed there only to ask where the master
is (brain.hot.sentinel_acl), because a sentinel that anyone may command can name a master
of an attacker's, which then collects every reconnecting component's password.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Sequence
from typing import Any, Final

import redis
import redis.asyncio
import redis.asyncio.sentinel
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool

from workers.urls import SentinelUrl, is_sentinel_url, parse_sentinel_url

DEFAULT_SENTINEL_MASTER: Final = "mymaster"
SENTINEL_MASTER_VARIABLE: Final = "VANCETOPE_REDIS_SENTINEL_MASTER"

# A sentinel answers at once or not at all: a hung one must not hold a component (the brain's
# hot state has 30 s) before it asks the next.
SENTINEL_SOCKET_TIMEOUT_S: Final = 5.0
_PROBE_TIMEOUTS: Final = {
    "socket_timeout": SENTINEL_SOCKET_TIMEOUT_S,
    "socket_connect_timeout": SENTINEL_SOCKET_TIMEOUT_S,
}


# The process's master name when the caller gives none: brain.config.load_settings sets it
# from the settings (vancetope.toml too, not only the environment), so the CLI and the Python
# API connect to the master the settings name.
_default_master: str | None = None


def set_default_master(name: str) -> None:
    """The master name ``redis_client`` and ``broker_settings`` use when not told one."""
    global _default_master
    _default_master = name


def master_name(explicit: str | None = None) -> str:
    """``explicit``, else the process's setting, else ``VANCETOPE_REDIS_SENTINEL_MASTER``, else ``mymaster``."""
    return explicit or _default_master or os.environ.get(SENTINEL_MASTER_VARIABLE) or DEFAULT_SENTINEL_MASTER


def sentinel_credentials(target: SentinelUrl) -> dict[str, Any]:
    """The URL's user and password, which the sentinels check as the data nodes do (the same
    user on both: one credential per component). None in the URL: none sent (sentinels whose
    default user is open, as a test's or a laptop's may be)."""
    return {k: v for k, v in target.node_kwargs().items() if k in ("username", "password")}


def _sentinel_kwargs(target: SentinelUrl, options: dict[str, Any]) -> dict[str, Any]:
    """What the sentinels get: the credential, the socket options (timeouts at most
    ``SENTINEL_SOCKET_TIMEOUT_S``) and TLS."""
    socket = {k: v for k, v in options.items() if k.startswith("socket_")}
    for name in _PROBE_TIMEOUTS:
        socket[name] = min(socket.get(name) or SENTINEL_SOCKET_TIMEOUT_S, SENTINEL_SOCKET_TIMEOUT_S)
    return {**socket, **target.tls_kwargs(), **sentinel_credentials(target)}


def _sentinel_args(url: str, options: dict[str, Any]) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """Sentinel(...)'s arguments, sync or async alike: the sentinels and the keyword arguments
    (the data nodes' credentials and TLS with ``options``; the sentinels' own)."""
    target = parse_sentinel_url(url)
    kwargs = {**target.node_kwargs(), **options, "sentinel_kwargs": _sentinel_kwargs(target, options)}
    return list(target.sentinels), kwargs


class SentinelsRefusedCredential(MasterNotFoundError, redis.AuthenticationError):
    """No sentinel named the master, and at least one refused this credential (WRONGPASS,
    NOAUTH): to a client agent the same answer as a data node refusing it — not enrolled, or
    revoked — rather than an outage to wait out (``except redis.AuthenticationError``)."""


def _names_a_refusal(exc: MasterNotFoundError) -> bool:
    # redis-py names each sentinel's error in the message, its only record of them (8.2:
    # "auth:AuthenticationError: invalid username-password pair ...")
    return "AuthenticationError" in str(exc)


class _Sentinel(Sentinel):
    """redis-py's Sentinel, telling a refused credential from an outage. Sentinels keep the
    users the brain gives them in their config file, but one started from a config written
    anew, with the brain away, refuses every client for a while: so when every sentinel refuses
    and the master last found still takes the credential, it is an outage (retried), not a
    revocation (the agent would stop for good)."""

    last_master: tuple[str, int] | None = None

    def discover_master(self, service_name: str) -> tuple[str, int]:
        try:
            found: tuple[str, int] = super().discover_master(service_name)
        except MasterNotFoundError as exc:
            if _names_a_refusal(exc) and not self._last_master_takes_us():
                raise SentinelsRefusedCredential(str(exc)) from None
            raise
        self.last_master = found
        return found

    def _last_master_takes_us(self) -> bool:
        if self.last_master is None:
            return False
        host, port = self.last_master
        probe = redis.Redis(host=host, port=port, **{**self.connection_kwargs, **_PROBE_TIMEOUTS})
        try:
            return bool(probe.ping())
        except redis.AuthenticationError:
            return False
        except redis.RedisError:
            return True  # unreachable: not a refusal either
        finally:
            probe.close()


class _AsyncSentinel(redis.asyncio.sentinel.Sentinel):
    async def discover_master(self, service_name: str) -> tuple[str, int]:
        try:
            return await super().discover_master(service_name)  # type: ignore[no-any-return]
        except MasterNotFoundError as exc:
            if _names_a_refusal(exc):
                raise SentinelsRefusedCredential(str(exc)) from None
            raise


class _MasterClient(redis.Redis):
    """The master's client; closing it closes its connections to the sentinels too."""

    sentinel_manager: Sentinel | None = None

    def close(self) -> None:
        super().close()
        for sentinel in self.sentinel_manager.sentinels if self.sentinel_manager else ():
            sentinel.close()


class _AsyncMasterClient(redis.asyncio.Redis):
    """The asyncio master's client; closing it closes its connections to the sentinels too."""

    sentinel_manager: redis.asyncio.sentinel.Sentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        for sentinel in self.sentinel_manager.sentinels if self.sentinel_manager else ():
            await sentinel.aclose()


def redis_client(url: str, *, master: str | None = None, **options: Any) -> redis.Redis:
    """A redis-py client for ``url`` (``options``: timeouts, decode_responses...). For a
    Sentinel URL it follows the master ``master`` (``master_name``) across failovers."""
    if not is_sentinel_url(url):
        return redis.Redis.from_url(url, **options)
    sentinels, kwargs = _sentinel_args(url, options)
    manager = _Sentinel(sentinels, **kwargs)
    client = manager.master_for(master_name(master), redis_class=_MasterClient)
    client.sentinel_manager = manager
    return client


def app_redis_client(app: Any, **options: Any) -> redis.Redis:
    """A redis-py client for a Celery app's own broker (its URL and, behind Sentinel, the master
    its transport options name), for what a worker writes beside kombu."""
    master = (app.conf.broker_transport_options or {}).get("master_name")
    return redis_client(app.conf.broker_url, master=master, **options)


def async_redis_client(url: str, *, master: str | None = None, **options: Any) -> redis.asyncio.Redis:
    """``redis_client`` for asyncio (the MCP gateway)."""
    if not is_sentinel_url(url):
        return redis.asyncio.Redis.from_url(url, **options)
    sentinels, kwargs = _sentinel_args(url, options)
    manager = _AsyncSentinel(sentinels, **kwargs)
    client = manager.master_for(master_name(master), redis_class=_AsyncMasterClient)
    client.sentinel_manager = manager
    return client


# What makes a connection to a data node what it is (who, how securely, how patiently); the
# pool's other keyword arguments are redis-py's and the Sentinel pool's own bookkeeping.
_NODE_KWARGS: Final = ("username", "password", "db", "credential_provider", "health_check_interval",
                       "client_name", "decode_responses", "encoding", "encoding_errors", "protocol")  # fmt: skip


def every_node(r: redis.Redis) -> list[redis.Redis]:
    """A client per data node behind ``r``: for a Sentinel client the master and every
    replica the sentinels list, each with ``r``'s credentials and TLS (the caller closes
    them); for a plain one, ``r`` itself. Redis replicates data, not ACL changes: what must
    hold after a failover (brain.hot.acl) is sent to each node."""
    pool = r.connection_pool
    if not isinstance(pool, SentinelConnectionPool):
        return [r]
    manager: Sentinel = pool.sentinel_manager
    addresses = [manager.discover_master(pool.service_name), *manager.discover_slaves(pool.service_name)]
    kwargs = {
        k: v
        for k, v in pool.connection_kwargs.items()
        if k in _NODE_KWARGS or k.startswith(("socket_", "ssl_"))
    }
    if issubclass(pool.connection_class, redis.SSLConnection):
        kwargs["ssl"] = True
    return [redis.Redis(host=host, port=port, **kwargs) for host, port in dict.fromkeys(addresses)]


def every_sentinel(r: redis.Redis) -> list[redis.Redis]:
    """A client per sentinel ``r``'s URL names, each with ``r``'s sentinel credential and TLS
    (the caller closes them); none for a plain client. Redis replicates no ACL change between
    sentinels either: a user the sentinels must know (brain.hot.sentinel_acl) is sent to each.
    Only those the URL names, never those the sentinels list (``SENTINEL SENTINELS``): a
    sentinel learns its peers from hello messages on the master, which any user allowed to
    publish there can forge, and the brain's credential would go to the forger."""
    pool = r.connection_pool
    if not isinstance(pool, SentinelConnectionPool):
        return []
    manager: Sentinel = pool.sentinel_manager
    addresses = dict.fromkeys(node_address(s) for s in manager.sentinels)
    # Short timeouts: the brain's user sync asks each in turn, and a hung one must not hold a sweep.
    kwargs = {**manager.sentinel_kwargs, "socket_timeout": 2.0, "socket_connect_timeout": 2.0}
    return [redis.Redis(host=host, port=port, **kwargs) for host, port in addresses]


def node_address(r: redis.Redis) -> tuple[str, int]:
    """(host, port) a plain client connects to, for logs and for telling nodes apart."""
    kwargs = r.connection_pool.connection_kwargs
    return str(kwargs.get("host", "?")), int(kwargs.get("port", 0))


# The class kombu builds a Sentinel-following channel with, guarded as workers.transport's.
SENTINEL_TRANSPORT_PATH: Final = "workers.transport:GuardedSentinelTransport"


def broker_settings(url: str, master: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Celery settings, transport options) that reach the broker at ``url``. For a Sentinel
    URL: its canonical form (``SentinelUrl.url``: kombu reads credentials, database and TLS
    options from the first part), the guarded Sentinel transport, and ``master_name`` and
    ``sentinel_kwargs`` (the credential and TLS) in the options."""
    if not is_sentinel_url(url):
        return {"broker_url": url}, {}
    target = parse_sentinel_url(url)
    options: dict[str, Any] = {"master_name": master_name(master)}
    to_sentinels = {**target.tls_kwargs(), **sentinel_credentials(target)}
    if to_sentinels:
        options["sentinel_kwargs"] = to_sentinels
    settings = {
        "broker_url": target.url(),
        "broker_transport": SENTINEL_TRANSPORT_PATH,
        "broker_failover_strategy": stay_on_first,
    }
    return settings, options


def stay_on_first(urls: Sequence[str]) -> Iterator[str]:
    """Celery's failover strategy for a Sentinel URL: always its first part. The parts are the
    sentinels, which kombu's Sentinel channel already asks in turn; kombu's own round robin
    would reconnect with a later part, which lacks the database and TLS options the canonical
    form keeps on the first (``SentinelUrl.url``)."""
    return itertools.repeat(urls[0])


__all__ = [
    "DEFAULT_SENTINEL_MASTER",
    "SENTINEL_MASTER_VARIABLE",
    "SENTINEL_TRANSPORT_PATH",
    "SentinelsRefusedCredential",
    "app_redis_client",
    "async_redis_client",
    "broker_settings",
    "every_node",
    "every_sentinel",
    "is_sentinel_url",
    "master_name",
    "node_address",
    "redis_client",
    "sentinel_credentials",
    "set_default_master",
    "stay_on_first",
]
