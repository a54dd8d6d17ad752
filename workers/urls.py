"""Broker and store URLs (layer: workers, pure): one redactor for everything printed or
logged, the one way to put a user's credentials into a Redis URL, and the one check that
a Redis URL is usable (``rediss://`` must verify the server's certificate).

A Redis URL is one server (``redis://``, ``rediss://``) or kombu's Sentinel form,
``sentinel://[user:pass@]h1:26379;sentinel://h2:26380;...[/db][?ssl_cert_reqs=required&...]``
(``workers.redis_connect`` connects to either). Every function here treats each
``;``-separated part of a Sentinel URL as kombu does.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit, urlunsplit

SENTINEL_SCHEME: Final = "sentinel"
DEFAULT_SENTINEL_PORT: Final = 26379
# The TLS options a URL's query may carry (redis-py's names, as in a rediss:// URL).
TLS_OPTIONS: Final = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")
_CERT_REQS: Final = {"required": ssl.CERT_REQUIRED, "cert_required": ssl.CERT_REQUIRED}


def is_sentinel_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() == SENTINEL_SCHEME


def _per_part(url: str, fn: Any) -> str:
    return ";".join(fn(part) for part in url.split(";")) if is_sentinel_url(url) else str(fn(url))


def _redact_one(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.netloc.rsplit("@", 1)[0].split(":", 1)[0]
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (user, host, path and query kept)."""
    return _per_part(url, _redact_one)


def _host_only(url: str) -> tuple[Any, str]:
    parts = urlsplit(url)
    return parts, parts.netloc.rsplit("@", 1)[-1]


def with_credentials(url: str, username: str, password: str) -> str:
    """``url`` (redis://, rediss:// or sentinel://, query kept) with this user's credentials
    instead of its own; on each part of a Sentinel URL, so whichever part is read has them."""

    def one(part: str) -> str:
        parts, host = _host_only(part)
        userinfo = f"{quote(username, safe='')}:{quote(password, safe='')}@"
        return urlunsplit((parts.scheme, userinfo + host, parts.path, parts.query, parts.fragment))

    return _per_part(url, one)


def without_credentials(url: str) -> str:
    def one(part: str) -> str:
        parts, host = _host_only(part)
        return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))

    return _per_part(url, one)


@dataclass(frozen=True)
class SentinelUrl:
    """A parsed ``sentinel://`` URL: where the sentinels listen, and how to talk to the data
    nodes (the master and its replicas)."""

    sentinels: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None
    db: int = 0
    tls: dict[str, str] = field(default_factory=dict)

    def node_kwargs(self) -> dict[str, Any]:
        """redis-py connection arguments for a data node."""
        kwargs: dict[str, Any] = {"db": self.db}
        if self.username is not None:
            kwargs["username"] = self.username
        if self.password is not None:
            kwargs["password"] = self.password
        return {**kwargs, **self.tls_kwargs()}

    def tls_kwargs(self) -> dict[str, Any]:
        if not self.tls:
            return {}
        kwargs: dict[str, Any] = {"ssl": True}
        for name, value in self.tls.items():
            if name == "ssl_cert_reqs":
                kwargs[name] = _CERT_REQS.get(value.lower(), value)
            elif name == "ssl_check_hostname":
                kwargs[name] = value.lower() in ("1", "true", "yes")
            else:
                kwargs[name] = value
        return kwargs

    def url(self) -> str:
        """The canonical form: credentials on every part (kombu reads the first's), the
        database and the TLS options on the first (kombu parses ``ssl_*`` from its query)."""
        creds = ""
        if self.password is not None:
            creds = f"{quote(self.username or '', safe='')}:{quote(self.password, safe='')}@"
        parts = [f"{SENTINEL_SCHEME}://{creds}{host}:{port}" for host, port in self.sentinels]
        parts[0] += f"/{self.db}" + (f"?{urlencode(self.tls)}" if self.tls else "")
        return ";".join(parts)


def parse_sentinel_url(url: str) -> SentinelUrl:
    """The sentinels, credentials, database and TLS options of a ``sentinel://`` URL, or a
    ValueError saying what is wrong. Credentials, a ``/db`` and a query may sit on any of the
    ``;``-separated parts."""
    sentinels: list[tuple[str, int]] = []
    username = password = None
    db = 0
    tls: dict[str, str] = {}
    for part in url.split(";"):
        parts = urlsplit(part.strip())
        if parts.scheme.lower() != SENTINEL_SCHEME or not parts.hostname:
            raise ValueError(
                f"each ';'-separated part of a Sentinel URL must be sentinel://host:port, got {_redact_one(part)!r}"
            )
        try:
            port = parts.port or DEFAULT_SENTINEL_PORT
        except ValueError:
            raise ValueError(f"bad port in the Sentinel URL part {_redact_one(part)!r}") from None
        sentinels.append((parts.hostname, port))
        if parts.password is not None and password is None:
            username = unquote(parts.username) if parts.username else None
            password = unquote(parts.password)
        path = parts.path.strip("/")
        if path:
            if not path.isdigit():
                raise ValueError(f"the database in a Sentinel URL must be a number, got {path!r}")
            db = int(path)
        for name, values in parse_qs(parts.query).items():
            if name not in TLS_OPTIONS:
                raise ValueError(
                    f"unknown option {name!r} in a Sentinel URL (known: {', '.join(TLS_OPTIONS)})"
                )
            tls[name] = values[-1]
    return SentinelUrl(tuple(sentinels), username, password, db, tls)


def url_password(url: str) -> str | None:
    """The password a Redis URL carries (any part of a Sentinel URL's), or None."""
    if is_sentinel_url(url):
        return parse_sentinel_url(url).password
    return urlsplit(url).password


def url_address(url: str) -> str:
    """Where a Redis URL points, never its credentials: ``host:port``, or the sentinels'."""
    if is_sentinel_url(url):
        hosts = ",".join(f"{h}:{p}" for h, p in parse_sentinel_url(url).sentinels)
        return f"sentinels {hosts}"
    parts = urlsplit(url)
    return f"{parts.hostname or '?'}:{parts.port or 6379}"


def _check_tls(query: str, what: str) -> None:
    reqs = parse_qs(query).get("ssl_cert_reqs", [""])[0].lower()
    if reqs not in ("required", "cert_required"):
        raise ValueError(
            f"{what} must end with ?ssl_cert_reqs=required so the certificate is checked "
            "(add &ssl_ca_certs=/path/ca.crt for a private certificate authority)"
        )


def check_redis_url(url: str) -> str:
    """``url`` if it is a redis://, rediss:// or sentinel:// URL with a host, on database 0;
    a ``rediss://`` URL, and a Sentinel URL with TLS options, must ask for certificate checks
    (docs/security.md: without ``ssl_cert_reqs`` redis-py does not check)."""
    if is_sentinel_url(url):
        target = parse_sentinel_url(url)
        if target.tls:
            _check_tls(urlencode(target.tls), "a Sentinel URL with TLS options")
        _check_database(target.db, url)
        return url
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise ValueError(
            f"must be a redis://, rediss:// or sentinel:// URL with a host, got {redact_url(url)!r}"
        )
    if parts.scheme == "rediss":
        _check_tls(parts.query, "a rediss:// URL")
    # redis-py reads the database from ?db= first, then from the path; kombu from the path.
    for given in (parts.path.strip("/"), *parse_qs(parts.query).get("db", [])):
        if given and not given.isdigit():
            raise ValueError(f"the database in {redact_url(url)!r} must be a number, got {given!r}")
        _check_database(int(given or 0), url)
    return url


def _check_database(db: int, url: str) -> None:
    """Vancetope's keys live in database 0 only: a client agent's Redis user may not SELECT
    (in another database its keys would be out of its quota's sight), and the stack's own
    users may subscribe only to Celery's channels of database 0 (``brain.hot.acl``). On any
    other database the stack would start and every agent would then be refused for good."""
    if db != 0:
        raise ValueError(
            f"{redact_url(url)!r} names database {db}; Vancetope keeps its keys in database 0 "
            "(client agents' Redis users may not SELECT another): use /0, and give Vancetope a "
            "Redis of its own if database 0 there is taken"
        )
