"""brain.config: settings that travel from env/TOML to worker processes, and the ones refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from brain.config import find_config, load_settings
from brain.errors import ConfigError


def test_http_allow_reads_a_comma_separated_env_and_passes_it_down_the_same_way(tmp_path: Path) -> None:
    settings = load_settings(env={"VANCETOPE_HTTP_ALLOW": "intranet.example, 10.0.0.0/8"}, cwd=tmp_path)
    assert settings.http_allow == ("intranet.example", "10.0.0.0/8")
    assert settings.to_env()["VANCETOPE_HTTP_ALLOW"] == "intranet.example,10.0.0.0/8"


def test_the_web_views_result_logins_are_the_stacks_own_login_unless_listed(tmp_path: Path) -> None:
    assert load_settings(env={}, cwd=tmp_path).web_result_users == ("vancetope",)
    listed = load_settings(env={"VANCETOPE_WEB_RESULT_USERS": "ops, ada"}, cwd=tmp_path)
    assert listed.web_result_users == ("ops", "ada")
    assert listed.to_env()["VANCETOPE_WEB_RESULT_USERS"] == "ops,ada"
    nobody = load_settings(env={"VANCETOPE_WEB_RESULT_USERS": "none"}, cwd=tmp_path)
    assert load_settings(env=nobody.to_env(), cwd=tmp_path).web_result_users == ("none",)
    for bad in ("none,ops", " , "):
        with pytest.raises(ConfigError, match="web_result_users"):
            load_settings(env={"VANCETOPE_WEB_RESULT_USERS": bad}, cwd=tmp_path)
    (tmp_path / "vancetope.toml").write_text('[vancetope]\nweb_result_users = ["*"]\n')
    assert load_settings(env={}, cwd=tmp_path).web_result_users == ("*",)


def test_the_web_views_argument_logins_are_none_unless_listed_in_the_result_logins_form(
    tmp_path: Path,
) -> None:
    assert load_settings(env={}, cwd=tmp_path).web_argument_users == ("none",)
    listed = load_settings(env={"VANCETOPE_WEB_ARGUMENT_USERS": "ops, ada"}, cwd=tmp_path)
    assert listed.web_argument_users == ("ops", "ada")
    assert load_settings(env=listed.to_env(), cwd=tmp_path).web_argument_users == ("ops", "ada")
    for bad in ("none,ops", " , "):
        with pytest.raises(ConfigError, match="web_argument_users 'none,ops'|web_argument_users ''"):
            load_settings(env={"VANCETOPE_WEB_ARGUMENT_USERS": bad}, cwd=tmp_path)
    (tmp_path / "vancetope.toml").write_text('[vancetope]\nweb_argument_users = ["*"]\n')
    assert load_settings(env={}, cwd=tmp_path).web_argument_users == ("*",)


def test_http_allow_reads_a_toml_list(tmp_path: Path) -> None:
    (tmp_path / "vancetope.toml").write_text('[vancetope]\nhttp_allow = ["127.0.0.1"]\n')
    assert load_settings(env={}, cwd=tmp_path).http_allow == ("127.0.0.1",)


def test_a_bad_http_allow_entry_is_a_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="http_allow entry 'not a host' is neither"):
        load_settings(env={"VANCETOPE_HTTP_ALLOW": "not a host"}, cwd=tmp_path)


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("rediss://vt-brain:pw@broker:6380/0", "must end with ?ssl_cert_reqs=required"),
        ("rediss://vt-brain:pw@broker:6380/0?ssl_cert_reqs=none", "must end with ?ssl_cert_reqs=required"),
        ("http://vt-brain:pw@broker/0", "must be a redis://, rediss:// or sentinel:// URL"),
        # Loaded, the stack would start, and every agent enrolled on it would be refused its SELECT.
        ("redis://vt-brain:pw@broker:6379/3", "names database 3; Vancetope keeps its keys in database 0"),
    ],
)
def test_an_unusable_redis_url_is_refused_without_showing_the_password(
    tmp_path: Path, url: str, fragment: str
) -> None:
    with pytest.raises(ConfigError, match=r"redis_url") as caught:
        load_settings(env={"VANCETOPE_REDIS_URL": url}, cwd=tmp_path)
    assert fragment in str(caught.value) and ":pw@" not in str(caught.value)


def test_a_rediss_url_with_certificate_checks_is_accepted(tmp_path: Path) -> None:
    url = "rediss://vt-brain:pw@broker:6380/0?ssl_cert_reqs=required&ssl_ca_certs=/etc/ca.crt"
    assert load_settings(env={"VANCETOPE_REDIS_URL": url}, cwd=tmp_path).redis_url == url


def test_keyword_overrides_beat_the_environment_which_beats_the_file_which_beats_the_defaults(
    tmp_path: Path,
) -> None:
    (tmp_path / "vancetope.toml").write_text(
        '[vancetope]\nserver_concurrency = 3\ngateway_port = 9000\nregistry = "reg.yaml"\ntask_log = true\n'
    )
    env = {
        "VANCETOPE_GATEWAY_PORT": "9001",
        "VANCETOPE_SERVER_CONCURRENCY": "",
        "VANCETOPE_TASK_LOG": "false",
    }
    settings = load_settings(env=env, cwd=tmp_path, gateway_max_tools=7, user=None)
    assert settings.server_concurrency == 3  # an empty variable is unset
    assert settings.gateway_port == 9001 and settings.task_log is False
    assert settings.registry == (tmp_path / "reg.yaml").resolve()  # relative to the file
    assert settings.gateway_max_tools == 7 and settings.user is None
    assert settings.max_deliveries == 3


def test_lists_and_tables_come_from_the_environment_as_today(tmp_path: Path) -> None:
    env = {
        "VANCETOPE_POOLS": '[{"name": "gpu", "concurrency": 1}]',
        "VANCETOPE_HTTP_HEADERS": '{"api.example.com": {"X-Key": "k"}}',
        "VANCETOPE_DATA_DIR": "state",
        # another program's variables under the same prefix are not settings
        "VANCETOPE_AGENT_BROKER_URL": "redis://h/0",
        "vancetope_unrelated": "x",
    }
    settings = load_settings(env=env, cwd=tmp_path)
    assert [p.name for p in settings.pools] == ["gpu"]
    assert settings.http_headers == {"api.example.com": {"X-Key": "k"}}
    assert settings.data_dir == Path("state")
    # and they travel to child processes in the same form
    again = load_settings(env=settings.to_env(), cwd=tmp_path)
    assert again == settings


def test_bad_json_in_the_environment_is_a_config_error_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"pools: Value error, not a JSON list of pools"):
        load_settings(env={"VANCETOPE_POOLS": "[gpu"}, cwd=tmp_path)


def test_settings_built_directly_read_neither_the_environment_nor_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from brain.config import Settings

    monkeypatch.setenv("VANCETOPE_SERVER_CONCURRENCY", "9")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vancetope.toml").write_text("[vancetope]\ngateway_port = 9000\n")
    assert (Settings().server_concurrency, Settings().gateway_port) == (2, 8765)
    assert load_settings().server_concurrency == 9 and load_settings().gateway_port == 9000


def test_an_unknown_key_in_the_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "vancetope.toml").write_text("[vancetope]\ncolour = 1\n")
    with pytest.raises(ConfigError, match="colour: Extra inputs are not permitted"):
        load_settings(env={}, cwd=tmp_path)


def test_a_vancetope_toml_in_a_parent_folder_is_found_with_its_paths_and_data_dir_beside_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "vancetope.toml").write_text('[vancetope]\nregistry = "tools/registry.yaml"\nuser = "ada"\n')
    below = tmp_path / "trees" / "nightly"
    below.mkdir(parents=True)
    settings = load_settings(env={}, cwd=below)
    assert find_config(below) == tmp_path / "vancetope.toml"
    assert settings.user == "ada"
    assert settings.registry == tmp_path / "tools" / "registry.yaml"  # relative to the file, not to cwd
    assert settings.data_dir == tmp_path / ".vancetope"  # the project's stack, not a new one down here
    assert load_settings(env={}, cwd=tmp_path).data_dir == Path(".vancetope")  # in its folder: as before


def test_the_nearest_vancetope_toml_wins_and_none_means_the_defaults(tmp_path: Path) -> None:
    (tmp_path / "vancetope.toml").write_text('[vancetope]\nuser = "outer"\n')
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "vancetope.toml").write_text('[vancetope]\nuser = "inner"\n')
    assert load_settings(env={}, cwd=inner / ".").user == "inner"
    lonely = Path("/proc/self")  # nothing above it holds a vancetope.toml
    assert find_config(lonely) is None and load_settings(env={}, cwd=lonely).user is None


def test_redis_port_comes_from_the_environment_and_must_be_a_port(tmp_path: Path) -> None:
    assert load_settings(env={"VANCETOPE_REDIS_PORT": "6390"}, cwd=tmp_path).redis_port == 6390
    assert load_settings(env={}, cwd=tmp_path).redis_port is None
    with pytest.raises(ConfigError, match="redis_port"):
        load_settings(env={"VANCETOPE_REDIS_PORT": "70000"}, cwd=tmp_path)
