"""brain.hot.boundary: Redis's refusals in words a user can act on, never with the password.
The errors are real ones from a real redis-server (the conftest's, which serves nobody without
credentials) where one can be had; a certificate failure needs a TLS server, so its error is
built with the text redis-py gives it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from brain.errors import StackNotRunning
from brain.hot.boundary import unreachable
from brain.stack.redis_server import RedisServer, component_secret, free_port
from workers.urls import with_credentials

SECRET = "hunter2-not-shown"
RUNNING_HINT = "; is the stack running (`vancetope up`), or is VANCETOPE_REDIS_URL right?"


def error_of(url: str, command: Callable[[redis.Redis], object] = lambda r: r.ping()) -> redis.RedisError:
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        command(client)
    except redis.RedisError as exc:
        return exc
    finally:
        client.close()
    raise AssertionError(f"{url} answered")


def test_a_wrong_password_is_refused_credentials(redis_server: RedisServer) -> None:
    url = with_credentials(redis_server.address_url, "vt-admin", SECRET)
    exc = error_of(url)
    assert isinstance(exc, redis.AuthenticationError)
    said = str(unreachable(url, exc))
    assert said == (
        f"Redis at redis://vt-admin:***@127.0.0.1:{redis_server.port}/0 refused these credentials ({exc}); "
        "check the user and password"
    )
    assert SECRET not in said


def test_a_command_the_user_may_not_run_is_refused_credentials(redis_server: RedisServer) -> None:
    # Celery beat's user may push to the brain's queue and nothing else.
    url = with_credentials(
        redis_server.address_url, "vt-beat", component_secret(redis_server.admin_secret, "vt-beat")
    )
    exc = error_of(url, lambda r: r.get("vt:presence"))
    assert isinstance(exc, redis.exceptions.NoPermissionError)
    said = str(unreachable(url, exc))
    assert said.startswith(
        f"Redis at redis://vt-beat:***@127.0.0.1:{redis_server.port}/0 refused these credentials ("
    )
    assert said.endswith("); check the user and password")


def test_a_refused_connection_asks_whether_the_stack_is_running() -> None:
    port = free_port()  # nobody listens there now
    url = f"redis://vt-admin:{SECRET}@127.0.0.1:{port}/0"
    exc = error_of(url)
    assert isinstance(exc, redis.ConnectionError) and not isinstance(exc, redis.AuthenticationError)
    said = str(unreachable(url, exc))
    assert said.startswith(f"cannot reach Redis at redis://vt-admin:***@127.0.0.1:{port}/0: ")
    assert said.endswith(RUNNING_HINT)
    assert ".;" not in said  # the error's own final full stop is dropped before the hint
    assert SECRET not in said


def test_an_untrusted_certificate_says_where_to_point_ssl_ca_certs() -> None:
    exc = redis.ConnectionError(
        "Error 1 connecting to redis.example:6380. [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
        "self-signed certificate (_ssl.c:1006)."
    )
    said = unreachable(f"rediss://vt-admin:{SECRET}@redis.example:6380/0", exc)
    assert isinstance(said, StackNotRunning)
    assert str(said) == (
        "cannot reach Redis at rediss://vt-admin:***@redis.example:6380/0: Error 1 connecting to redis.example:6380. "
        "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate (_ssl.c:1006)"
        " (certificate not trusted: point ssl_ca_certs in the URL at the CA that signed the server's certificate)"
    )


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "redis://localhost/0?socket_timeout=1"])
def test_a_url_without_a_password_is_shown_as_it_is(url: str) -> None:
    assert str(unreachable(url, redis.ConnectionError("Connection refused."))) == (
        f"cannot reach Redis at {url}: Connection refused{RUNNING_HINT}"
    )
