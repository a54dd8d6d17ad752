"""What the stack gives its web view process: the brain's Redis user (its actions are the
CLI's), never the vault key, and the Flower this stack runs for its task links."""

from __future__ import annotations

from pathlib import Path

import pytest

from brain.errors import ConfigError
from brain.stack.embedded import EmbeddedStack
from brain.stack.flowerauth import flower_access
from brain.stack.redis_server import RedisServer
from brain.stack.webauth import web_access
from tests.conftest import make_settings


def web_env(tmp_path: Path, flower_address: str | None, **settings: str) -> dict[str, str]:
    stack = EmbeddedStack(
        make_settings(tmp_path, **settings), redis=RedisServer(tmp_path / "redis", port=6390)
    )
    stack.web_port, stack.web_access = 8766, web_access("127.0.0.1", tmp_path, {})
    if flower_address is not None:
        stack.flower_port, stack.flower_access = 5599, flower_access(flower_address, tmp_path, {})
    return stack._argv_env("web")[1]


def test_the_web_view_connects_as_the_brain_without_the_vault_key(tmp_path: Path) -> None:
    env = web_env(tmp_path, None, vault_key="x" * 44)
    assert env["VANCETOPE_REDIS_URL"].startswith("redis://vt-brain:")
    assert "VANCETOPE_VAULT_KEY" not in env
    assert "VANCETOPE_WEB_FLOWER_URL" not in env  # no Flower here: the default (5555) stands


def test_the_web_view_links_to_the_flower_this_stack_runs_unless_told_another(tmp_path: Path) -> None:
    assert web_env(tmp_path, "127.0.0.1")["VANCETOPE_WEB_FLOWER_URL"] == "http://127.0.0.1:5599"
    assert web_env(tmp_path, "0.0.0.0")["VANCETOPE_WEB_FLOWER_URL"] == "http://127.0.0.1:5599"
    told = web_env(tmp_path, "127.0.0.1", web_flower_url="https://flower.example")
    assert told["VANCETOPE_WEB_FLOWER_URL"] == "https://flower.example"


def test_a_flower_url_that_is_not_http_is_refused_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="web_flower_url"):
        make_settings(tmp_path, web_flower_url="javascript:alert(1)")
