"""A remote's "not now": HTTP 429 Too Many Requests with ``Retry-After`` (layer: workers; pure).

``http_get`` and the MCP client (``workers.mcp_clients``) fail such a call with
``ToolFailed(status=429, retry_after_s=N)``; whoever records the failure pauses the budget of
that server (``brain.hot.gate.Gate.pause``) until then, across every pool process, and the
retry policy decides whether the call is tried again (not before that time). ``http_get``
names the origin that answered (``origin="https://api.example.com:443"``): one site's 429
pauses the calls to that site, not every ``http_get``. docs/fair-share.md.
"""

from __future__ import annotations

import email.utils
import math
from typing import Any
from urllib.parse import urlsplit

from workers.tools.http_headers import origin_of

TOO_MANY_REQUESTS = 429
# The longest pause a server may ask for: a Retry-After of a week (or a garbled date far ahead)
# must not stop a server's calls for good; past this the retry policy and the limits decide.
MAX_PAUSE_S = 3600.0


def retry_after_s(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delay-seconds or an HTTP-date), at most
    ``MAX_PAUSE_S``; None when there is none or it cannot be read."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        seconds = float(text)
    else:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None or when.tzinfo is None:
            return None
        seconds = when.timestamp() - now
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_PAUSE_S)


def url_origin(url: Any) -> str | None:
    """The origin of an http(s) URL as ``scheme://host:port`` (lowercase, the default port
    written out), the form a 429's pause is keyed by; None for anything else."""
    if not isinstance(url, str):
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return None
    return str(origin_of(parts.scheme, parts.hostname, port))


def throttled_data(
    status: int, retry_after: str | None, now: float, url: str | None = None
) -> dict[str, Any]:
    """The error data of a call that failed with HTTP ``status``: the status, and for a 429
    with a readable ``Retry-After`` the seconds it names (``retry_after_s``) and the origin of
    ``url``, the one that answered (``origin``)."""
    data: dict[str, Any] = {"status": status}
    if status == TOO_MANY_REQUESTS:
        seconds = retry_after_s(retry_after, now)
        if seconds is not None:
            data["retry_after_s"] = seconds
            origin = url_origin(url)
            if origin is not None:
                data["origin"] = origin
    return data


def pause_asked(data: Any) -> float | None:
    """The seconds a failed call's error data asks its server to be left alone (a 429 with
    ``Retry-After``); None when it asks nothing."""
    if not isinstance(data, dict) or data.get("status") != TOO_MANY_REQUESTS:
        return None
    seconds = data.get("retry_after_s")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return None
    return min(max(float(seconds), 0.0), MAX_PAUSE_S)


__all__ = ["MAX_PAUSE_S", "TOO_MANY_REQUESTS", "pause_asked", "retry_after_s", "throttled_data", "url_origin"]
