"""Which network addresses a server-side tool may reach (layer: workers, pure).

One job: decide, for one resolved address, whether ``http_get`` may connect to it. A
task tree must not use the server pool to reach what only the server can reach:
loopback (Redis, Flower, the brain), link-local and cloud metadata (169.254.169.254,
fd00:ec2::254: instance credentials), private networks (RFC 1918, IPv6 unique-local),
unspecified, multicast and every other address that is not globally routable. IPv4
addresses embedded in IPv6 ones (mapped, NAT64, 6to4) are judged as IPv4 too.

An allow-list (``http_allow``: host names and addresses/CIDRs, from the server's
settings) lets specific internal targets through. No I/O here: resolving and
connecting are ``workers.tools.http_get``'s.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ENV_VAR = "VANCETOPE_HTTP_ALLOW"
METADATA = frozenset(
    {
        ipaddress.ip_address("169.254.169.254"),  # AWS, GCP, Azure, OpenStack, ...
        ipaddress.ip_address("fd00:ec2::254"),  # AWS over IPv6
        ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
    }
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


@dataclass(frozen=True)
class HttpAllow:
    """Targets allowed although internal: host names (exact, case-insensitive) and networks."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> HttpAllow:
        """From entries like ``intranet.example``, ``127.0.0.1``, ``10.0.0.0/8``; ValueError names
        a bad one."""
        hosts: set[str] = set()
        networks: list[IPNetwork] = []
        for raw in entries:
            entry = raw.strip()
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                if "/" in entry or not all(part.isalnum() or part == "-" for part in entry.replace(".", "")):
                    raise ValueError(
                        f"http_allow entry {entry!r} is neither a host name nor an address/CIDR "
                        "(examples: intranet.example, 127.0.0.1, 10.0.0.0/8, fd00::/8)"
                    ) from None
                hosts.add(entry.lower().rstrip("."))
        return cls(frozenset(hosts), tuple(networks))

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> HttpAllow:
        """From ``VANCETOPE_HTTP_ALLOW`` (comma-separated), as the brain's settings pass it down."""
        return cls.parse(environ.get(ENV_VAR, "").split(","))

    def admits(self, host: str, address: IPAddress) -> bool:
        if host.lower().rstrip(".") in self.hosts:
            return True
        return any(address.version == net.version and address in net for net in self.networks)


# The default: no internal target is allowed.
ALLOW_NONE = HttpAllow()


def refusal(host: str, address: IPAddress, allow: HttpAllow) -> str | None:
    """None when ``host`` (resolved to ``address``) may be fetched; else what kind of address it
    is (``"a loopback address"``), the words for why not."""
    if allow.admits(host, address):
        return None
    kind = _internal_kind(address)
    if kind is not None:
        return kind
    for embedded in _embedded_ipv4(address):
        kind = _internal_kind(embedded)
        if kind is not None:
            return f"{kind} (it embeds IPv4 {embedded})"
    return None


def _internal_kind(address: IPAddress) -> str | None:
    if address in METADATA:
        return "a cloud metadata address"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if address.is_private:
        return "a private address"
    if not address.is_global:
        return "not a globally routable address"
    return None


def _embedded_ipv4(address: IPAddress) -> list[ipaddress.IPv4Address]:
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    found = [address.ipv4_mapped, address.sixtofour]
    if address in _NAT64:
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return [ip for ip in found if ip is not None]
