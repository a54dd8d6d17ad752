"""The embedded Redis's port is chosen once and kept (issue 22); a port in TIME_WAIT is free."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from brain.stack.redis_server import CHOSEN_PORTS, RedisServerError, kept_port, port_free


def test_a_port_is_chosen_once_and_kept_in_the_data_dir(tmp_path: Path) -> None:
    port, path = kept_port(tmp_path / "redis")
    assert port in CHOSEN_PORTS and path == tmp_path / "redis" / "port"
    assert path.stat().st_mode & 0o777 == 0o600
    assert kept_port(tmp_path / "redis") == (port, path)


def test_the_redis_port_setting_wins_and_is_kept_for_when_it_goes_away(tmp_path: Path) -> None:
    kept_port(tmp_path / "redis")
    assert kept_port(tmp_path / "redis", 6390)[0] == 6390
    assert kept_port(tmp_path / "redis")[0] == 6390


def test_a_kept_port_that_is_not_a_number_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "redis").mkdir()
    (tmp_path / "redis" / "port").write_text("soon\n")
    with pytest.raises(RedisServerError, match="delete it to choose a new one"):
        kept_port(tmp_path / "redis")


def test_a_port_in_time_wait_is_free_and_a_listening_one_is_not() -> None:
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert not port_free(port)
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server side closes first: TIME_WAIT on 127.0.0.1:port
        client.close()
    assert port_free(port)
