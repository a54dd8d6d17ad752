"""brain.config: settings that travel from env/TOML to worker processes, and the ones refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from brain.config import load_settings
from brain.errors import ConfigError


def test_http_allow_reads_a_comma_separated_env_and_passes_it_down_the_same_way(tmp_path: Path) -> None:
    settings = load_settings(env={"VANCETOPE_HTTP_ALLOW": "intranet.example, 10.0.0.0/8"}, cwd=tmp_path)
    assert settings.http_allow == ("intranet.example", "10.0.0.0/8")
    assert settings.to_env()["VANCETOPE_HTTP_ALLOW"] == "intranet.example,10.0.0.0/8"


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
        ("http://vt-brain:pw@broker/0", "must be a redis:// or rediss:// URL"),
    ],
)
def test_a_redis_url_that_would_not_check_the_certificate_is_refused_without_showing_the_password(
    tmp_path: Path, url: str, fragment: str
) -> None:
    with pytest.raises(ConfigError, match=r"redis_url") as caught:
        load_settings(env={"VANCETOPE_REDIS_URL": url}, cwd=tmp_path)
    assert fragment in str(caught.value) and ":pw@" not in str(caught.value)


def test_a_rediss_url_with_certificate_checks_is_accepted(tmp_path: Path) -> None:
    url = "rediss://vt-brain:pw@broker:6380/0?ssl_cert_reqs=required&ssl_ca_certs=/etc/ca.crt"
    assert load_settings(env={"VANCETOPE_REDIS_URL": url}, cwd=tmp_path).redis_url == url
