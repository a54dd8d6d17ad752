"""workers.urls: credentials in and out of Redis URLs, and the one usability check (pure)."""

from __future__ import annotations

import pytest

from workers.urls import check_redis_url, redact_url, with_credentials, without_credentials


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6379/0", "redis://vtc-laptop:p%40ss%3Aword@127.0.0.1:6379/0"),
        ("redis://vt-admin:old@broker:6380/2", "redis://vtc-laptop:p%40ss%3Aword@broker:6380/2"),
        (
            "rediss://broker:6380/0?ssl_cert_reqs=required&ssl_ca_certs=/etc/ca.crt",
            "rediss://vtc-laptop:p%40ss%3Aword@broker:6380/0?ssl_cert_reqs=required&ssl_ca_certs=/etc/ca.crt",
        ),
    ],
)
def test_credentials_replace_any_in_the_url_and_keep_host_db_and_tls_options(url: str, expected: str) -> None:
    with_user = with_credentials(url, "vtc-laptop", "p@ss:word")
    assert with_user == expected
    assert without_credentials(with_user) == without_credentials(url)
    assert "p%40ss" not in redact_url(with_user) and "vtc-laptop:***@" in redact_url(with_user)


@pytest.mark.parametrize(
    "url",
    [
        "redis://h:6379/0",
        "rediss://h:6380/0?ssl_cert_reqs=required",
        "rediss://h/0?ssl_cert_reqs=CERT_REQUIRED",
        "redis://h:6379",
        "redis://h:6379/?db=0",
        "sentinel://h1:26379;sentinel://h2:26379/0",
    ],
)
def test_usable_redis_urls_pass(url: str) -> None:
    assert check_redis_url(url) == url


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("rediss://u:secret@h:6380/0", "ssl_cert_reqs=required"),
        ("amqp://u:secret@h/", "rediss:// or sentinel://"),
        ("redis:///0", "with a host"),
        ("redis://u:secret@h:6379/1", "names database 1; Vancetope keeps its keys in database 0"),
        ("redis://u:secret@h:6379/0?db=2", "names database 2"),
        ("redis://u:secret@h:6379/zero", "must be a number, got 'zero'"),
        ("rediss://u:secret@h:6380/5?ssl_cert_reqs=required", "names database 5"),
        ("sentinel://u:secret@h1:26379;sentinel://h2:26379/4", "names database 4"),
    ],
)
def test_unusable_redis_urls_are_refused_without_showing_the_password(url: str, fragment: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_redis_url(url)
    assert fragment in str(caught.value) and "secret" not in str(caught.value)
