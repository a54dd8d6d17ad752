"""The ``http_get`` built-in (layer: workers, I/O around ``netguard``).

One job: GET an http(s) URL for a task without letting the task reach what only the
server can reach. The host is resolved once, every resolved address is judged by
``netguard.refusal``, and the connection goes to a judged address (the name is not
resolved again, so DNS cannot answer differently between check and connect). Each
redirect is followed by hand (at most ``MAX_REDIRECTS``) and judged the same way.
Proxy settings in the environment are not used: a proxy would connect on our behalf
to an address we never judged (a loopback proxy reaching internal hosts was seen).
The server's ``http_headers`` are added per hop for that hop's origin only
(``workers.tools.http_headers``): a redirect elsewhere does not carry them.
"""

from __future__ import annotations

import email.message
import http.client
import ipaddress
import socket
import ssl
import time
from typing import Any
from urllib.parse import SplitResult, urljoin, urlsplit

from workers.errors import InvalidArguments, ToolFailed
from workers.throttle import throttled_data
from workers.tools.http_headers import HEADERS_ENV_VAR, NO_HEADERS, HttpHeaders, origin_of
from workers.tools.netguard import HttpAllow, IPAddress, refusal

MAX_REDIRECTS = 5
REDIRECTS = frozenset({301, 302, 303, 307, 308})
_HEADERS_KEPT = ("content-type", "content-length", "last-modified", "etag", "location")
_BODY_HEAD = 500
_AGENT = "vancetope-http_get/1"


class DestinationRefused(ToolFailed):
    """The URL (or a redirect) leads to an internal address that is not allow-listed."""


def http_get(
    args: dict[str, Any], remaining_s: float, allow: HttpAllow, headers: HttpHeaders = NO_HEADERS
) -> dict[str, Any]:
    url = args["url"]
    deadline = time.monotonic() + max(0.001, min(float(args.get("timeout_s", 10.0)), remaining_s))
    max_bytes = int(args.get("max_bytes", 1_000_000))
    for hop in range(MAX_REDIRECTS + 1):
        parts = _parse(url, first=hop == 0)
        status, reason, answer, body = _fetch(url, parts, allow, deadline, max_bytes, headers)
        location = answer.get("location")
        if status in REDIRECTS and location:
            url = urljoin(url, location)
            continue
        if not 200 <= status < 300:
            head = body[:_BODY_HEAD].decode("utf-8", "replace")
            # A 429's Retry-After pauses the calls to this origin until then (workers.throttle).
            data = throttled_data(status, answer.get("retry-after"), time.time(), url)
            raise ToolFailed(f"http_get: {url} answered HTTP {status} {reason}: {head}", **data)
        return _http_value(status, answer, body, max_bytes)
    raise ToolFailed(f"http_get: {args['url']} redirected more than {MAX_REDIRECTS} times; gave up at {url}")


def _parse(url: str, *, first: bool) -> SplitResult:
    parts = urlsplit(url)
    if parts.scheme in ("http", "https") and parts.hostname:
        return parts
    message = f"http_get: url must be an http:// or https:// URL with a host, got {url!r}"
    if first:
        raise InvalidArguments(message, field="url")
    raise ToolFailed(f"http_get: a redirect led to {url!r}, which is not an http(s) URL with a host")


def _fetch(
    url: str, parts: SplitResult, allow: HttpAllow, deadline: float, max_bytes: int, extra: HttpHeaders
) -> tuple[int, str, email.message.Message, bytes]:
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = _judged_addresses(url, host, port, allow, deadline)
    conn = _connection(parts.scheme, host, port, addresses, max(0.001, _left(deadline)))
    try:
        path = parts.path or "/"
        # Bound to scheme, host and port: a redirect to another origin sends none of them.
        origin = origin_of(parts.scheme, host, parts.port)
        mine = extra.for_origin(origin, all_loopback=all(address.is_loopback for address in addresses))
        sent = {**mine, "User-Agent": _AGENT}
        conn.request("GET", f"{path}?{parts.query}" if parts.query else path, headers=sent)
        response = conn.getresponse()
        body = response.read(max_bytes + 1)
        return response.status, response.reason, response.headers, body
    except (OSError, http.client.HTTPException) as exc:
        raise ToolFailed(f"http_get: {url} failed: {exc}") from exc
    finally:
        conn.close()


def _judged_addresses(url: str, host: str, port: int, allow: HttpAllow, deadline: float) -> list[IPAddress]:
    """Every address ``host`` resolves to, or DestinationRefused if any of them is refused."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ToolFailed(f"http_get: {url} failed: cannot resolve {host!r}: {exc}") from exc
    addresses = list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos))
    for address in addresses:
        kind = refusal(host, address, allow)
        if kind is not None:
            where = f"{address} is" if host == str(address) else f"{host!r} resolves to {address},"
            raise DestinationRefused(
                f"http_get: refusing {url}: {where} {kind}. Server tools may not reach internal "
                "addresses; to allow this target, add the host or its network to the server's "
                "http_allow setting (VANCETOPE_HTTP_ALLOW, comma-separated)",
                url=url,
                host=host,
                address=str(address),
            )
    if _left(deadline) <= 0:
        raise ToolFailed(f"http_get: {url} failed: timed out")
    return addresses


class _PinnedHTTP(http.client.HTTPConnection):
    """Connects to judged addresses only; Host header and URL keep the name."""

    def __init__(self, host: str, port: int, addresses: list[IPAddress], timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.addresses = addresses

    def connect(self) -> None:
        self.sock = _connect_any(self.addresses, self.port, self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """As ``_PinnedHTTP``, with TLS verified against the host name (SNI too)."""

    def __init__(self, host: str, port: int, addresses: list[IPAddress], timeout: float) -> None:
        self.tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self.tls)
        self.addresses = addresses

    def connect(self) -> None:
        sock = _connect_any(self.addresses, self.port, self.timeout)
        self.sock = self.tls.wrap_socket(sock, server_hostname=self.host)


def _connection(
    scheme: str, host: str, port: int, addresses: list[IPAddress], timeout: float
) -> http.client.HTTPConnection:
    cls = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
    return cls(host, port, addresses, timeout)


def _connect_any(addresses: list[IPAddress], port: int, timeout: float | None) -> socket.socket:
    error: OSError = OSError("no address to connect to")
    for address in addresses:
        try:
            return socket.create_connection((str(address), port), timeout)
        except OSError as exc:
            error = exc
    raise error


def _left(deadline: float) -> float:
    return deadline - time.monotonic()


def _http_value(status: int, headers: email.message.Message, body: bytes, max_bytes: int) -> dict[str, Any]:
    charset = headers.get_content_charset() or "utf-8"
    try:
        text = body[:max_bytes].decode(charset, "replace")
    except LookupError:
        text = body[:max_bytes].decode("utf-8", "replace")
    kept = {name: headers[name] for name in _HEADERS_KEPT if headers.get(name) is not None}
    return {"status": status, "headers": kept, "text": text, "truncated": len(body) > max_bytes}


__all__ = ["HEADERS_ENV_VAR", "NO_HEADERS", "DestinationRefused", "HttpHeaders", "http_get"]
