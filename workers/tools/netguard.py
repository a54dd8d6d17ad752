"""Which network addresses a server-side tool may reach (layer: workers, pure).

One job: decide, for one resolved address, whether ``http_get`` may connect to it. A
task tree must not use the server pool to reach what only the server can reach:
loopback (Redis, Flower, the brain), link-local and cloud metadata (169.254.169.254,
fd00:ec2::254: instance credentials), private networks (RFC 1918, IPv6 unique-local),
unspecified, multicast and every other address that is not globally routable. IPv4
addresses embedded in IPv6 ones are judged as IPv4 too, before the IPv6 address itself:
mapped (``::ffff:127.0.0.1``), translated (``::ffff:0:7f00:1``), NAT64 (``64:ff9b::/96``,
``64:ff9b:1::/48``), 6to4 (``2002::/16``), Teredo (server and client), ISATAP; the deprecated
IPv4-compatible form (``::127.0.0.1``, ``::/96``), which a kernel may route to the embedded
IPv4 address, is refused whatever it embeds. Numeric host spellings (``2130706433``,
``0x7f.1``, ``017700000001``) and names are resolved by ``http_get`` first, so only the
address they lead to is judged here.

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
# IPv6 ranges whose low 32 bits are an IPv4 address a translator or tunnel may reach.
_LOW32_EMBEDDING = (
    ipaddress.ip_network("64:ff9b::/96"),  # NAT64, well-known prefix (RFC 6052)
    ipaddress.ip_network("64:ff9b:1::/48"),  # NAT64, local use (RFC 8215)
    ipaddress.ip_network("::ffff:0:0:0/96"),  # SIIT "IPv4-translated" (RFC 2765)
)
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated (RFC 4291 2.5.5.1)
_ISATAP_IDS = (0x00005EFE, 0x02005EFE)  # interface id ...:0:5efe:a.b.c.d or ...:200:5efe:a.b.c.d


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
    # The embedded address first: what the packet may really reach is the better reason.
    for embedded in _embedded_ipv4(address):
        kind = _internal_kind(embedded)
        if kind is not None:
            return f"{kind} (it embeds IPv4 {embedded})"
    kind = _internal_kind(address)
    if kind is not None:
        return kind
    if address in _IPV4_COMPATIBLE and address.version == 6:
        return "a deprecated IPv4-compatible IPv6 address"
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
    low32 = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    found = [address.ipv4_mapped, address.sixtofour, *(address.teredo or ())]
    # :: and ::1 are judged as themselves (unspecified, loopback), not as 0.0.0.0 / 0.0.0.1.
    if address in _IPV4_COMPATIBLE and int(address) > 1:
        found.append(low32)
    if any(address in net for net in _LOW32_EMBEDDING):
        found.append(low32)
    if (int(address) >> 32) & 0xFFFFFFFF in _ISATAP_IDS:
        found.append(low32)
    return list(dict.fromkeys(ip for ip in found if ip is not None))
