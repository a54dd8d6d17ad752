"""The CSRF check of the web view's actions (layer: brain/web; pure but for the random key).

The Guard already refuses a POST whose Origin (or Referer) is not this host; this is the
second half. Each browser gets a random session cookie (``vt_session``: HttpOnly,
SameSite=Strict), and every form of a page carries the token for that cookie: an HMAC of the
cookie's value under a key this process drew at start. An action is done only when the token
it posts is the one for the cookie it sends. Another site can make a browser send the cookie
but cannot read the page to learn the token, and a cookie it plants (a neighbouring port or
subdomain can set one) gets it nowhere without the key. A restarted web process draws a new
key: a page opened before says "reload the page" when used.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

COOKIE = "vt_session"
FIELD = "csrf"
HEADER = "x-csrf-token"


class Csrf:
    def __init__(self, key: bytes | None = None) -> None:
        self.key = key or secrets.token_bytes(32)

    def token(self, session: str) -> str:
        """The token a page gives its forms, for the browser whose cookie is ``session``."""
        return hmac.new(self.key, session.encode(), hashlib.sha256).hexdigest()

    @staticmethod
    def new_session() -> str:
        return secrets.token_urlsafe(24)

    def valid(self, session: str | None, token: str | None) -> bool:
        """Whether ``token`` (posted) is the one for ``session`` (the cookie sent with it)."""
        if not session or not token:
            return False
        return hmac.compare_digest(self.token(session), token)

    @staticmethod
    def cookie(session: str) -> str:
        """The Set-Cookie value: unreadable by scripts, never sent by another site's request."""
        return f"{COOKIE}={session}; Path=/; HttpOnly; SameSite=Strict"
