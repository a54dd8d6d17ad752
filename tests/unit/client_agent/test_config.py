"""client_agent.config: the [agent] table, env overrides, and errors that name the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from client_agent.config import AgentConfig, WorkerPool, load_config
from client_agent.errors import AgentConfigError, NoCredential
from tests.conftest import EXAMPLES
from workers.contracts import ClientType

MINIMAL = '[agent]\nclient_id = "laptop"\nuser = "demo"\nbroker_url = "redis://127.0.0.1:6379/0"\n'


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_minimal_file_gets_the_documented_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL), environ={})
    assert (config.client_id, config.user, config.client_type) == ("laptop", "demo", ClientType.DESKTOP)
    assert (config.concurrency, config.pool, config.shell_enabled) == (2, WorkerPool.THREADS, False)
    assert (config.heartbeat_interval_s, config.heartbeat_ttl_s) == (2.0, 6.0)
    assert config.sandbox_roots == () and config.mcp_json is None and config.allowed_tools is None
    assert config.data_dir == tmp_path.resolve() / ".vancetope-agent"
    assert config.log_file is None


def test_paths_in_the_file_are_relative_to_the_file_not_the_cwd(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "sandbox").mkdir()
    path = write(
        tmp_path,
        MINIMAL + 'sandbox_roots = ["sandbox"]\nmcp_json = "mcp.json"\ndata_dir = "state"\n'
        'log_file = "logs/agent.log"\n',
    )
    monkeypatch.chdir("/")
    config = load_config(path, environ={})
    base = tmp_path.resolve()
    assert config.sandbox_roots == (base / "sandbox",)
    assert (config.mcp_json, config.data_dir) == (base / "mcp.json", base / "state")
    assert config.log_file == base / "logs" / "agent.log"


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    env = {
        "VANCETOPE_AGENT_BROKER_URL": "redis://10.0.0.5:6380/0",
        "VANCETOPE_AGENT_CONCURRENCY": "4",
        "VANCETOPE_AGENT_SHELL_ENABLED": "true",
        "VANCETOPE_AGENT_SANDBOX_ROOTS": f"{tmp_path / 'a'},{tmp_path / 'b'}",
        "VANCETOPE_AGENT_ALLOWED_TOOLS": '["read_*", "git/*"]',
    }
    config = load_config(write(tmp_path, MINIMAL), environ=env)
    assert config.broker_url == "redis://10.0.0.5:6380/0"
    assert (config.concurrency, config.shell_enabled) == (4, True)
    assert config.sandbox_roots == (tmp_path / "a", tmp_path / "b")
    assert config.allowed_tools == ("read_*", "git/*")


def test_a_sentinel_url_and_its_master_name_from_the_file_or_the_environment(tmp_path: Path) -> None:
    url = "sentinel://vtc-laptop:pw@10.0.0.5:26379;sentinel://vtc-laptop:pw@10.0.0.6:26379"
    text = MINIMAL.replace("redis://127.0.0.1:6379/0", url) + 'redis_sentinel_master = "vt"\n'
    config = load_config(write(tmp_path, text), environ={})
    assert (config.own_broker_url(), config.redis_sentinel_master) == (url, "vt")
    env = {"VANCETOPE_AGENT_REDIS_SENTINEL_MASTER": "other"}
    assert load_config(write(tmp_path, text), environ=env).redis_sentinel_master == "other"
    assert load_config(write(tmp_path, MINIMAL), environ={}).redis_sentinel_master is None  # mymaster


def test_config_is_frozen(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL), environ={})
    with pytest.raises(ValueError):
        config.concurrency = 9  # type: ignore[misc]
    assert isinstance(config, AgentConfig)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ('concurrency = "many"\n', "agent.toml: [agent]: concurrency: Input should be a valid integer"),
        ("concurrency = 0\n", "agent.toml: [agent]: concurrency: Input should be greater than or equal to 1"),
        ("colour = 1\n", "agent.toml: [agent]: colour: unknown field (known fields: client_id, user"),
        ('client_type = "phone"\n', "agent.toml: [agent]: client_type: Input should be 'desktop' or 'cli'"),
        (
            "heartbeat_ttl_s = 1.5\n",
            "agent.toml: [agent]: heartbeat_ttl_s: must be greater than heartbeat_interval_s (2), got 1.5",
        ),
        ('log_level = "LOUD"\n', "agent.toml: [agent]: log_level: must be one of DEBUG, INFO"),
    ],
)
def test_bad_values_name_the_file_and_the_field(tmp_path: Path, extra: str, fragment: str) -> None:
    with pytest.raises(AgentConfigError) as info:
        load_config(write(tmp_path, MINIMAL + extra), environ={})
    assert fragment in str(info.value)
    assert str(tmp_path / "agent.toml") in str(info.value)


def test_missing_sandbox_root_names_the_folder(tmp_path: Path) -> None:
    with pytest.raises(AgentConfigError) as info:
        load_config(write(tmp_path, MINIMAL + 'sandbox_roots = ["nope"]\n'), environ={})
    assert f"sandbox_roots: '{tmp_path.resolve() / 'nope'}' is not an existing directory" in str(info.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('[agent]\nuser = "demo"\nbroker_url = "redis://h/0"\n', "[agent]: client_id: is required"),
        (
            '[agent]\nclient_id = "a b"\nuser = "u"\nbroker_url = "redis://h/0"\n',
            "[agent]: client_id: invalid client id 'a b': use letters, digits",
        ),
        (
            '[agent]\nclient_id = "x"\nuser = "u"\nbroker_url = "http://h/0"\n',
            "[agent]: broker_url: must be a redis://, rediss:// or sentinel:// URL with a host, got 'http://h/0'",
        ),
        (
            '[agent]\nclient_id = "x"\nuser = "u"\nbroker_url = "rediss://h:6380/0"\n',
            "[agent]: broker_url: a rediss:// URL must end with ?ssl_cert_reqs=required",
        ),
        (
            '[agent]\nclient_id = "x"\nuser = "u"\nbroker_url = "redis://h:6379/2"\n',
            "[agent]: broker_url: 'redis://h:6379/2' names database 2; Vancetope keeps its keys in database 0",
        ),
        ("[vancetope]\nx = 1\n", "agent.toml: missing the [agent] table"),
        ("[agent\n", "agent.toml: not valid TOML: "),
    ],
)
def test_structural_errors_name_the_file(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(AgentConfigError) as info:
        load_config(write(tmp_path, text), environ={})
    assert fragment in str(info.value)


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(AgentConfigError) as info:
        load_config(tmp_path / "absent.toml", environ={})
    assert (
        str(info.value)
        == f"{tmp_path / 'absent.toml'}: cannot read the agent config: No such file or directory"
    )


def test_bad_environment_value_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(AgentConfigError) as info:
        load_config(write(tmp_path, MINIMAL), environ={"VANCETOPE_AGENT_HEARTBEAT_INTERVAL_S": "soon"})
    assert str(info.value).startswith(
        "VANCETOPE_AGENT_HEARTBEAT_INTERVAL_S (environment): heartbeat_interval_s: Input should be a valid number"
    )


def test_rediss_url_with_certificate_checks_is_accepted(tmp_path: Path) -> None:
    env = {"VANCETOPE_AGENT_BROKER_URL": "rediss://h:6380/0?ssl_cert_reqs=required"}
    assert (load_config(write(tmp_path, MINIMAL), environ=env).broker_url or "").startswith("rediss://")


# --- credential_file: the line `vancetope clients enroll --output` writes -------------------

OWN_URL = "redis://vtc-laptop:s3cret@broker.example:6379/0"


def credential(
    tmp_path: Path, mode: int = 0o600, text: str = f"VANCETOPE_AGENT_BROKER_URL={OWN_URL}\n"
) -> Path:
    path = tmp_path / "laptop.credential"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_the_credential_file_gives_the_broker_url_relative_to_the_config(tmp_path: Path) -> None:
    credential(tmp_path)
    config = load_config(write(tmp_path, MINIMAL + 'credential_file = "laptop.credential"\n'), environ={})
    assert config.broker_url == OWN_URL


def test_the_environment_url_still_wins_over_the_credential_file(tmp_path: Path) -> None:
    credential(tmp_path)
    env_url = "redis://vtc-laptop:other@broker.example:6379/0"
    config = load_config(
        write(tmp_path, MINIMAL + 'credential_file = "laptop.credential"\n'),
        environ={"VANCETOPE_AGENT_BROKER_URL": env_url},
    )
    assert config.broker_url == env_url


@pytest.mark.parametrize(
    ("mode", "text", "fragment"),
    [
        (0o644, f"VANCETOPE_AGENT_BROKER_URL={OWN_URL}\n", "is readable by others (mode 644); run chmod 600"),
        (0o600, "nothing useful\n", "has no VANCETOPE_AGENT_BROKER_URL=<url> line"),
    ],
)
def test_a_credential_file_others_can_read_or_without_the_line_is_refused(
    tmp_path: Path, mode: int, text: str, fragment: str
) -> None:
    credential(tmp_path, mode, text)
    with pytest.raises(AgentConfigError) as caught:
        load_config(write(tmp_path, MINIMAL + 'credential_file = "laptop.credential"\n'), environ={})
    assert "credential_file" in str(caught.value) and fragment in str(caught.value)


# --- a credential of its own: `run` and `install` need it, `tools` does not ---------------------


def test_a_config_without_a_broker_url_loads_for_tools(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[agent]\nclient_id = "laptop"\nuser = "demo"\n'), environ={})
    assert config.broker_url is None
    with pytest.raises(NoCredential) as caught:
        config.own_broker_url()
    assert str(caught.value) == (
        "this client has no credential: enroll it on the brain: vancetope clients enroll laptop "
        "--user demo --output laptop.credential, then set credential_file"
    )


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/0", "redis://vtc-laptop@broker.example:6379/0"], ids=["none", "user-only"]
)
def test_a_broker_url_without_a_password_is_no_credential(tmp_path: Path, url: str) -> None:
    config = load_config(write(tmp_path, MINIMAL), environ={"VANCETOPE_AGENT_BROKER_URL": url})
    with pytest.raises(NoCredential):
        config.own_broker_url()


def test_the_credential_file_or_the_environment_gives_the_own_broker_url(tmp_path: Path) -> None:
    credential(tmp_path)
    from_file = load_config(write(tmp_path, MINIMAL + 'credential_file = "laptop.credential"\n'), environ={})
    assert from_file.own_broker_url() == OWN_URL
    # How `vancetope up` runs the example agent: the stack's own enrolled URL in the environment.
    env_url = "redis://vtc-laptop:fresh@127.0.0.1:6390/0"
    example = load_config(EXAMPLES / "agent" / "agent.toml", environ={"VANCETOPE_AGENT_BROKER_URL": env_url})
    assert example.own_broker_url() == env_url
