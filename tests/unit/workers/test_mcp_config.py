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


# --- issue 24, item 5: config files as users write them ------------------------------------------


def test_jsonc_comments_and_trailing_commas_load_as_vs_code_writes_them() -> None:
    text = """{
      // note: the time server, for the demo
      "mcpServers": {
        "time": {
          "command": "mcp-server-time", /* the pip package */
          "args": ["--local-timezone", "UTC",],
        },
        "web": {"url": "https://example.com/a//b", "headers": {"X-Sep": ",]"}},
      },
    }"""
    config = parse_mcp_config(text, "mcp.json", environ={})
    assert config.servers["time"].args == ["--local-timezone", "UTC"]  # type: ignore[union-attr]
    web = config.servers["web"]
    assert isinstance(web, HttpServerSpec) and web.url == "https://example.com/a//b"
    assert web.headers == {"X-Sep": ",]"}
    with pytest.raises(MCPConfigError, match=r"mcp\.json: not valid JSON: .* at line 3 column 9"):
        parse_mcp_config('{"mcpServers": {\n  // fine\n    "a" {}}}', "mcp.json", environ={})


def test_variables_expand_in_command_args_env_headers_url_and_cwd() -> None:
    environ = {"BIN": "/opt/bin", "TOKEN": "t0k", "EMPTY": "", "HOST": "mcp.example.com"}
    config = parse(
        {
            "mcpServers": {
                "local": {
                    "command": "${BIN}/server",
                    "args": ["--token-file=${env:TOKEN}", "--level=${LEVEL:-info}", "--x=${EMPTY:-dflt}"],
                    "env": {"T": "${TOKEN}", "V": "${vault:GITHUB_TOKEN}", "E": "[${EMPTY}]"},
                    "cwd": "${BIN}/work",
                },
                "remote": {
                    "url": "https://${HOST}/mcp",
                    "headers": {"Authorization": "Bearer ${env:TOKEN}", "X-Port": "${PORT:-443}"},
                },
            }
        },
        environ=environ,
    )
    local, remote = config.servers["local"], config.servers["remote"]
    assert isinstance(local, StdioServerSpec) and isinstance(remote, HttpServerSpec)
    assert local.command == "/opt/bin/server" and local.cwd == "/opt/bin/work"
    # ${VAR:-default}: the default when VAR is unset or empty, as in a shell
    assert local.args == ["--token-file=t0k", "--level=info", "--x=dflt"]
    # ${vault:…} stays a reference, resolved as the server starts
    assert local.env == {"T": "t0k", "V": "${vault:GITHUB_TOKEN}", "E": "[]"}
    assert remote.url == "https://mcp.example.com/mcp"
    assert remote.headers == {"Authorization": "Bearer t0k", "X-Port": "443"}


def test_input_variables_are_refused_naming_the_server_and_the_key_and_what_to_do() -> None:
    config = parse(
        {
            "mcpServers": {
                "gh": {"command": "gh-mcp", "env": {"GITHUB_TOKEN": "${input:github_token}"}},
                "db": {"command": "db-mcp", "args": ["--password", "${input:pw}"]},
                "api": {"url": "https://h/mcp", "headers": {"Authorization": "Bearer ${input:key}"}},
                "fine": {"command": "x"},
            }
        }
    )
    assert list(config.servers) == ["fine"]
    assert config.skipped["gh"].startswith(
        "cfg.json: server 'gh': env 'GITHUB_TOKEN' holds ${input:github_token}, a value VS Code asks its user for"
    )
    assert config.skipped["db"].startswith("cfg.json: server 'db': args[1] holds ${input:pw}")
    assert config.skipped["api"].startswith(
        "cfg.json: server 'api': headers 'Authorization' holds ${input:key}"
    )
    assert "write ${env:NAME} instead" in config.skipped["gh"] and "${vault:NAME}" in config.skipped["gh"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"command": "x", "arg": ["-v"]},
            (
                "cfg.json: server 'a': unknown key 'arg' (did you mean 'args'?); a server takes command, args, env, "
                "envFile and cwd (stdio), or url and headers (http), and type, disabled, rate_limit and max_concurrency"
            ),
        ),
        ({"cmd": "x"}, "cfg.json: server 'a': unknown key 'cmd' (did you mean 'command'?)"),
        ({"command": "x", "environment": {}}, "server 'a': unknown key 'environment' (did you mean 'env'?)"),
        ({"Command": "x"}, "server 'a': unknown key 'Command' (did you mean 'command'?)"),
        ({"command": "x", "env_file": ".env"}, "unknown key 'env_file' (did you mean 'envFile'?)"),
        ({"serverUrl": "https://h/mcp"}, "unknown key 'serverUrl' (did you mean 'url'?)"),
        ({"command": "x", "timeout": 60}, "server 'a': unknown key 'timeout'; a server takes"),
        (
            {"command": "x", "headers": {"X": "y"}},
            "server 'a': 'headers' does not apply to this server, which has \"command\"",
        ),
        (
            {"url": "https://h/mcp", "args": ["-v"]},
            "server 'a': 'args' does not apply to this server, which has \"url\"",
        ),
        ({"url": "https://h/mcp", "envFile": ".env"}, "'envFile' does not apply to this server"),
        ({"command": "x", "disabled": "yes"}, "server 'a': disabled must be true or false, not 'yes'"),
        (
            {"command": "${config:tool.path}"},
            "server 'a': command holds ${config:tool.path}, which is not expanded",
        ),
        (
            {"command": "x", "cwd": "${workspaceFolder}"},
            (
                "cwd refers to ${workspaceFolder}, but workspaceFolder is "
                "not set in the environment (a variable VS Code fills in itself)"
            ),
        ),
        (
            {"command": "x", "args": ["${VANCETOPE_REDIS_URL:-x}"]},
            "args[0] refers to ${VANCETOPE_REDIS_URL:-x}; the stack's own settings",
        ),
        (
            {"url": "https://h/${vault:PATH_TOKEN}"},
            "url holds ${vault:PATH_TOKEN}, which is resolved in env and headers only",
        ),
        (
            {"command": "x", "env": {"T": "${vault:bad name}"}},
            "env 'T' holds ${vault:bad name}, which is not",
        ),
    ],
)
def test_what_would_be_ignored_or_passed_on_literally_is_refused_naming_server_and_key(
    entry: dict[str, object], message: str
) -> None:
    config = parse({"mcpServers": {"a": entry, "good": {"command": "mcp-server-time"}}})
    assert list(config.servers) == ["good"]
    assert message in config.skipped["a"]


def test_keys_other_clients_write_and_this_parser_knows_still_load() -> None:
    config = parse(
        {
            "mcpServers": {
                "cline": {"command": "x", "autoApprove": ["read"], "disabled": False, "type": "stdio"},
                "vscode": {"type": "http", "url": "https://h/mcp", "headers": {}, "env": {}},
            }
        }
    )
    assert set(config.servers) == {"cline", "vscode"} and config.skipped == {}


def test_env_file_is_read_beside_the_config_and_env_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "gh.env").write_text(
        "# the token for the GitHub server\n"
        "\n"
        "GITHUB_TOKEN=ghp_from_file\n"
        "export REGION = eu-west-1  # inline comment\n"
        'GREETING="hello # not a comment\\nworld"\n'
        "LITERAL='${NOT_EXPANDED} \\n'\n"
        "HOME_DIR=${HOME_FOR_TEST}/x\n"
        "SHARED=from-file\n"
    )
    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "gh": {"command": "gh-mcp", "envFile": "secrets/gh.env", "env": {"SHARED": "from-env"}}
                }
            }
        )
    )
    monkeypatch.chdir("/")  # relative to the config file's folder, not the current one
    monkeypatch.setenv("HOME_FOR_TEST", "/home/ada")
    monkeypatch.setenv("NOT_EXPANDED", "oops")
    spec = load_mcp_config(path).servers["gh"]
    assert isinstance(spec, StdioServerSpec)
    assert spec.env == {
        "GITHUB_TOKEN": "ghp_from_file",
        "REGION": "eu-west-1",
        "GREETING": "hello # not a comment\nworld",
        "LITERAL": "${NOT_EXPANDED} \\n",  # single quotes: as written
        "HOME_DIR": "/home/ada/x",
        "SHARED": "from-env",
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "server 'gh': envFile 'gh.env' ({dir}/gh.env) cannot be read: No such file or directory"),
        (
            "GOOD=1\nthis line has no equals sign\n",
            "server 'gh': envFile 'gh.env' ({dir}/gh.env): line 2 is not NAME=VALUE",
        ),
        (
            'TOKEN="s3cret\n',
            "envFile 'gh.env' ({dir}/gh.env): line 1 (TOKEN): a quoted value must end with its quote",
        ),
        (
            "VANCETOPE_VAULT_KEY=k\n",
            (
                "envFile 'gh.env' ({dir}/gh.env) line 1, VANCETOPE_VAULT_KEY: VANCETOPE_* "
                "variables are the stack's own"
            ),
        ),
        ("T=${input:tok}\n", "envFile 'gh.env' ({dir}/gh.env) line 1, T holds ${input:tok}"),
    ],
)
def test_an_env_file_that_cannot_be_used_skips_its_server_naming_the_file(
    tmp_path: Path, content: str | None, message: str
) -> None:
    if content is not None:
        (tmp_path / "gh.env").write_text(content)
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"gh": {"command": "x", "envFile": "gh.env"}}}))
    config = load_mcp_config(path)
    assert config.servers == {}
    assert message.replace("{dir}", str(tmp_path)) in config.skipped["gh"]
    assert "s3cret" not in config.skipped["gh"]  # a value never reaches a message


def test_an_entry_whose_edit_cannot_be_used_keeps_its_last_good_definition() -> None:
    before = parse(
        {
            "mcpServers": {
                "git": {"command": "mcp-server-git"},
                "time": {"command": "t"},
                "old": {"command": "o"},
            }
        }
    )
    after = parse_mcp_config(
        json.dumps(
            {
                "mcpServers": {
                    "git": {"command": "mcp-server-git", "arg": ["--repository", "."]},  # broken edit
                    "time": {"command": "t", "disabled": True},  # switched off on purpose
                    "new": {"cmd": "n"},  # broken, and no last good definition
                    "fresh": {"command": "f"},
                }
            }
        ),
        "cfg.json",
        environ={},
        previous=before,
    )
    assert after.servers == {"git": before.servers["git"], "fresh": StdioServerSpec(command="f")}
    assert after.kept == {
        "git": "cfg.json: server 'git': unknown key 'arg' (did you mean 'args'?); a server takes command, args, "
        "env, envFile and cwd (stdio), or url and headers (http), and type, disabled, rate_limit and max_concurrency; "
        "its last good definition stays in use"
    }
    assert set(after.skipped) == {"time", "new"}  # and "old", removed from the file, is gone
