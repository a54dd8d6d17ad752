"""The headers ``http_get`` adds for an origin: the ``http_headers`` setting (layer: workers, pure).

One job: decide which configured headers (often ``Authorization: Bearer ${vault:TOKEN}``) one
request may carry. A header is bound to one origin — scheme, host and port — as a browser
binds a cookie: a key ``api.example.com`` means ``https://api.example.com:443``, a key
``https://api.example.com:8443`` that port only. Plain ``http://`` is accepted for loopback
hosts only (a test server, a local sidecar), because on any other network anyone on the path
reads the header. A redirect is a new request: it carries the headers of *its* origin, so a
redirect to another scheme, host or port drops them. Resolving ``${vault:NAME}`` happens per
request (``workers.secret_refs``); the values never appear in a task's arguments or result.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple
from urllib.parse import urlsplit

from workers.secret_refs import resolve

HEADERS_ENV_VAR = "VANCETOPE_HTTP_HEADERS"
_DEFAULT_PORTS = {"https": 443, "http": 80}


class Origin(NamedTuple):
    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback address literal (names other than localhost are not trusted)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def origin_of(scheme: str, host: str, port: int | None) -> Origin:
    scheme = scheme.lower()
    return Origin(scheme, host.lower().rstrip("."), port or _DEFAULT_PORTS.get(scheme, 0))


def parse_origin(key: str) -> Origin:
    """The origin a configuration key names; ValueError says what is wrong with it."""
    text = key.strip()
    if "://" not in text:
        text = "https://" + (f"[{text}]" if text.count(":") > 1 and not text.startswith("[") else text)
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"http_headers key {key!r} is not a host or an origin: {exc}") from None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise ValueError(
            f"http_headers key {key!r} is not a host or an origin (examples: api.example.com, "
            "https://api.example.com:8443, http://127.0.0.1:8080)"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"http_headers key {key!r}: give scheme://host[:port] only, without a path or user")
    origin = origin_of(parts.scheme, parts.hostname, port)
    if origin.scheme == "http" and not is_loopback_host(origin.host):
        raise ValueError(
            f"http_headers key {key!r}: headers are sent over https only (anyone on the network reads "
            f"plain http); use https://{parts.netloc}, or a loopback host for a local test server"
        )
    return origin


@dataclass(frozen=True)
class HttpHeaders:
    """Headers by origin. Build with ``parse`` or ``from_env``; ``for_origin`` is per request."""

    by_origin: Mapping[Origin, Mapping[str, str]] = field(default_factory=dict)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> HttpHeaders:
        raw = environ.get(HEADERS_ENV_VAR, "")
        return cls.parse(json.loads(raw) if raw else {})

    @classmethod
    def parse(cls, table: Mapping[str, Mapping[str, str]]) -> HttpHeaders:
        """From ``{"api.example.com": {"Authorization": "Bearer ${vault:T}"}}``; ValueError names
        a bad key, and two keys naming one origin."""
        by_origin: dict[Origin, dict[str, str]] = {}
        keys: dict[Origin, str] = {}
        for key, headers in table.items():
            origin = parse_origin(key)
            if origin in keys:
                raise ValueError(f"http_headers keys {keys[origin]!r} and {key!r} both name {origin}")
            keys[origin] = key
            by_origin[origin] = dict(headers)
        return cls(by_origin=by_origin)

    def for_origin(self, origin: Origin, *, all_loopback: bool) -> dict[str, str]:
        """The resolved headers for one request to ``origin``. Over plain http they are sent
        only when every address the host resolved to is loopback (``all_loopback``): a name
        like ``localhost`` must not carry them off the machine."""
        headers = self.by_origin.get(origin, {})
        if not headers or (origin.scheme != "https" and not all_loopback):
            return {}
        return {
            name: resolve(value, f"http_headers for {str(origin)!r} {name!r}")
            for name, value in headers.items()
        }


NO_HEADERS = HttpHeaders()

__all__ = [
    "HEADERS_ENV_VAR",
    "NO_HEADERS",
    "HttpHeaders",
    "Origin",
    "is_loopback_host",
    "origin_of",
    "parse_origin",
]
