"""Broker and store URLs (layer: workers, pure): one redactor for everything printed or
logged, and the one way to put a user's credentials into a Redis URL."""

from __future__ import annotations

from urllib.parse import quote, urlsplit, urlunsplit


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
