"""Issue 20, L row: every spelling of an internal address is refused by http_get's SSRF guard.

A server listens on every local address (IPv4 and IPv6, dual stack) so that a URL that got
through would reach it; each URL of the table must be refused before anything is sent, with
an error naming the address it leads to.
"""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from workers.tools.builtin import BUILTINS, BuiltinContext
from workers.tools.http_get import DestinationRefused


class _DualStackServer(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


class _Witness(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    server = _DualStackServer(("::", 0), _Witness)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("host", "refused_as"),
    [
        ("[::127.0.0.1]", "resolves to ::7f00:1, a loopback address (it embeds IPv4 127.0.0.1)"),
        ("[::ffff:127.0.0.1]", "resolves to ::ffff:7f00:1, a loopback address (it embeds IPv4 127.0.0.1)"),
        ("[::ffff:7f00:1]", "::ffff:7f00:1 is a loopback address (it embeds IPv4 127.0.0.1)"),
        ("[::ffff:0:7f00:1]", "a loopback address (it embeds IPv4 127.0.0.1)"),
        ("[64:ff9b::7f00:1]", "a loopback address (it embeds IPv4 127.0.0.1)"),
        ("[2002:7f00:1::1]", "a loopback address (it embeds IPv4 127.0.0.1)"),
        ("[2001:0:4136:e378:8000:63bf:80ff:fffe]", "a loopback address (it embeds IPv4 127.0.0.1)"),
        ("[::1]", "::1 is a loopback address"),
        ("[::]", ":: is the unspecified address"),
        ("0.0.0.0", "0.0.0.0 is the unspecified address"),
        ("0", "'0' resolves to 0.0.0.0, the unspecified address"),
        ("2130706433", "'2130706433' resolves to 127.0.0.1, a loopback address"),
        ("0x7f.1", "'0x7f.1' resolves to 127.0.0.1, a loopback address"),
        ("017700000001", "'017700000001' resolves to 127.0.0.1, a loopback address"),
        ("0177.0.0.1", "'0177.0.0.1' resolves to 127.0.0.1, a loopback address"),
        ("127.1", "'127.1' resolves to 127.0.0.1, a loopback address"),
        ("localhost", "'localhost' resolves to"),
        ("LocalHost", "'localhost' resolves to"),
        ("0xa9.0xfe.0xa9.0xfe", "resolves to 169.254.169.254, a cloud metadata address"),
        ("[::a9fe:a9fe]", "a cloud metadata address (it embeds IPv4 169.254.169.254)"),
        ("167772161", "'167772161' resolves to 10.0.0.1, a private address"),
    ],
)
def test_every_spelling_of_an_internal_address_is_refused_before_a_byte_is_sent(
    port: int, host: str, refused_as: str
) -> None:
    before = len(_Witness.seen)
    url = f"http://{host}:{port}/secret"
    with pytest.raises(DestinationRefused) as info:
        BUILTINS["http_get"].run({"url": url, "timeout_s": 2}, BuiltinContext())
    assert refused_as in info.value.message, info.value.message
    assert "http_allow setting" in info.value.message  # the error says how to allow it on purpose
    assert len(_Witness.seen) == before, f"{url} reached the server"


def test_the_witness_server_is_reachable_on_the_spellings_the_guard_refuses(port: int) -> None:
    """Without the guard these URLs would have been served: the table above is not vacuous."""
    for address in ("::ffff:127.0.0.1", "::1", "127.0.0.1", "0.0.0.0"):
        with socket.create_connection((address, port), timeout=5):
            pass
