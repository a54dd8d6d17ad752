"""Who may open Flower (layer: brain/stack; a pure decision, then the secret file).

Flower shows every task and can send tasks and shut workers down, so it always asks for a
password, on loopback too: the operator's ``FLOWER_BASIC_AUTH`` (``user:password``,
Flower's own variable) if set, else user ``vancetope`` with a random password made on first
use and kept in ``<data_dir>/flower.secret`` (mode 0600, like the Redis admin secret). The
password goes to Flower in its environment, never on its command line (``ps`` shows that)
nor in a log.

The rules are the web view's too (``brain.stack.password_door``). Loopback is no boundary:
every local user of the machine reaches 127.0.0.1, and a web page the operator visits reaches
it too through DNS rebinding (a name of the attacker's that
resolves to 127.0.0.1, so the browser treats Flower as that page's own origin). Without a
password, Flower served such a page the task list (``/tasks/datatable``) and ``/metrics``;
``brain.flowerapp`` also refuses a Host header that is not Flower's own address.

Flower's ``FLOWER_UNAUTHENTICATED_API`` is never set: it opens the API to any caller
without a password and, with no password configured, Flower then also sends
``Access-Control-Allow-Origin: *`` and skips its XSRF check, so any web page the operator
visits could read tasks or send one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from brain.stack import password_door
from brain.stack.password_door import DEFAULT_USER, Access, Door, Unprotected, host_allowed, is_loopback

FLOWER_USER = DEFAULT_USER
FLOWER_SECRET_FILE = "flower.secret"
# Flower reads FLOWER_<OPTION> from its environment; these are the two we decide.
BASIC_AUTH_VARIABLE = "FLOWER_BASIC_AUTH"
UNAUTHENTICATED_API_VARIABLE = "FLOWER_UNAUTHENTICATED_API"
# What brain.flowerapp answers a request without the right password (its 401 body): who to log
# in as and where the password is, never the password.
UNAUTHORIZED_VARIABLE = "VANCETOPE_FLOWER_UNAUTHORIZED"
# Where Flower's navigation bar links the web view (brain.flowerapp); unset: no link.
WEB_URL_VARIABLE = "VANCETOPE_FLOWER_WEB_URL"
# The 401 body of a Flower not started by `vancetope up` (compose.yaml, or by hand).
UNAUTHORIZED_DEFAULT = (
    "401 Unauthorized: this Flower asks for a user and password (HTTP basic auth), on loopback "
    f"too: the user:password in the {BASIC_AUTH_VARIABLE} its operator set (compose.yaml: user "
    f"{FLOWER_USER}, the password VANCETOPE_FLOWER_PASSWORD in .env; `vancetope up`: user "
    f"{FLOWER_USER}, the password in <data_dir>/{FLOWER_SECRET_FILE}). "
    'For example: curl -u "USER:PASSWORD" http://127.0.0.1:5555/api/workers\n'
)
# A Flower started with no password at all refuses its API and shows its pages to anyone.
UNPROTECTED_BODY = (
    "401 Unauthorized: this Flower was started without a password. Stop it and start it with "
    f"{BASIC_AUTH_VARIABLE}=user:password (`vancetope up --flower` and compose.yaml always give it one).\n"
)


FLOWER = Door(
    title="Flower",
    noun="flower",
    secret_file=FLOWER_SECRET_FILE,
    basic_auth_variable=BASIC_AUTH_VARIABLE,
    unauthorized_variable=UNAUTHORIZED_VARIABLE,
    curl_example=True,  # its API is what people script
)


class FlowerUnprotected(Unprotected):
    """Flower would listen without a password."""

    door = FLOWER


@dataclass(frozen=True)
class FlowerAccess(Access):
    """Where Flower listens and the credentials it demands (``basic_auth`` None: none)."""

    door = FLOWER
    refusal = FlowerUnprotected


def users_of(basic_auth: str) -> tuple[str, ...]:
    """The user names in Flower's ``user:password[,user:password...]``; ValueError for a
    malformed value, which Flower would accept and then never match."""
    return password_door.users_of(basic_auth, BASIC_AUTH_VARIABLE)


def decide_access(address: str, env: Mapping[str, str], secret_file: Path) -> FlowerAccess:
    """The operator's credentials if set, else a generated password, on any address.
    Creates ``secret_file`` (0600) the first time it is needed."""
    return password_door.decide(FlowerAccess, address, env, secret_file)


def flower_access(address: str, data_dir: Path, env: Mapping[str, str]) -> FlowerAccess:
    """``decide_access`` with the password file in ``data_dir`` (created owner-only if new)."""
    return password_door.access_in(FlowerAccess, address, data_dir, env)


__all__ = [
    "BASIC_AUTH_VARIABLE",
    "FLOWER",
    "FLOWER_SECRET_FILE",
    "FLOWER_USER",
    "UNAUTHENTICATED_API_VARIABLE",
    "UNAUTHORIZED_DEFAULT",
    "UNAUTHORIZED_VARIABLE",
    "UNPROTECTED_BODY",
    "WEB_URL_VARIABLE",
    "FlowerAccess",
    "FlowerUnprotected",
    "decide_access",
    "flower_access",
    "host_allowed",
    "is_loopback",
    "users_of",
]
