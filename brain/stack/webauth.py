"""Who may open the web view (layer: brain/stack; a pure decision, then the secret file).

The same rules as Flower's (``brain.stack.password_door`` holds them; ``brain.stack.flowerauth``
says why): a password on every address, loopback included. Loopback is no boundary: every local user of the machine
reaches 127.0.0.1, and a web page the operator visits reaches it through DNS rebinding. The
web view shows every user's trees, tools, routes and errors, so it asks as Flower asks: the
operator's ``VANCETOPE_WEB_BASIC_AUTH`` (``user:password[,user:password...]``) if set, else user
``vancetope`` with a random password made on first use and kept in ``<data_dir>/web.secret``
(0600). The password reaches the web process in its environment, never on its command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from brain.stack import password_door
from brain.stack.password_door import DEFAULT_USER, Access, Door, Unprotected

WEB_USER = DEFAULT_USER
WEB_SECRET_FILE = "web.secret"
WEB_PORT = 8766
BASIC_AUTH_VARIABLE = "VANCETOPE_WEB_BASIC_AUTH"
# What the web process answers a request without the right password (its 401 body).
UNAUTHORIZED_VARIABLE = "VANCETOPE_WEB_UNAUTHORIZED"
UNAUTHORIZED_DEFAULT = (
    "401 Unauthorized: this Vancetope web view asks for a user and password (HTTP basic auth), on "
    f"loopback too: the user:password in {BASIC_AUTH_VARIABLE} (compose.yaml: user {WEB_USER}, the "
    f"password VANCETOPE_WEB_PASSWORD in .env; `vancetope up`: user {WEB_USER}, the password in "
    f"<data_dir>/{WEB_SECRET_FILE}).\n"
)


WEB = Door(
    title="Vancetope web view",
    noun="web view",
    secret_file=WEB_SECRET_FILE,
    basic_auth_variable=BASIC_AUTH_VARIABLE,
    unauthorized_variable=UNAUTHORIZED_VARIABLE,
)


class WebUnprotected(Unprotected):
    """The web view would listen without a password."""

    door = WEB


@dataclass(frozen=True)
class WebAccess(Access):
    """Where the web view listens and the credentials it demands."""

    door = WEB
    refusal = WebUnprotected


def decide_web_access(address: str, env: Mapping[str, str], secret_file: Path) -> WebAccess:
    """The operator's credentials if set, else a generated password (``secret_file``, created
    0600 the first time), on any address."""
    return password_door.decide(WebAccess, address, env, secret_file)


def web_access(address: str, data_dir: Path, env: Mapping[str, str]) -> WebAccess:
    """``decide_web_access`` with the password file in ``data_dir`` (created owner-only if new)."""
    return password_door.access_in(WebAccess, address, data_dir, env)


def credentials(basic_auth: str) -> dict[str, str]:
    """``user:password[,...]`` as user -> password (ValueError if malformed)."""
    return password_door.credentials(basic_auth, BASIC_AUTH_VARIABLE)
