"""The conformance suite's server requirements as one MCP server (test fixture, not product code).

One job: be the server that ``@modelcontextprotocol/conformance server`` scores 32/32, so that
the harness (``tests/conformance/run.py``) can put it behind the gateway and measure what the
gateway loses. Written here from the requirements each scenario of the pinned suite states
(``conformance list`` / the scenario descriptions in its package): the suite's own TypeScript
reference server is not published on a package registry. The harness checks this server
directly on every run (the baseline); anything it scores below 32/32 fails the harness.

``python reference_server.py`` serves over stdio (what the brain's mcpServers file and a client
agent's mcp.json start); ``python reference_server.py http PORT`` serves streamable HTTP at
``http://127.0.0.1:PORT/mcp`` (the direct baseline), with DNS-rebinding protection, an
in-memory event store (resumable SSE) and a 500 ms retry hint.
"""

from __future__ import annotations

import base64
import io
import itertools
import json
import sys
import warnings
import wave
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage

# The suite still tests logging/setLevel (2025-11-25); the SDK warns that 2026-07-28 deprecates it.
warnings.simplefilter("ignore")

# A 1x1 red PNG, and a 10 ms silent 8 kHz mono WAV.
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="


def _wav() -> str:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(1)
        w.setframerate(8000)
        w.writeframes(b"\x80" * 80)
    return base64.b64encode(out.getvalue()).decode()


WAV = _wav()
NO_ARGS: dict[str, Any] = {"type": "object", "properties": {}}


def _tool(name: str, description: str, schema: dict[str, Any] | None = None) -> types.Tool:
    return types.Tool(name=name, description=description, input_schema=schema or NO_ARGS)


def _string_args(*names: str) -> dict[str, Any]:
    return {"type": "object", "properties": {n: {"type": "string"} for n in names}, "required": list(names)}


TOOLS = [
    _tool("test_simple_text", "Returns simple text content"),
    _tool("test_image_content", "Returns image content"),
    _tool("test_audio_content", "Returns audio content"),
    _tool("test_embedded_resource", "Returns an embedded resource"),
    _tool("test_multiple_content_types", "Returns text, image and resource content"),
    _tool("test_tool_with_logging", "Sends three log messages while it runs"),
    _tool("test_tool_with_progress", "Reports progress 0, 50, 100 of 100"),
    _tool("test_error_handling", "Always returns an error result"),
    _tool("test_sampling", "Asks the client for an LLM completion", _string_args("prompt")),
    _tool("test_elicitation", "Asks the client for user input", _string_args("message")),
    _tool("test_elicitation_sep1034_defaults", "Elicitation with a default for each primitive type"),
    _tool("test_elicitation_sep1330_enums", "Elicitation with every enum schema variant"),
    _tool(
        "test_reconnection", "Closes its SSE stream mid-call; the result arrives after the client reconnects"
    ),
    _tool(
        "json_schema_2020_12_tool",
        "Tool with JSON Schema 2020-12 features",
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {
                "address": {
                    "type": "object",
                    "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                }
            },
            "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
            "additionalProperties": False,
        },
    ),
]

SEP1034_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "User name", "default": "John Doe"},
        "age": {"type": "integer", "description": "User age", "default": 30},
        "score": {"type": "number", "description": "User score", "default": 95.5},
        "status": {
            "type": "string",
            "description": "User status",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "description": "Verification status", "default": True},
    },
}

SEP1330_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {
            "type": "string",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {
            "type": "array",
            "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
        },
        "titledMulti": {
            "type": "array",
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            },
        },
    },
}


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def _image() -> types.ImageContent:
    return types.ImageContent(type="image", data=PNG, mime_type="image/png")


def _result(*content: Any, is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=list(content), is_error=is_error)


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    name, args, rid = params.name, params.arguments or {}, ctx.request_id
    if name == "test_simple_text":
        return _result(_text("This is a simple text response for testing."))
    if name == "test_image_content":
        return _result(_image())
    if name == "test_audio_content":
        return _result(types.AudioContent(type="audio", data=WAV, mime_type="audio/wav"))
    if name == "test_embedded_resource":
        resource = types.TextResourceContents(
            uri="test://embedded-resource",
            mime_type="text/plain",
            text="This is an embedded resource content.",
        )
        return _result(types.EmbeddedResource(type="resource", resource=resource))
    if name == "test_multiple_content_types":
        resource = types.TextResourceContents(
            uri="test://mixed-content-resource",
            mime_type="application/json",
            text=json.dumps({"test": "data", "value": 123}),
        )
        return _result(
            _text("Multiple content types test:"),
            _image(),
            types.EmbeddedResource(type="resource", resource=resource),
        )
    if name == "test_tool_with_logging":
        for i, message in enumerate(
            ("Tool execution started", "Tool processing data", "Tool execution completed")
        ):
            if i:
                await anyio.sleep(0.05)
            await ctx.session.send_log_message("info", message, related_request_id=rid)
        return _result(_text("Tool with logging executed successfully"))
    if name == "test_tool_with_progress":
        token = (ctx.meta or {}).get("progress_token")
        for i, progress in enumerate((0, 50, 100)):
            if i:
                await anyio.sleep(0.05)
            if token is not None:
                await ctx.session.send_progress_notification(token, progress, 100, related_request_id=rid)
        return _result(_text("Tool with progress executed successfully"))
    if name == "test_error_handling":
        return _result(_text("This tool intentionally returns an error for testing"), is_error=True)
    if name == "test_sampling":
        sampled = await ctx.session.create_message(
            [types.SamplingMessage(role="user", content=_text(str(args.get("prompt", ""))))],
            max_tokens=100,
            related_request_id=rid,
        )
        content = sampled.content
        text = (
            content.text
            if isinstance(content, types.TextContent)
            else json.dumps(sampled.model_dump(mode="json"))
        )
        return _result(_text(f"LLM response: {text}"))
    if name == "test_elicitation":
        schema = {
            "type": "object",
            "properties": {
                "username": {"type": "string", "description": "User's response"},
                "email": {"type": "string", "description": "User's email address"},
            },
            "required": ["username", "email"],
        }
        answer = await ctx.session.elicit_form(str(args.get("message", "")), schema, related_request_id=rid)
        return _result(_text(f"User response: action={answer.action}, content={json.dumps(answer.content)}"))
    if name in ("test_elicitation_sep1034_defaults", "test_elicitation_sep1330_enums"):
        schema = SEP1034_SCHEMA if name.endswith("defaults") else SEP1330_SCHEMA
        answer = await ctx.session.elicit_form("Conformance test elicitation", schema, related_request_id=rid)
        return _result(
            _text(f"Elicitation completed: action={answer.action}, content={json.dumps(answer.content)}")
        )
    if name == "test_reconnection":
        # Over streamable HTTP with an event store: close this request's SSE stream; the client
        # comes back with Last-Event-ID and gets the result (SEP-1699). Elsewhere: just answer.
        if ctx.close_sse_stream is not None:
            await anyio.sleep(0.05)
            await ctx.close_sse_stream()
            await anyio.sleep(0.7)
        return _result(_text("Reconnection test completed successfully"))
    if name == "json_schema_2020_12_tool":
        return _result(_text(f"json_schema_2020_12_tool called with {json.dumps(args)}"))
    return _result(_text(f"Unknown tool: {name}"), is_error=True)


RESOURCES = [
    types.Resource(
        uri="test://static-text",
        name="static-text",
        description="A static text resource",
        mime_type="text/plain",
    ),
    types.Resource(
        uri="test://static-binary",
        name="static-binary",
        description="A static binary resource",
        mime_type="image/png",
    ),
    types.Resource(
        uri="test://watched-resource",
        name="watched-resource",
        description="A resource to subscribe to",
        mime_type="text/plain",
    ),
]
TEMPLATE = "test://template/{id}/data"
SUBSCRIBED: set[str] = set()


async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=RESOURCES)


async def list_resource_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
    template = types.ResourceTemplate(
        uri_template=TEMPLATE, name="template", description="Data for an id", mime_type="application/json"
    )
    return types.ListResourceTemplatesResult(resource_templates=[template])


async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    uri = str(params.uri)
    contents: types.TextResourceContents | types.BlobResourceContents
    if uri == "test://static-text":
        contents = types.TextResourceContents(
            uri=uri, mime_type="text/plain", text="This is the content of the static text resource."
        )
    elif uri == "test://static-binary":
        contents = types.BlobResourceContents(uri=uri, mime_type="image/png", blob=PNG)
    elif uri == "test://watched-resource":
        contents = types.TextResourceContents(
            uri=uri, mime_type="text/plain", text="Watched resource content"
        )
    elif uri.startswith("test://template/") and uri.endswith("/data"):
        rid = uri[len("test://template/") : -len("/data")]
        data = {"id": rid, "templateTest": True, "data": f"Data for ID: {rid}"}
        contents = types.TextResourceContents(uri=uri, mime_type="application/json", text=json.dumps(data))
    else:
        raise ValueError(f"Unknown resource: {uri}")
    return types.ReadResourceResult(contents=[contents])


async def subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
    SUBSCRIBED.add(str(params.uri))
    return types.EmptyResult()


async def unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    SUBSCRIBED.discard(str(params.uri))
    return types.EmptyResult()


def _argument(name: str, description: str) -> types.PromptArgument:
    return types.PromptArgument(name=name, description=description, required=True)


PROMPTS = [
    types.Prompt(name="test_simple_prompt", description="A simple prompt without arguments"),
    types.Prompt(
        name="test_prompt_with_arguments",
        description="A prompt with two arguments",
        arguments=[_argument("arg1", "First test argument"), _argument("arg2", "Second test argument")],
    ),
    types.Prompt(
        name="test_prompt_with_embedded_resource",
        description="A prompt with an embedded resource",
        arguments=[_argument("resourceUri", "URI of the resource to embed")],
    ),
    types.Prompt(name="test_prompt_with_image", description="A prompt with an image"),
]


async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=PROMPTS)


def _user(content: Any) -> types.PromptMessage:
    return types.PromptMessage(role="user", content=content)


async def get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    args = params.arguments or {}
    if params.name == "test_simple_prompt":
        messages = [_user(_text("This is a simple prompt for testing."))]
    elif params.name == "test_prompt_with_arguments":
        text = f"Prompt with arguments: arg1='{args.get('arg1', '')}', arg2='{args.get('arg2', '')}'"
        messages = [_user(_text(text))]
    elif params.name == "test_prompt_with_embedded_resource":
        resource = types.TextResourceContents(
            uri=args.get("resourceUri", "test://example-resource"),
            mime_type="text/plain",
            text="Embedded resource content for testing.",
        )
        messages = [
            _user(types.EmbeddedResource(type="resource", resource=resource)),
            _user(_text("Please process the embedded resource above.")),
        ]
    elif params.name == "test_prompt_with_image":
        messages = [_user(_image()), _user(_text("Please analyze the image above."))]
    else:
        raise ValueError(f"Unknown prompt: {params.name}")
    return types.GetPromptResult(messages=messages)


async def complete(ctx: Any, params: types.CompleteRequestParams) -> types.CompleteResult:
    value = params.argument.value
    values = [v for v in ("paris", "park", "party", "test", "testing") if v.startswith(value)]
    return types.CompleteResult(completion=types.Completion(values=values, total=len(values), has_more=False))


async def set_level(ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


server: Server[Any] = Server(
    "vancetope-conformance-reference",
    version="1.0.0",
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_list_resources=list_resources,
    on_list_resource_templates=list_resource_templates,
    on_read_resource=read_resource,
    on_subscribe_resource=subscribe,
    on_unsubscribe_resource=unsubscribe,
    on_list_prompts=list_prompts,
    on_get_prompt=get_prompt,
    on_completion=complete,
    on_set_logging_level=set_level,
)


class MemoryEventStore(EventStore):
    """Every event of this process, for replay after a Last-Event-ID (resumable SSE)."""

    def __init__(self) -> None:
        self._events: list[tuple[StreamId, EventId, JSONRPCMessage | None]] = []
        self._ids = itertools.count(1)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        event_id = str(next(self._ids))
        self._events.append((stream_id, event_id, message))
        return event_id

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        found = next((i for i, (_, eid, _) in enumerate(self._events) if eid == last_event_id), None)
        if found is None:
            return None
        stream_id = self._events[found][0]
        for sid, eid, message in self._events[found + 1 :]:
            if sid == stream_id and message is not None:
                await send_callback(EventMessage(message, eid))
        return stream_id


def main(argv: list[str]) -> None:
    if len(argv) >= 2 and argv[0] == "http":
        import uvicorn

        app = server.streamable_http_app(event_store=MemoryEventStore(), retry_interval=500, host="127.0.0.1")
        uvicorn.run(app, host="127.0.0.1", port=int(argv[1]), log_level="warning")
        return
    from mcp.server.stdio import stdio_server

    async def serve() -> None:
        async with stdio_server() as (read, write):
            options = server.create_initialization_options(NotificationOptions())
            await server.run(read, write, options)

    anyio.run(serve)


if __name__ == "__main__":
    main(sys.argv[1:])
