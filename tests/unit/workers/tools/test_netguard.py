"""workers.tools.netguard: which resolved addresses http_get may reach, as a table."""

from __future__ import annotations

import ipaddress

import pytest

from workers.tools.netguard import HttpAllow, refusal

NONE = HttpAllow()
INTRANET = HttpAllow.parse(["intranet.example", "10.1.0.0/16", "127.0.0.1", "fd12::/16"])


@pytest.mark.parametrize(
    ("host", "address", "allow", "expected"),
    [
        ("example.com", "93.184.215.14", NONE, None),
        ("example.com", "2606:4700::1111", NONE, None),
        ("127.0.0.1", "127.0.0.1", NONE, "a loopback address"),
        ("localhost", "::1", NONE, "a loopback address"),
        ("x", "127.8.9.10", NONE, "a loopback address"),
        ("x", "10.0.0.1", NONE, "a private address"),
        ("x", "172.16.5.4", NONE, "a private address"),
        ("x", "192.168.1.1", NONE, "a private address"),
        ("x", "fd12:3456::1", NONE, "a private address"),
        ("x", "169.254.169.254", NONE, "a cloud metadata address"),
        ("x", "fd00:ec2::254", NONE, "a cloud metadata address"),
        ("x", "169.254.1.1", NONE, "a link-local address"),
        ("x", "fe80::1", NONE, "a link-local address"),
        ("x", "0.0.0.0", NONE, "the unspecified address"),
        ("x", "::", NONE, "the unspecified address"),
        ("x", "0.1.2.3", NONE, "a private address"),
        ("x", "224.0.0.1", NONE, "a multicast address"),
        ("x", "ff02::1", NONE, "a multicast address"),
        ("x", "100.64.0.1", NONE, "not a globally routable address"),
        # IPv4 inside IPv6 is judged as the IPv4 it embeds (issue 20, L row).
        ("x", "::ffff:127.0.0.1", NONE, "a loopback address (it embeds IPv4 127.0.0.1)"),
        ("x", "::ffff:7f00:1", NONE, "a loopback address (it embeds IPv4 127.0.0.1)"),
        ("x", "::127.0.0.1", NONE, "a loopback address (it embeds IPv4 127.0.0.1)"),
        ("x", "::a9fe:a9fe", NONE, "a cloud metadata address (it embeds IPv4 169.254.169.254)"),
        ("x", "::8.8.8.8", NONE, "a deprecated IPv4-compatible IPv6 address"),
        ("x", "::ffff:0:7f00:1", NONE, "a loopback address (it embeds IPv4 127.0.0.1)"),
        ("x", "64:ff9b:1::a00:1", NONE, "a private address (it embeds IPv4 10.0.0.1)"),
        ("x", "2002:7f00:1::1", NONE, "a loopback address (it embeds IPv4 127.0.0.1)"),
        # Teredo: server 65.54.227.120, client 127.0.0.1 (stored inverted: 80ff:fffe).
        ("x", "2001:0:4136:e378:8000:63bf:80ff:fffe", NONE, "a loopback address (it embeds IPv4 127.0.0.1)"),
        ("x", "2001:db8::5efe:a00:1", NONE, "a private address (it embeds IPv4 10.0.0.1)"),  # ISATAP
        ("x", "::ffff:8.8.8.8", NONE, None),
        ("x", "2002:808:808::1", NONE, None),
        ("x", "::ffff:127.0.0.1", INTRANET, "a loopback address (it embeds IPv4 127.0.0.1)"),
        ("x", "64:ff9b::7f00:1", NONE, "a loopback address (it embeds IPv4 127.0.0.1)"),
        ("x", "2002:a9fe:a9fe::1", NONE, "a cloud metadata address (it embeds IPv4 169.254.169.254)"),
        ("intranet.example", "10.9.9.9", INTRANET, None),
        ("INTRANET.example.", "10.9.9.9", INTRANET, None),
        ("other.example", "10.9.9.9", INTRANET, "a private address"),
        ("x", "10.1.2.3", INTRANET, None),
        ("x", "127.0.0.1", INTRANET, None),
        ("x", "127.0.0.2", INTRANET, "a loopback address"),
        ("x", "::1", INTRANET, "a loopback address"),
        ("x", "fd12::5", INTRANET, None),
        ("x", "169.254.169.254", INTRANET, "a cloud metadata address"),
    ],
)
def test_refusal_admits_public_and_allow_listed_addresses_only(
    host: str, address: str, allow: HttpAllow, expected: str | None
) -> None:
    assert refusal(host, ipaddress.ip_address(address), allow) == expected


def test_allow_list_entries_parse_from_the_environment() -> None:
    allow = HttpAllow.from_env({"VANCETOPE_HTTP_ALLOW": " intranet.example , 10.0.0.0/8,,::1"})
    assert allow.hosts == frozenset({"intranet.example"})
    assert [str(net) for net in allow.networks] == ["10.0.0.0/8", "::1/128"]
    assert HttpAllow.from_env({}) == HttpAllow()


@pytest.mark.parametrize("entry", ["10.0.0.0/33", "bad host", "a_b/c", "http://x"])
def test_a_bad_allow_list_entry_is_named(entry: str) -> None:
    with pytest.raises(ValueError, match=f"http_allow entry {entry!r} is neither a host name"):
        HttpAllow.parse([entry])
