"""workers.tools.builtin: each built-in, table-driven, plus http_get against a loopback server."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from jsonschema import validators

from workers.contracts import ToolType
from workers.errors import InvalidArguments, ToolFailed
from workers.tools.builtin import BUILTINS, BuiltinContext, builtin_descriptors


def run(tool: str, **args: Any) -> Any:
    return BUILTINS[tool].run(args, BuiltinContext())


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
    assert 0.05 <= run("sleep", seconds=0.05) < 1


def test_sleep_stops_when_cancelled() -> None:
    ctx = BuiltinContext()
    threading.Timer(0.1, ctx.cancel.set).start()
    started = time.monotonic()
    BUILTINS["sleep"].run({"seconds": 30}, ctx)
    assert time.monotonic() - started < 5


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/missing":
            self._answer(404, b"no such page here")
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


def test_http_get_ok(loopback: str) -> None:
    value = run("http_get", url=f"{loopback}/hello")
    assert value["status"] == 200 and value["text"] == "héllo" and value["truncated"] is False
    assert value["headers"]["content-type"] == "text/plain; charset=utf-8"


def test_http_get_truncates_at_max_bytes(loopback: str) -> None:
    value = run("http_get", url=f"{loopback}/big", max_bytes=100)
    assert value["text"] == "y" * 100 and value["truncated"] is True


def test_http_get_non_2xx_fails_with_status_and_body(loopback: str) -> None:
    with pytest.raises(ToolFailed) as info:
        run("http_get", url=f"{loopback}/missing")
    assert "answered HTTP 404" in info.value.message and "no such page here" in info.value.message
    assert info.value.data == {"status": 404}


def test_http_get_refuses_other_schemes_and_reports_refusals() -> None:
    with pytest.raises(InvalidArguments, match="must be an http:// or https:// URL"):
        run("http_get", url="file:///etc/passwd")
    with pytest.raises(ToolFailed, match="http://127.0.0.1:9/ failed"):
        run("http_get", url="http://127.0.0.1:9/", timeout_s=2)
