"""Who may open a page the stack serves behind a password (layer: brain/stack; pure decisions,
then the secret file). Flower (``brain.stack.flowerauth``) and the web view
(``brain.stack.webauth``) follow the same rules, kept here once.

A password on every address, loopback included: every local user of the machine reaches
127.0.0.1, and a web page the operator visits reaches it too through DNS rebinding (a name of
the attacker's that resolves to 127.0.0.1, so the browser treats the service as that page's
own origin). The operator's ``user:password[,user:password...]`` in the service's variable if
set, else user ``vancetope`` with a random password made on first use and kept in a file of the
data dir (mode 0600). The password reaches the service in its environment, never on its
command line (``ps`` shows that) nor in a log; the 401 body says who to log in as and where the
password is, never the password.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, TypeVar
from urllib.parse import urlsplit

from brain.errors import ConfigError
from brain.stack.redis_server import read_or_create_secret

DEFAULT_USER = "vancetope"


@dataclass(frozen=True)
class Door:
    """What one password-guarded service is called and where its password comes from."""

    title: str  # as the 401 body names it: "Flower", "Vancetope web view"
    noun: str  # as a refusal to start names it: "flower", "web view"
    secret_file: str  # the generated password's file name in the data dir
    basic_auth_variable: str  # the operator's user:password[,...]
    unauthorized_variable: str  # the 401 body, handed to the service
    curl_example: bool = False  # the 401 body shows a curl line (an API people script)


class Unprotected(ConfigError):
    """The service would listen without a password (or with one it could never match)."""

    door: ClassVar[Door]

    def __init__(self, address: str, problem: str) -> None:
        self.address = address
        door = self.door
        super().__init__(
            f"{door.noun} not started on {address}: {problem}. Set {door.basic_auth_variable}="
            f"user:password, or leave it unset to use user {DEFAULT_USER!r} with a generated password"
        )


@dataclass(frozen=True)
class Access:
    """Where a service listens and the credentials it demands (``basic_auth`` None: none)."""

    door: ClassVar[Door]
    refusal: ClassVar[type[Unprotected]]

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
        return (
            f"user {', '.join(self.users)}, password in {self.secret_file or self.door.basic_auth_variable}"
        )

    def unauthorized(self) -> str:
        """The 401 body: how to authenticate. The password file's full path only on loopback
        (beyond it, whoever is refused may be anyone on the network)."""
        door = self.door
        user = self.users[0] if self.users else "USER"
        if self.secret_file is None:
            where = f"the password in the {door.basic_auth_variable} its operator set"
            example = f'curl -u "{user}:PASSWORD"'
        elif self.beyond_loopback:
            where = (
                f"the password in {door.secret_file} in the stack's data dir (`vancetope up` printed where)"
            )
            example = f'curl -u "{user}:$(cat <data_dir>/{door.secret_file})"'
        else:
            where = f"the password in {self.secret_file}"
            example = f'curl -u "{user}:$(cat {self.secret_file})"'
        tail = f" For example: {example} <this URL>" if door.curl_example else ""
        return (
            f"401 Unauthorized: this {door.title} asks for a password, on loopback too. Log in as user "
            f"{', '.join(self.users) or user}, {where}.{tail}\n"
        )

    def env(self) -> dict[str, str]:
        """The service's environment entries for this access; refuses one without a password."""
        if not self.basic_auth:
            raise self.refusal(self.address, "no password is set")
        return {
            self.door.basic_auth_variable: self.basic_auth,
            self.door.unauthorized_variable: self.unauthorized(),
        }


A = TypeVar("A", bound=Access)


def decide(kind: type[A], address: str, env: Mapping[str, str], secret_file: Path) -> A:
    """The operator's credentials if set, else a generated password, on any address.
    Creates ``secret_file`` (0600) the first time it is needed."""
    variable = kind.door.basic_auth_variable
    given = env.get(variable)
    if given is not None:
        try:
            return kind(address, given, users_of(given, variable))
        except ValueError as exc:
            raise kind.refusal(address, str(exc)) from None
    password = read_or_create_secret(secret_file)
    return kind(address, f"{DEFAULT_USER}:{password}", (DEFAULT_USER,), secret_file)


def access_in(kind: type[A], address: str, data_dir: Path, env: Mapping[str, str]) -> A:
    """``decide`` with the password file in ``data_dir`` (created owner-only if new)."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    return decide(kind, address, env, data_dir / kind.door.secret_file)


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``; a host name or 0.0.0.0 is beyond loopback."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def host_allowed(host_header: str, listen_address: str) -> bool:
    """Whether a service listening on ``listen_address`` answers a request with this Host header.

    On loopback only loopback names (and the listening address itself) are accepted: any other
    name reaching 127.0.0.1 is a DNS rebinding. Beyond loopback operators reach it by names
    of their own, and the password guards it."""
    if not is_loopback(listen_address):
        return True
    host = urlsplit(f"//{host_header}").hostname if host_header else None
    return host is not None and (is_loopback(host) or host == listen_address.lower())


def users_of(basic_auth: str, variable: str) -> tuple[str, ...]:
    """The user names in ``user:password[,user:password...]``; ValueError for a malformed
    value, which the service would accept and then never match."""
    pairs = [entry.partition(":") for entry in basic_auth.split(",") if entry]
    if not pairs or any(not user or not sep or not password for user, sep, password in pairs):
        raise ValueError(f"{variable} must be user:password[,user:password...]")
    return tuple(user for user, _, _ in pairs)


def credentials(basic_auth: str, variable: str) -> dict[str, str]:
    """``user:password[,...]`` as user -> password (ValueError if malformed)."""
    users_of(basic_auth, variable)
    return {user: password for user, _, password in (e.partition(":") for e in basic_auth.split(",") if e)}
