"""workers.tools.http_headers: which origin a key names, and which request carries its headers."""

from __future__ import annotations

import pytest

from workers.tools.http_headers import HttpHeaders, Origin, origin_of, parse_origin


@pytest.mark.parametrize(
    ("key", "origin"),
    [
        ("api.example.com", Origin("https", "api.example.com", 443)),
        ("API.Example.com.", Origin("https", "api.example.com", 443)),
        ("https://api.example.com:8443", Origin("https", "api.example.com", 8443)),
        ("https://api.example.com/", Origin("https", "api.example.com", 443)),
        ("http://127.0.0.1:8080", Origin("http", "127.0.0.1", 8080)),
        ("http://localhost", Origin("http", "localhost", 80)),
        ("http://[::1]:81", Origin("http", "::1", 81)),
        ("::1", Origin("https", "::1", 443)),
        ("127.0.0.1", Origin("https", "127.0.0.1", 443)),
    ],
)
def test_a_key_names_one_origin(key: str, origin: Origin) -> None:
    assert parse_origin(key) == origin


def test_two_keys_for_one_origin_are_refused() -> None:
    with pytest.raises(ValueError, match="'api.example.com' and 'https://api.example.com:443' both name"):
        HttpHeaders.parse({"api.example.com": {}, "https://api.example.com:443": {}})


@pytest.mark.parametrize(
    ("scheme", "host", "port", "all_loopback", "sent"),
    [
        ("https", "api.example.com", None, False, True),
        ("https", "API.example.com.", 443, False, True),
        ("https", "api.example.com", 8443, False, False),  # another port
        ("http", "api.example.com", 443, False, False),  # another scheme
        ("https", "www.example.com", None, False, False),  # another host
        ("http", "localhost", 8080, True, True),
        ("http", "localhost", 8080, False, False),  # localhost resolved off the machine
        ("http", "localhost", 8081, True, False),
    ],
)
def test_headers_go_to_their_origin_only(
    scheme: str, host: str, port: int | None, all_loopback: bool, sent: bool
) -> None:
    table = HttpHeaders.parse({"api.example.com": {"X-Key": "k1"}, "http://localhost:8080": {"X-Key": "k2"}})
    got = table.for_origin(origin_of(scheme, host, port), all_loopback=all_loopback)
    assert bool(got) is sent
