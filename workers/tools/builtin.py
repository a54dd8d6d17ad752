"""Built-in server tools (layer: workers).

One job: the tools every server worker has without any MCP server, each a
``ToolDescriptor`` (type ``built_in``, JSON input schema) plus a synchronous
implementation. They work offline except ``http_get``, which reaches only public
addresses unless the server's ``http_allow`` setting admits a target (``builtin_tools``
takes it; ``BUILTINS`` is the table without any). Implementations raise
``ToolFailed`` for failures they anticipate; ``workers.execute`` runs one that may
block in a thread, enforces the call's timeout and sets ``ctx.cancel`` when it gives up,
and runs one that cannot block (``blocks=False``) in the calling thread.
"""

from __future__ import annotations

import string
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workers.contracts import ToolDescriptor, ToolType
from workers.errors import ToolFailed
from workers.tools.http_get import NO_HEADERS, HttpHeaders, http_get
from workers.tools.netguard import ALLOW_NONE, HttpAllow


@dataclass(frozen=True)
class BuiltinContext:
    """What a running built-in may consult: a cancel flag and the call's deadline (time.monotonic)."""

    cancel: threading.Event = field(default_factory=threading.Event)
    deadline: float = float("inf")

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


@dataclass(frozen=True)
class BuiltinTool:
    """A tool and how to run it. ``blocks``: whether it may wait on something outside the
    process (a socket, a pipe, a file on a network mount, a timer), so that only a thread the
    caller can stop waiting for enforces its timeout. A tool that only computes on its
    arguments (work bounded by their size, no I/O) says False and runs inline: a thread
    could not stop it anyway (it holds the GIL), and handing it to one was a fifth of a
    server worker child's time per task (bench/README.md). New tools block unless they say
    otherwise."""

    descriptor: ToolDescriptor
    run: Callable[[dict[str, Any], BuiltinContext], Any]
    blocks: bool = True


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


# --- http_get: workers.tools.http_get (judged by workers.tools.netguard) -------------------------


# --- sleep, echo ----------------------------------------------------------------------------------


def _sleep(args: dict[str, Any], ctx: BuiltinContext) -> float:
    started = time.monotonic()
    # Event.wait, not time.sleep: execute sets ctx.cancel on timeout so the thread ends early.
    ctx.cancel.wait(float(args["seconds"]))
    return round(time.monotonic() - started, 3)


def _echo(args: dict[str, Any], ctx: BuiltinContext) -> Any:
    return args["value"]


# --- table ------------------------------------------------------------------------------------------


def builtin_tools(
    http_allow: HttpAllow = ALLOW_NONE, http_headers: HttpHeaders = NO_HEADERS
) -> dict[str, BuiltinTool]:
    """Every built-in, by name; ``http_get`` may reach the internal targets ``http_allow`` admits
    and adds the server's ``http_headers`` for their hosts."""

    def get(args: dict[str, Any], ctx: BuiltinContext) -> Any:
        return http_get(args, ctx.remaining(), http_allow, http_headers)

    return {tool.descriptor.name: tool for tool in _tools(get)}


def _tools(http_get_run: Callable[[dict[str, Any], BuiltinContext], Any]) -> tuple[BuiltinTool, ...]:
    return (
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
            blocks=False,
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
            blocks=False,
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
            http_get_run,
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
            blocks=False,
        ),
    )


BUILTINS: dict[str, BuiltinTool] = builtin_tools()


def builtin_descriptors() -> list[ToolDescriptor]:
    return [tool.descriptor for tool in BUILTINS.values()]
