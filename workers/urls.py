"""Broker and store URLs (layer: workers, pure): one redactor for everything printed or
logged, the one way to put a user's credentials into a Redis URL, and the one check that
a Redis URL is usable (``rediss://`` must verify the server's certificate)."""

from __future__ import annotations

from urllib.parse import parse_qs, quote, urlsplit, urlunsplit


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (user, host, path and query kept)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.netloc.rsplit("@", 1)[0].split(":", 1)[0]
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


def with_credentials(url: str, username: str, password: str) -> str:
    """``url`` (redis:// or rediss://, query kept) with this user's credentials instead of its own."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    userinfo = f"{quote(username, safe='')}:{quote(password, safe='')}@"
    return urlunsplit((parts.scheme, userinfo + host, parts.path, parts.query, parts.fragment))


def without_credentials(url: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def check_redis_url(url: str) -> str:
    """``url`` if it is a redis:// or rediss:// URL with a host; a ``rediss://`` URL must ask for
    certificate checks (docs/security.md: without ``ssl_cert_reqs`` redis-py does not check)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise ValueError(f"must be a redis:// or rediss:// URL with a host, got {redact_url(url)!r}")
    if parts.scheme == "rediss":
        reqs = parse_qs(parts.query).get("ssl_cert_reqs", [""])[0].lower()
        if reqs not in ("required", "cert_required"):
            raise ValueError(
                "a rediss:// URL must end with ?ssl_cert_reqs=required so the certificate is checked "
                "(add &ssl_ca_certs=/path/ca.crt for a private certificate authority)"
            )
    return url
