"""Sentinel URLs (workers.urls, pure) and what workers.redis_connect makes of them: the redis-py
arguments and the Celery broker settings every component connects with."""

from __future__ import annotations

import ssl

import pytest

from workers.app import celery_config
from workers.redis_connect import (
    SENTINEL_SOCKET_TIMEOUT_S,
    SENTINEL_TRANSPORT_PATH,
    broker_settings,
    master_name,
    redis_client,
    set_default_master,
)
from workers.transport import TRANSPORT_PATH
from workers.urls import (
    check_redis_url,
    parse_sentinel_url,
    redact_url,
    url_address,
    url_password,
    with_credentials,
    without_credentials,
)

THREE = "sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380;sentinel://127.0.0.1:26381"
TLS = "?ssl_cert_reqs=required&ssl_ca_certs=/etc/ca.crt"


def test_kombus_form_names_every_sentinel_and_defaults_to_db_0_without_credentials() -> None:
    target = parse_sentinel_url(THREE)
    assert target.sentinels == (("127.0.0.1", 26379), ("127.0.0.1", 26380), ("127.0.0.1", 26381))
    assert (target.username, target.password, target.db, target.tls) == (None, None, 0, {})
    assert check_redis_url(THREE) == THREE
    assert url_address(THREE) == "sentinels 127.0.0.1:26379,127.0.0.1:26380,127.0.0.1:26381"


def test_a_clients_credentials_go_on_every_part_and_come_back_out() -> None:
    url = with_credentials(THREE + "/2" + TLS, "vtc-laptop", "p@ss:word")
    assert url.count("vtc-laptop:p%40ss%3Aword@") == 3
    target = parse_sentinel_url(url)
    assert (target.username, target.password, target.db) == ("vtc-laptop", "p@ss:word", 2)
    assert url_password(url) == "p@ss:word"
    assert "p%40ss" not in redact_url(url) and redact_url(url).count("vtc-laptop:***@") == 3
    assert without_credentials(url) == THREE + "/2" + TLS
    assert target.node_kwargs() == {
        "db": 2,
        "username": "vtc-laptop",
        "password": "p@ss:word",
        "ssl": True,
        "ssl_cert_reqs": ssl.CERT_REQUIRED,
        "ssl_ca_certs": "/etc/ca.crt",
    }


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("sentinel://127.0.0.1:26379;redis://u:secret@127.0.0.1:6379", "must be sentinel://host:port"),
        ("sentinel://127.0.0.1:26379/zero", "must be a number"),
        ("sentinel://127.0.0.1:26379?master=x", "unknown option 'master'"),
        ("sentinel://127.0.0.1:26379?ssl_ca_certs=/ca.crt", "ssl_cert_reqs=required"),
    ],
)
def test_bad_sentinel_urls_are_refused_saying_why(url: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment) as caught:
        check_redis_url(url)
    assert "secret" not in str(caught.value)


def test_celery_gets_the_guarded_sentinel_transport_with_master_name_tls_and_the_sentinels_user() -> None:
    url = with_credentials(THREE + TLS, "vtc-laptop", "pw")
    conf = celery_config(url, keyprefix="c:laptop:", sentinel_master="vt")
    assert conf["broker_transport"] == SENTINEL_TRANSPORT_PATH
    # kombu reads credentials, the database and ssl_* from the first part; the rest are sentinels.
    first, *rest = conf["broker_url"].split(";")
    assert first.startswith("sentinel://vtc-laptop:pw@127.0.0.1:26379/0?ssl_cert_reqs=required")
    assert len(rest) == 2
    options = conf["broker_transport_options"]
    assert options["master_name"] == "vt" and options["global_keyprefix"] == "c:laptop:"
    # the sentinels: timeouts, TLS, and the client's own user, which they check as the data
    # nodes do (a sentinel anyone may command can name an attacker's master)
    assert options["sentinel_kwargs"]["ssl_cert_reqs"] == ssl.CERT_REQUIRED
    assert options["sentinel_kwargs"]["socket_timeout"] > 0
    to_sentinels = options["sentinel_kwargs"]
    assert (to_sentinels["username"], to_sentinels["password"]) == ("vtc-laptop", "pw")
    # no credential in the URL, none to the sentinels (their default user is open)
    assert "password" not in celery_config(THREE + TLS)["broker_transport_options"]["sentinel_kwargs"]
    # a plain URL is untouched
    plain = celery_config("redis://127.0.0.1:6379/0")
    assert (
        plain["broker_transport"] == TRANSPORT_PATH and "master_name" not in plain["broker_transport_options"]
    )


def test_the_master_name_comes_from_the_caller_then_the_settings_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("workers.redis_connect._default_master", None)
    monkeypatch.delenv("VANCETOPE_REDIS_SENTINEL_MASTER", raising=False)
    assert master_name() == "mymaster"
    monkeypatch.setenv("VANCETOPE_REDIS_SENTINEL_MASTER", "from-env")
    assert master_name() == "from-env"
    set_default_master("from-settings")
    assert master_name() == "from-settings" and master_name("given") == "given"
    assert broker_settings(THREE)[1]["master_name"] == "from-settings"


def test_a_reconnect_keeps_the_guarded_transport_the_database_and_tls() -> None:
    """Celery switches to the next URL on reconnect; kombu re-reads the transport from its
    scheme. Seen: an agent's consumer got kombu's own channel after a failover (a Lua mutex its
    user may not run) and stopped."""
    from workers.app import make_app

    app = make_app(with_credentials(THREE + "/3" + TLS, "vtc-laptop", "pw"), keyprefix="c:laptop:")
    conn = app.connection_for_write()
    for _ in range(4):
        conn.maybe_switch_next()
        assert type(conn.transport).__name__ == "GuardedSentinelTransport"
        assert conn.virtual_host == "3" and conn.ssl["ssl_cert_reqs"] == ssl.CERT_REQUIRED
        assert conn.userid == "vtc-laptop" and conn.port == 26379


def test_the_sentinels_get_the_credential_and_timeouts_no_longer_than_a_sentinel_needs() -> None:
    """A sentinel answers at once or not at all: the brain's hot state waits 30 s for Redis, but
    a hung sentinel must not hold it that long before it asks the next one."""
    client = redis_client(
        with_credentials(THREE, "vt-brain", "pw"), socket_timeout=30, socket_connect_timeout=1
    )
    try:
        manager = client.connection_pool.sentinel_manager
        assert manager.sentinel_kwargs["socket_timeout"] == SENTINEL_SOCKET_TIMEOUT_S
        assert manager.sentinel_kwargs["socket_connect_timeout"] == 1
        assert (manager.sentinel_kwargs["username"], manager.sentinel_kwargs["password"]) == (
            "vt-brain",
            "pw",
        )
        # the data nodes keep the caller's own
        assert client.connection_pool.connection_kwargs["socket_timeout"] == 30
    finally:
        client.close()
