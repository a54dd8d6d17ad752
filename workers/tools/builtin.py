"""Built-in server tools (layer: workers).

One job: the tools every server worker has without any MCP server, each a
``ToolDescriptor`` (type ``built_in``, JSON input schema) plus a synchronous
implementation. They work offline except ``http_get``. Implementations raise
``ToolFailed`` for failures they anticipate; ``workers.execute`` runs them in a
thread, enforces the call's timeout and sets ``ctx.cancel`` when it gives up.
"""

from __future__ import annotations

import email.message
import ipaddress
import string
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from workers.contracts import ToolDescriptor, ToolType
from workers.errors import InvalidArguments, ToolFailed


@dataclass(frozen=True)
class BuiltinContext:
    """What a running built-in may consult: a cancel flag and the call's deadline (time.monotonic)."""

    cancel: threading.Event = field(default_factory=threading.Event)
    deadline: float = float("inf")

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


@dataclass(frozen=True)
class BuiltinTool:
    descriptor: ToolDescriptor
    run: Callable[[dict[str, Any], BuiltinContext], Any]


def _descriptor(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> ToolDescriptor:
    schema = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return ToolDescriptor(name=name, type=ToolType.BUILT_IN, description=description, input_schema=schema)


# --- text_transform -------------------------------------------------------------------

_TEXT_OPS: dict[str, Callable[[str], Any]] = {
    "upper": str.upper,
    "lower": str.lower,
    "title": str.title,
    "reverse": lambda text: text[::-1],
    "strip": str.strip,
    "word_count": lambda text: len(text.split()),
}


def _text_transform(args: dict[str, Any], ctx: BuiltinContext) -> Any:
    text, op = args["text"], args["op"]
    if op == "template":
        return _fill_template(text, args.get("values", {}))
    return _TEXT_OPS[op](text)


def _fill_template(template: str, values: dict[str, Any]) -> str:
    try:
        fields = [(name, spec) for _, name, spec, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ToolFailed(f"text_transform: bad template: {exc}") from exc
    for name, spec in fields:
        # Attribute/index lookups (also in nested specs) reach object internals: plain names only.
        if not name.isidentifier() or "{" in (spec or ""):
            raise ToolFailed(f"text_transform: template field {{{name}}} must be a plain name like {{user}}")
        if name not in values:
            raise ToolFailed(f"text_transform: template uses {{{name}}} but values has no key {name!r}")
    try:
        return template.format_map(values)
    except (ValueError, TypeError) as exc:
        raise ToolFailed(f"text_transform: cannot fill the template: {exc}") from exc


# --- json_transform ---------------------------------------------------------------------


def _json_transform(args: dict[str, Any], ctx: BuiltinContext) -> Any:
    value = args["data"]
    if "pick" in args:
        value = _pick(value, args["pick"])
    if "keys" in args:
        value = _keep_keys(value, args["keys"])
    return value


def _pick(data: Any, path: str) -> Any:
    value, walked = data, "data"
    for part in path.split("."):
        if isinstance(value, dict):
            if part not in value:
                raise ToolFailed(
                    f"json_transform: {walked} has no key {part!r} (keys: {', '.join(map(str, value))})"
                )
            value = value[part]
        elif isinstance(value, list):
            if not part.lstrip("-").isdigit() or not -len(value) <= int(part) < len(value):
                raise ToolFailed(
                    f"json_transform: {walked} is a list of {len(value)}; {part!r} is not an index in it"
                )
            value = value[int(part)]
        else:
            raise ToolFailed(
                f"json_transform: {walked} is a {type(value).__name__}; cannot take {part!r} from it"
            )
        walked = f"{walked}.{part}"
    return value


def _keep_keys(value: Any, keys: list[str]) -> Any:
    if isinstance(value, dict):
        return {k: value[k] for k in keys if k in value}
    # A list of records is the common shape; keep the keys in each.
    if isinstance(value, list) and all(isinstance(item, dict) for item in value):
        return [{k: item[k] for k in keys if k in item} for item in value]
    raise ToolFailed(f"json_transform: keys needs an object or a list of objects, got {type(value).__name__}")


# --- http_get -------------------------------------------------------------------------------

_HEADERS_KEPT = ("content-type", "content-length", "last-modified", "etag", "location")
_BODY_HEAD = 500


def _http_get(args: dict[str, Any], ctx: BuiltinContext) -> Any:
    url = args["url"]
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArguments(
            f"http_get: url must be an http:// or https:// URL with a host, got {url!r}", field="url"
        )
    timeout = max(0.001, min(float(args.get("timeout_s", 10.0)), ctx.remaining()))
    max_bytes = int(args.get("max_bytes", 1_000_000))
    request = urllib.request.Request(url, headers={"User-Agent": "vancetope-http_get/1"})
    try:
        with _opener(parts.hostname).open(request, timeout=timeout) as response:
            body = response.read(max_bytes + 1)
            return _http_value(response.status, response.headers, body, max_bytes)
    except urllib.error.HTTPError as exc:
        head = exc.read(_BODY_HEAD).decode("utf-8", "replace")
        raise ToolFailed(
            f"http_get: {url} answered HTTP {exc.code} {exc.reason}: {head}", status=exc.code
        ) from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ToolFailed(f"http_get: {url} failed: {reason}") from exc


def _opener(host: str) -> urllib.request.OpenerDirector:
    """No proxy for loopback hosts (a proxy cannot reach our 127.0.0.1); the environment's otherwise."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    return (
        urllib.request.build_opener(urllib.request.ProxyHandler({}))
        if loopback
        else urllib.request.build_opener()
    )


def _http_value(status: int, headers: email.message.Message, body: bytes, max_bytes: int) -> dict[str, Any]:
    charset = headers.get_content_charset() or "utf-8"
    try:
        text = body[:max_bytes].decode(charset, "replace")
    except LookupError:
        text = body[:max_bytes].decode("utf-8", "replace")
    kept = {name: headers[name] for name in _HEADERS_KEPT if headers.get(name) is not None}
    return {"status": status, "headers": kept, "text": text, "truncated": len(body) > max_bytes}


# --- sleep, echo ----------------------------------------------------------------------------------


def _sleep(args: dict[str, Any], ctx: BuiltinContext) -> float:
    started = time.monotonic()
    # Event.wait, not time.sleep: execute sets ctx.cancel on timeout so the thread ends early.
    ctx.cancel.wait(float(args["seconds"]))
    return round(time.monotonic() - started, 3)


def _echo(args: dict[str, Any], ctx: BuiltinContext) -> Any:
    return args["value"]


# --- table ------------------------------------------------------------------------------------------

BUILTINS: dict[str, BuiltinTool] = {
    tool.descriptor.name: tool
    for tool in (
        BuiltinTool(
            _descriptor(
                "text_transform",
                "Transform text deterministically: upper, lower, title, reverse, strip, word_count, "
                "or template (fill {name} fields from `values`).",
                {
                    "text": {"type": "string"},
                    "op": {"enum": [*_TEXT_OPS, "template"]},
                    "values": {"type": "object", "description": "fields for op=template"},
                },
                ["text", "op"],
            ),
            _text_transform,
        ),
        BuiltinTool(
            _descriptor(
                "json_transform",
                "Select from JSON data: `pick` a dotted path (a.b.0.c), then keep only `keys` "
                "of the object (or of each object in a list).",
                {
                    "data": {"description": "any JSON value"},
                    "pick": {"type": "string", "minLength": 1},
                    "keys": {"type": "array", "items": {"type": "string"}},
                },
                ["data"],
            ),
            _json_transform,
        ),
        BuiltinTool(
            _descriptor(
                "http_get",
                "GET an http(s) URL; returns {status, headers, text, truncated}. Non-2xx answers fail.",
                {
                    "url": {"type": "string", "pattern": "^[hH][tT][tT][pP][sS]?://"},
                    "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 300},
                    "max_bytes": {"type": "integer", "minimum": 1, "maximum": 100_000_000},
                },
                ["url"],
            ),
            _http_get,
        ),
        BuiltinTool(
            _descriptor(
                "sleep",
                "Sleep for `seconds`, return the seconds slept (for testing timeouts).",
                {"seconds": {"type": "number", "minimum": 0, "maximum": 86_400}},
                ["seconds"],
            ),
            _sleep,
        ),
        BuiltinTool(
            _descriptor(
                "echo", "Return `value` unchanged.", {"value": {"description": "any JSON value"}}, ["value"]
            ),
            _echo,
        ),
    )
}


def builtin_descriptors() -> list[ToolDescriptor]:
    return [tool.descriptor for tool in BUILTINS.values()]
