"""workers.mcp_config: the mcpServers format and its error messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers.errors import WorkerError
from workers.mcp_config import (
    HttpServerSpec,
    MCPConfigError,
    StdioServerSpec,
    load_mcp_config,
    parse_mcp_config,
    skipped_servers,
)


def parse(doc: object, environ: dict[str, str] | None = None):
    return parse_mcp_config(json.dumps(doc), "cfg.json", environ=environ or {})


def test_stdio_and_http_servers_parse() -> None:
    config = parse(
        {
            "mcpServers": {
                "fs": {
                    "command": "npx",
                    "args": ["-y", "server-fs", "/tmp"],
                    "env": {"A": "1"},
                    "cwd": "/tmp",
                },
                "web": {"url": "https://example.com/mcp", "headers": {"X-Key": "k"}},
                "typed": {"type": "streamable-http", "url": "http://127.0.0.1:1/mcp"},
                "typed_stdio": {"type": "stdio", "command": "srv", "disabled": False},
            }
        }
    )
    fs, web, typed, typed_stdio = (config.servers[n] for n in ("fs", "web", "typed", "typed_stdio"))
    assert isinstance(fs, StdioServerSpec) and fs.args == ["-y", "server-fs", "/tmp"] and fs.cwd == "/tmp"
    assert fs.describe() == "command npx with 3 argument(s)"  # arguments may hold tokens: never in errors
    assert isinstance(web, HttpServerSpec) and web.headers == {"X-Key": "k"}
    assert isinstance(typed, HttpServerSpec) and isinstance(typed_stdio, StdioServerSpec)
    assert config.source == "cfg.json"


def test_env_and_header_vars_are_expanded_from_the_environment() -> None:
    config = parse(
        {
            "mcpServers": {
                "a": {"command": "x", "env": {"TOKEN": "${SECRET}", "PLAIN": "p"}},
                "b": {"url": "http://h/mcp", "headers": {"Authorization": "Bearer ${SECRET}"}},
            }
        },
        environ={"SECRET": "s3"},
    )
    assert config.servers["a"].env == {"TOKEN": "s3", "PLAIN": "p"}  # type: ignore[union-attr]
    assert config.servers["b"].headers == {"Authorization": "Bearer s3"}  # type: ignore[union-attr]


def test_empty_server_map_is_fine() -> None:
    assert parse({"mcpServers": {}}).servers == {}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            '{"mcpServers": {',
            "cfg.json: not valid JSON: Expecting property name enclosed in double quotes at line 1 column 17",
        ),
        ("[]", 'cfg.json: the top level must be a JSON object with an "mcpServers" key'),
        ('{"servers": {}}', 'cfg.json: missing the "mcpServers" object'),
        ('{"mcpServers": []}', 'cfg.json: "mcpServers" must be an object mapping server names to settings'),
    ],
)
def test_a_file_that_is_not_an_mcp_servers_object_fails_naming_the_file(text: str, fragment: str) -> None:
    with pytest.raises(MCPConfigError) as info:
        parse_mcp_config(text, "cfg.json", environ={})
    assert fragment in info.value.message
    assert isinstance(info.value, WorkerError)
    assert info.value.to_info().type == "MCPConfigError"


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ("1", "cfg.json: server 'a': settings must be an object"),
        ("{}", 'cfg.json: server \'a\': has neither "command" (stdio) nor "url" (http)'),
        ('{"command": "x", "url": "http://h"}', 'cfg.json: server \'a\': has both "command" and "url"'),
        ('{"type": "sse", "url": "http://h"}', "cfg.json: server 'a': unsupported type 'sse'"),
        ('{"type": "stdio", "url": "http://h"}', "cfg.json: server 'a': type 'stdio' needs \"command\""),
        ('{"type": "http", "command": "x"}', "cfg.json: server 'a': type 'http' needs \"url\""),
        ('{"command": ""}', "cfg.json: server 'a': command: String should have at least 1 character"),
        ('{"command": "x", "args": "-v"}', "cfg.json: server 'a': args: Input should be a valid list"),
        ('{"command": "x", "env": {"N": 1}}', "cfg.json: server 'a': env.N: Input should be a valid string"),
        ('{"url": "ftp://h"}', "cfg.json: server 'a': url 'ftp://h' must start with http:// or https://"),
        (
            '{"command": "x", "env": {"TOKEN": "${NOPE_UNSET}"}}',
            "cfg.json: server 'a': env 'TOKEN' refers to ${NOPE_UNSET}, but NOPE_UNSET is not set in the environment",
        ),
        ('{"command": "x", "disabled": true}', "cfg.json: server 'a' is disabled in the file; skipped"),
        (
            '{"command": "x", "env": {"U": "${VANCETOPE_REDIS_URL}"}}',
            "cfg.json: server 'a': env 'U' refers to ${VANCETOPE_REDIS_URL}; the stack's own settings",
        ),
        (
            '{"command": "x", "env": {"vancetope_vault_key": "k"}}',
            "cfg.json: server 'a': env 'vancetope_vault_key': VANCETOPE_* variables are the stack's own",
        ),
    ],
)
def test_an_entry_that_cannot_be_used_is_skipped_with_its_reason_and_the_others_load(
    entry: str, fragment: str
) -> None:
    text = '{"mcpServers": {"a": ' + entry + ', "good": {"command": "mcp-server-time"}}}'
    config = parse_mcp_config(text, "cfg.json", environ={})
    assert list(config.servers) == ["good"]
    assert fragment in config.skipped["a"]
    assert [(f.server, f.message) for f in skipped_servers(config)] == [("a", config.skipped["a"])]


def test_load_reads_a_file_and_names_it(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"t": {"command": "x"}}}))
    assert load_mcp_config(path).source == str(path)
    path.write_text("{\n  oops\n}")
    with pytest.raises(MCPConfigError, match=r"mcp\.json: not valid JSON: .* at line 2 column 3"):
        load_mcp_config(path)
    with pytest.raises(
        MCPConfigError, match=r"missing\.json: cannot read the MCP config: No such file or directory"
    ):
        load_mcp_config(tmp_path / "missing.json")


def test_process_environment_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VT_TEST_TOKEN", "from-env")
    config = parse_mcp_config(
        '{"mcpServers": {"a": {"command": "x", "env": {"T": "${VT_TEST_TOKEN}"}}}}', "c.json"
    )
    assert config.servers["a"].env == {"T": "from-env"}  # type: ignore[union-attr]
