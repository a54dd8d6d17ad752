"""workers.tools.builtin: each built-in, table-driven, plus http_get against a loopback server
(refused unless allow-listed, as every internal address is)."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from jsonschema import validators

from tests.conftest import InThread, wait_until
from workers.contracts import ToolCall, ToolType
from workers.errors import InvalidArguments, ToolFailed
from workers.execute import execute
from workers.tools.builtin import BUILTINS, BuiltinContext, builtin_descriptors, builtin_tools
from workers.tools.http_get import DestinationRefused
from workers.tools.netguard import HttpAllow

LOOPBACK_ALLOWED = builtin_tools(HttpAllow.parse(["127.0.0.1"]))


def run(tool: str, **args: Any) -> Any:
    return BUILTINS[tool].run(args, BuiltinContext())


def get_allowed(**args: Any) -> Any:
    """http_get on a server whose http_allow admits 127.0.0.1 (where the test server listens)."""
    return LOOPBACK_ALLOWED["http_get"].run(args, BuiltinContext())


def test_descriptors_are_built_in_with_valid_schemas() -> None:
    descriptors = builtin_descriptors()
    assert {d.name for d in descriptors} == {"text_transform", "json_transform", "http_get", "sleep", "echo"}
    for descriptor in descriptors:
        assert (
            descriptor.type is ToolType.BUILT_IN and descriptor.mcp_server is None and descriptor.description
        )
        validators.validator_for(descriptor.input_schema).check_schema(descriptor.input_schema)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"op": "upper", "text": "Hello World"}, "HELLO WORLD"),
        ({"op": "lower", "text": "Hello World"}, "hello world"),
        ({"op": "title", "text": "hello wide world"}, "Hello Wide World"),
        ({"op": "reverse", "text": "abc"}, "cba"),
        ({"op": "strip", "text": "  pad \n"}, "pad"),
        ({"op": "word_count", "text": " one two\tthree\n"}, 3),
        ({"op": "template", "text": "Hi {name}, {n:03d}", "values": {"name": "Ada", "n": 7}}, "Hi Ada, 007"),
    ],
)
def test_text_transform(args: dict[str, Any], expected: Any) -> None:
    assert run("text_transform", **args) == expected


@pytest.mark.parametrize(
    ("text", "values", "fragment"),
    [
        ("Hi {name}", {}, "template uses {name} but values has no key 'name'"),
        ("{x.__class__}", {"x": 1}, "template field {x.__class__} must be a plain name"),
        ("{x[0]}", {"x": [1]}, "template field {x[0]} must be a plain name"),
        ("{x:{y.__class__}}", {"x": 1, "y": 2}, "must be a plain name"),
        ("{0}", {}, "template field {0} must be a plain name"),
        ("{x", {"x": 1}, "bad template"),
    ],
)
def test_text_template_refuses_lookups_and_missing_values(
    text: str, values: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ToolFailed) as info:
        run("text_transform", op="template", text=text, values=values)
    assert fragment in info.value.message


DATA = {"a": {"b": [{"c": 1, "d": 2}, {"c": 3, "d": 4}]}, "top": True}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({}, DATA),
        ({"pick": "a.b.0.c"}, 1),
        ({"pick": "a.b.-1"}, {"c": 3, "d": 4}),
        ({"pick": "a.b", "keys": ["c"]}, [{"c": 1}, {"c": 3}]),
        ({"keys": ["top", "missing"]}, {"top": True}),
    ],
)
def test_json_transform(args: dict[str, Any], expected: Any) -> None:
    assert run("json_transform", data=DATA, **args) == expected


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({"pick": "a.x"}, "data.a has no key 'x' (keys: b)"),
        ({"pick": "a.b.9"}, "data.a.b is a list of 2; '9' is not an index in it"),
        ({"pick": "top.z"}, "data.top is a bool; cannot take 'z' from it"),
        ({"pick": "top", "keys": ["k"]}, "keys needs an object or a list of objects, got bool"),
    ],
)
def test_json_transform_errors(args: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ToolFailed) as info:
        run("json_transform", data=DATA, **args)
    assert fragment in info.value.message


def test_echo_and_sleep() -> None:
    assert run("echo", value={"nested": [1, None]}) == {"nested": [1, None]}
    # sleep reports the seconds it slept: at least those asked for, at most the call's own
    # duration (no upper bound in seconds: that would measure this machine's load)
    started = time.monotonic()
    slept = run("sleep", seconds=0.05)
    call = time.monotonic() - started
    assert 0.05 <= slept <= round(call, 3) + 0.001


def test_sleep_stops_when_cancelled() -> None:
    ctx = BuiltinContext()
    threading.Timer(0.1, ctx.cancel.set).start()
    # asked for 10 minutes: returns (with the time it slept) long before
    sleeping = InThread(lambda: BUILTINS["sleep"].run({"seconds": 600}, ctx))
    wait_until(sleeping.done, timeout=60, what="the cancelled sleep to return")
    assert sleeping.result() < 600


class _Handler(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[str]] = []  # every request line's path, proxied ones included

    def do_GET(self) -> None:
        self.seen.append(self.path)
        port = self.server.server_address[1]
        redirects = {
            "/redirect": "/hello",
            "/loop": "/loop",
            "/to-ipv6-loopback": f"http://[::1]:{port}/hello",
            "/to-metadata": "http://169.254.169.254/latest/meta-data/iam/",
            "/to-file": "file:///etc/passwd",
        }
        if self.path in redirects:
            self.send_response(302)
            self.send_header("Location", redirects[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/missing":
            self._answer(404, b"no such page here")
        elif self.path == "/busy":
            self.send_response(429)
            self.send_header("Retry-After", "7")
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"slow")
        elif self.path == "/big":
            self._answer(200, b"y" * 5000)
        else:
            self._answer(200, "héllo".encode(), "text/plain; charset=utf-8")

    def _answer(self, status: int, body: bytes, ctype: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output quiet


@pytest.fixture(scope="module")
def loopback() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_http_get_ok_when_the_target_is_allow_listed(loopback: str) -> None:
    value = get_allowed(url=f"{loopback}/hello")
    assert value["status"] == 200 and value["text"] == "héllo" and value["truncated"] is False
    assert value["headers"]["content-type"] == "text/plain; charset=utf-8"


def test_http_get_truncates_at_max_bytes(loopback: str) -> None:
    value = get_allowed(url=f"{loopback}/big", max_bytes=100)
    assert value["text"] == "y" * 100 and value["truncated"] is True


def test_http_get_non_2xx_fails_with_status_and_body(loopback: str) -> None:
    with pytest.raises(ToolFailed) as info:
        get_allowed(url=f"{loopback}/missing")
    assert "answered HTTP 404" in info.value.message and "no such page here" in info.value.message
    assert info.value.data == {"status": 404}


def test_http_get_429_carries_the_seconds_its_retry_after_names(loopback: str) -> None:
    # The recorder pauses the calls to that origin for them (brain.runtime.intake, workers.throttle).
    with pytest.raises(ToolFailed) as info:
        get_allowed(url=f"{loopback}/busy")
    assert "answered HTTP 429" in info.value.message
    assert info.value.data == {"status": 429, "retry_after_s": 7.0, "origin": loopback}


def test_http_get_refuses_other_schemes_and_reports_refusals() -> None:
    with pytest.raises(InvalidArguments, match="must be an http:// or https:// URL"):
        run("http_get", url="file:///etc/passwd")
    with pytest.raises(ToolFailed, match=r"http://127.0.0.1:9/ failed: .*refused"):
        get_allowed(url="http://127.0.0.1:9/", timeout_s=2)


def test_http_get_refuses_a_loopback_server_by_default_naming_the_setting(loopback: str) -> None:
    before = len(_Handler.seen)
    with pytest.raises(DestinationRefused) as info:
        run("http_get", url=f"{loopback}/hello")
    assert info.value.message.startswith(
        f"http_get: refusing {loopback}/hello: 127.0.0.1 is a loopback address. Server tools may not reach"
    )
    assert "http_allow setting (VANCETOPE_HTTP_ALLOW" in info.value.message
    assert len(_Handler.seen) == before, "the refused request reached the server"


def test_http_get_judges_the_addresses_a_name_resolves_to(loopback: str) -> None:
    port = loopback.rsplit(":", 1)[1]
    with pytest.raises(DestinationRefused, match=r"'localhost' resolves to (127\.0\.0\.1|::1), a loopback"):
        run("http_get", url=f"http://localhost:{port}/hello")


def test_http_get_follows_a_redirect_to_an_allowed_target(loopback: str) -> None:
    assert get_allowed(url=f"{loopback}/redirect")["text"] == "héllo"


@pytest.mark.parametrize(
    ("path", "refusal"),
    [
        ("/to-ipv6-loopback", "::1 is a loopback address"),
        ("/to-metadata", "169.254.169.254 is a cloud metadata address"),
    ],
)
def test_http_get_judges_every_redirect_again(loopback: str, path: str, refusal: str) -> None:
    with pytest.raises(DestinationRefused, match=refusal):
        get_allowed(url=f"{loopback}{path}")


def test_http_get_gives_up_on_a_redirect_loop_and_on_a_redirect_to_another_scheme(loopback: str) -> None:
    with pytest.raises(ToolFailed, match="redirected more than 5 times"):
        get_allowed(url=f"{loopback}/loop")
    with pytest.raises(ToolFailed, match="a redirect led to 'file:///etc/passwd'"):
        get_allowed(url=f"{loopback}/to-file")


def test_http_get_does_not_let_an_environment_proxy_reach_an_internal_address(
    loopback: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A proxy would fetch the URL on our behalf from wherever it sits; the URL's address is judged anyway.
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, loopback)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    before = len(_Handler.seen)
    with pytest.raises(DestinationRefused, match="10.20.30.40 is a private address"):
        run("http_get", url="http://10.20.30.40/admin", timeout_s=2)
    assert len(_Handler.seen) == before, "the request went through the proxy"


def test_execute_runs_the_built_ins_a_worker_was_given(loopback: str) -> None:
    call = ToolCall(
        run_id="r1", tree_id="t1", task_id="k1", tool="http_get", tool_type=ToolType.BUILT_IN,
        args={"url": f"{loopback}/hello"}, timeout_s=10, max_result_bytes=1_000_000,
    )  # fmt: skip
    assert execute(call, mcp=None, worker="w", builtins=LOOPBACK_ALLOWED).ok
    refused = execute(call, mcp=None, worker="w")
    assert refused.error is not None and refused.error.type == "DestinationRefused"
