"""Issue 20, M3: an ``http_headers`` secret goes to its own origin only, over https.

Before, headers configured for host H were sent over plain http:// and, after a redirect, to
another port of H. Now a header is bound to scheme, host and port; plain http only to a
loopback origin named as such; a redirect to another port, scheme or host name carries none.
Two witness servers on loopback record the Authorization header of every request.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from workers import masking
from workers.tools.builtin import BuiltinContext, builtin_tools
from workers.tools.http_headers import HttpHeaders
from workers.tools.netguard import HttpAllow

TOKEN = "Bearer tok-3c9e51f0a7d24b6e"
ALLOW = HttpAllow.parse(["127.0.0.1", "localhost", "::1"])


class _Witness(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[int, str, str]]] = []  # (port, path, Authorization)
    other_port: ClassVar[int] = 0

    def do_GET(self) -> None:
        port = self.server.server_address[1]
        self.seen.append((port, self.path, self.headers.get("Authorization", "")))
        redirects = {
            "/to-other-port": f"http://127.0.0.1:{self.other_port}/landed",
            "/to-other-name": f"http://localhost:{port}/landed",
            "/to-same-origin": "/landed",
        }
        if self.path in redirects:
            self.send_response(302)
            self.send_header("Location", redirects[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def ports() -> Iterator[tuple[int, int]]:
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Witness) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    first, second = (s.server_address[1] for s in servers)
    _Witness.other_port = second
    try:
        yield first, second
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
        masking.forget_all()


def _get(headers: dict[str, dict[str, str]], url: str) -> list[tuple[int, str, str]]:
    """The requests the witnesses saw for one http_get."""
    before = len(_Witness.seen)
    tools = builtin_tools(ALLOW, HttpHeaders.parse(headers))
    assert tools["http_get"].run({"url": url, "timeout_s": 5}, BuiltinContext())["status"] == 200
    return _Witness.seen[before:]


def test_a_header_for_a_host_is_not_sent_over_plain_http(ports: tuple[int, int]) -> None:
    first, _ = ports
    # A bare host means https://host:443; this request is plain http to another port.
    assert _get({"127.0.0.1": {"Authorization": TOKEN}}, f"http://127.0.0.1:{first}/a") == [(first, "/a", "")]
    assert _get({"localhost": {"Authorization": TOKEN}}, f"http://localhost:{first}/b") == [(first, "/b", "")]


def test_a_loopback_origin_named_with_http_gets_its_header(ports: tuple[int, int]) -> None:
    first, _ = ports
    table = {f"http://127.0.0.1:{first}": {"Authorization": TOKEN}}
    assert _get(table, f"http://127.0.0.1:{first}/c") == [(first, "/c", TOKEN)]
    # A redirect that stays on the origin keeps it.
    assert _get(table, f"http://127.0.0.1:{first}/to-same-origin") == [
        (first, "/to-same-origin", TOKEN),
        (first, "/landed", TOKEN),
    ]


@pytest.mark.parametrize("path", ["/to-other-port", "/to-other-name"])
def test_a_redirect_to_another_port_or_host_name_drops_the_header(ports: tuple[int, int], path: str) -> None:
    first, second = ports
    seen = _get({f"http://127.0.0.1:{first}": {"Authorization": TOKEN}}, f"http://127.0.0.1:{first}{path}")
    assert seen[0] == (first, path, TOKEN)
    assert seen[1][1:] == ("/landed", ""), seen  # the secret did not follow the redirect
    assert seen[1][0] == (second if path == "/to-other-port" else first)


@pytest.mark.parametrize(
    ("key", "error"),
    [
        ("http://api.example.com", "headers are sent over https only"),
        ("http://10.0.0.5:8080", "headers are sent over https only"),
        ("http://intranet.localhost", "headers are sent over https only"),
        ("https://api.example.com/v1", "without a path or user"),
        ("ftp://api.example.com", "is not a host or an origin"),
        ("https://api.example.com:99999", "is not a host or an origin"),
    ],
)
def test_a_key_that_would_send_a_secret_in_clear_is_refused_when_loaded(key: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        HttpHeaders.parse({key: {"Authorization": TOKEN}})
