"""Who may read the web view (layer: brain/web; an ASGI middleware in front of every route).

The rules are Flower's (``brain.stack.flowerauth``, ``brain.stack.webauth``): every request
needs the password (HTTP basic), on loopback too; on loopback the Host header must name
loopback or the listening address (any other name reaching 127.0.0.1 is DNS rebinding: 421);
and a request that could change something (any method but GET and HEAD) must come from a page
of this very host (Origin, else Referer) before its password is even looked at.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import Mapping
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from brain.stack.flowerauth import host_allowed

SAFE_METHODS = frozenset({"GET", "HEAD"})


def login(authorization: str | None, users: Mapping[str, str]) -> str | None:
    """The known user an ``Authorization: Basic`` header names with its password (both
    compared in constant time, so neither leaks by timing), else None."""
    if not authorization or not authorization.lower().startswith("basic "):
        return None
    try:
        user, sep, password = (
            base64.b64decode(authorization[6:].strip(), validate=True).decode().partition(":")
        )
    except (binascii.Error, UnicodeDecodeError):
        return None
    if not sep:
        return None
    ok = False
    for known, expected in users.items():
        ok |= secrets.compare_digest(user.encode(), known.encode()) & secrets.compare_digest(
            password.encode(), expected.encode()
        )
    return user if ok else None


def same_origin(headers: Headers) -> bool:
    """A state-changing request's Origin (or, without one, its Referer) is this host."""
    source = headers.get("origin") or headers.get("referer")
    if not source or source == "null":
        return False
    return urlsplit(source).netloc.lower() == headers.get("host", "").lower()


class Guard:
    """Host check, then (for unsafe methods) the origin check, then the password."""

    def __init__(self, app: ASGIApp, *, address: str, users: Mapping[str, str], unauthorized: str) -> None:
        if not users:
            raise ValueError("the web view never serves without a password")
        self.app, self.address, self.users, self.unauthorized = app, address, dict(users), unauthorized

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if not host_allowed(headers.get("host", ""), self.address):
            answer = PlainTextResponse(
                f"421 Misdirected Request: this web view answers only to its own address, not "
                f"{headers.get('host', '')!r}\n",
                status_code=421,
            )
        elif scope["method"] not in SAFE_METHODS and not same_origin(headers):
            answer = PlainTextResponse(
                "403 Forbidden: a request that changes something must come from this web view's own pages\n",
                status_code=403,
            )
        elif (user := login(headers.get("authorization"), self.users)) is None:
            answer = PlainTextResponse(
                self.unauthorized,
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="vancetope", charset="UTF-8"'},
            )
        else:
            # Who logged in, for what a page may show them (``request.state.login``).
            scope.setdefault("state", {})["login"] = user
            await self.app(scope, receive, send)
            return
        await answer(scope, receive, send)
