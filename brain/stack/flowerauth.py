"""Who may open Flower (layer: brain/stack; a pure decision, then the secret file).

Flower shows every task and can send tasks and shut workers down, so it always asks for a
password, on loopback too: the operator's ``FLOWER_BASIC_AUTH`` (``user:password``,
Flower's own variable) if set, else user ``vancetope`` with a random password made on first
use and kept in ``<data_dir>/flower.secret`` (mode 0600, like the Redis admin secret). The
password goes to Flower in its environment, never on its command line (``ps`` shows that)
nor in a log.

Loopback is no boundary: every local user of the machine reaches 127.0.0.1, and a web page
the operator visits reaches it too through DNS rebinding (a name of the attacker's that
resolves to 127.0.0.1, so the browser treats Flower as that page's own origin). Without a
password, Flower served such a page the task list (``/tasks/datatable``) and ``/metrics``;
``brain.flowerapp`` also refuses a Host header that is not Flower's own address.

Flower's ``FLOWER_UNAUTHENTICATED_API`` is never set: it opens the API to any caller
without a password and, with no password configured, Flower then also sends
``Access-Control-Allow-Origin: *`` and skips its XSRF check, so any web page the operator
visits could read tasks or send one.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from brain.errors import ConfigError
from brain.stack.redis_server import read_or_create_secret

FLOWER_USER = "vancetope"
FLOWER_SECRET_FILE = "flower.secret"
# Flower reads FLOWER_<OPTION> from its environment; these are the two we decide.
BASIC_AUTH_VARIABLE = "FLOWER_BASIC_AUTH"
UNAUTHENTICATED_API_VARIABLE = "FLOWER_UNAUTHENTICATED_API"
# What brain.flowerapp answers a request without the right password (its 401 body): who to log
# in as and where the password is, never the password.
UNAUTHORIZED_VARIABLE = "VANCETOPE_FLOWER_UNAUTHORIZED"
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


class FlowerUnprotected(ConfigError):
    """Flower would listen without a password."""

    def __init__(self, address: str, problem: str) -> None:
        self.address = address
        super().__init__(
            f"flower not started on {address}: {problem}. Set {BASIC_AUTH_VARIABLE}=user:password, "
            f"or leave it unset to use user {FLOWER_USER!r} with a generated password"
        )


@dataclass(frozen=True)
class FlowerAccess:
    """Where Flower listens and the credentials it demands (``basic_auth`` None: none)."""

    address: str
    basic_auth: str | None = field(default=None, repr=False)
    # What to tell the operator instead of the password: the user(s), and where it is kept.
    users: tuple[str, ...] = ()
    secret_file: Path | None = None

    @property
    def beyond_loopback(self) -> bool:
        return not is_loopback(self.address)

    def login(self) -> str:
        """Who to log in as and where the password is (never the password)."""
        return f"user {', '.join(self.users)}, password in {self.secret_file or BASIC_AUTH_VARIABLE}"

    def unauthorized(self) -> str:
        """The 401 body: how to authenticate. The password file's full path only on loopback
        (beyond it, whoever is refused may be anyone on the network)."""
        user = self.users[0] if self.users else "USER"
        if self.secret_file is None:
            where = f"the password in the {BASIC_AUTH_VARIABLE} its operator set"
            example = f'curl -u "{user}:PASSWORD"'
        elif self.beyond_loopback:
            where = (
                f"the password in {FLOWER_SECRET_FILE} in the stack's data dir (`vancetope up` printed where)"
            )
            example = f'curl -u "{user}:$(cat <data_dir>/{FLOWER_SECRET_FILE})"'
        else:
            where = f"the password in {self.secret_file}"
            example = f'curl -u "{user}:$(cat {self.secret_file})"'
        return (
            f"401 Unauthorized: this Flower asks for a password, on loopback too. Log in as user "
            f"{', '.join(self.users) or user}, {where}. For example: {example} <this URL>\n"
        )

    def env(self) -> dict[str, str]:
        """Flower's environment entries for this access; refuses one without a password."""
        if not self.basic_auth:
            raise FlowerUnprotected(self.address, "no password is set")
        return {BASIC_AUTH_VARIABLE: self.basic_auth, UNAUTHORIZED_VARIABLE: self.unauthorized()}


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``; a host name or 0.0.0.0 is beyond loopback."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def host_allowed(host_header: str, listen_address: str) -> bool:
    """Whether Flower listening on ``listen_address`` answers a request with this Host header.

    On loopback only loopback names (and the listening address itself) are accepted: any other
    name reaching 127.0.0.1 is a DNS rebinding. Beyond loopback operators reach Flower by names
    of their own, and the password guards it."""
    if not is_loopback(listen_address):
        return True
    host = urlsplit(f"//{host_header}").hostname if host_header else None
    return host is not None and (is_loopback(host) or host == listen_address.lower())


def users_of(basic_auth: str) -> tuple[str, ...]:
    """The user names in Flower's ``user:password[,user:password...]``; ValueError for a
    malformed value, which Flower would accept and then never match."""
    pairs = [entry.partition(":") for entry in basic_auth.split(",") if entry]
    if not pairs or any(not user or not sep or not password for user, sep, password in pairs):
        raise ValueError(f"{BASIC_AUTH_VARIABLE} must be user:password[,user:password...]")
    return tuple(user for user, _, _ in pairs)


def decide_access(address: str, env: Mapping[str, str], secret_file: Path) -> FlowerAccess:
    """The operator's credentials if set, else a generated password, on any address.
    Creates ``secret_file`` (0600) the first time it is needed."""
    given = env.get(BASIC_AUTH_VARIABLE)
    if given is not None:
        try:
            return FlowerAccess(address, given, users_of(given))
        except ValueError as exc:
            raise FlowerUnprotected(address, str(exc)) from None
    password = read_or_create_secret(secret_file)
    return FlowerAccess(address, f"{FLOWER_USER}:{password}", (FLOWER_USER,), secret_file)


def flower_access(address: str, data_dir: Path, env: Mapping[str, str]) -> FlowerAccess:
    """``decide_access`` with the password file in ``data_dir`` (created owner-only if new)."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    return decide_access(address, env, data_dir / FLOWER_SECRET_FILE)
