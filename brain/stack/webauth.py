"""Who may open the web view (layer: brain/stack; a pure decision, then the secret file).

The same rules as Flower's (``brain.stack.flowerauth``, whose docstring says why): a password on
every address, loopback included. Loopback is no boundary: every local user of the machine
reaches 127.0.0.1, and a web page the operator visits reaches it through DNS rebinding. The
web view shows every user's trees, tools, routes and errors, so it asks as Flower asks: the
operator's ``VANCETOPE_WEB_BASIC_AUTH`` (``user:password[,user:password...]``) if set, else user
``vancetope`` with a random password made on first use and kept in ``<data_dir>/web.secret``
(0600). The password reaches the web process in its environment, never on its command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from brain.errors import ConfigError
from brain.stack.flowerauth import FLOWER_USER, is_loopback, users_of
from brain.stack.redis_server import read_or_create_secret

WEB_USER = FLOWER_USER
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


class WebUnprotected(ConfigError):
    """The web view would listen without a password."""

    def __init__(self, address: str, problem: str) -> None:
        self.address = address
        super().__init__(
            f"web view not started on {address}: {problem}. Set {BASIC_AUTH_VARIABLE}=user:password, "
            f"or leave it unset to use user {WEB_USER!r} with a generated password"
        )


@dataclass(frozen=True)
class WebAccess:
    """Where the web view listens and the credentials it demands."""

    address: str
    basic_auth: str = field(repr=False)
    users: tuple[str, ...] = ()
    secret_file: Path | None = None

    def login(self) -> str:
        """Who to log in as and where the password is (never the password)."""
        return f"user {', '.join(self.users)}, password in {self.secret_file or BASIC_AUTH_VARIABLE}"

    def unauthorized(self) -> str:
        """The 401 body: who to log in as and where the password is. The file's full path only
        on loopback (beyond it, whoever is refused may be anyone on the network)."""
        user = self.users[0] if self.users else "USER"
        if self.secret_file is None:
            where = f"the password in the {BASIC_AUTH_VARIABLE} its operator set"
        elif not is_loopback(self.address):
            where = (
                f"the password in {WEB_SECRET_FILE} in the stack's data dir (`vancetope up` printed where)"
            )
        else:
            where = f"the password in {self.secret_file}"
        return (
            f"401 Unauthorized: this Vancetope web view asks for a password, on loopback too. Log in "
            f"as user {', '.join(self.users) or user}, {where}.\n"
        )

    def env(self) -> dict[str, str]:
        """The web process's environment entries for this access."""
        return {BASIC_AUTH_VARIABLE: self.basic_auth, UNAUTHORIZED_VARIABLE: self.unauthorized()}


def decide_web_access(address: str, env: Mapping[str, str], secret_file: Path) -> WebAccess:
    """The operator's credentials if set, else a generated password (``secret_file``, created
    0600 the first time), on any address."""
    given = env.get(BASIC_AUTH_VARIABLE)
    if given is not None:
        try:
            return WebAccess(address, given, users_of(given))
        except ValueError as exc:
            raise WebUnprotected(
                address, str(exc).replace("FLOWER_BASIC_AUTH", BASIC_AUTH_VARIABLE)
            ) from None
    password = read_or_create_secret(secret_file)
    return WebAccess(address, f"{WEB_USER}:{password}", (WEB_USER,), secret_file)


def web_access(address: str, data_dir: Path, env: Mapping[str, str]) -> WebAccess:
    """``decide_web_access`` with the password file in ``data_dir`` (created owner-only if new)."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    return decide_web_access(address, env, data_dir / WEB_SECRET_FILE)


def credentials(basic_auth: str) -> dict[str, str]:
    """``user:password[,...]`` as user -> password (ValueError if malformed)."""
    users_of(basic_auth)
    return {user: password for user, _, password in (e.partition(":") for e in basic_auth.split(",") if e)}
