"""Flower on loopback is no open door: every page asks for the password, ``/metrics`` too, and a
request naming another host (a DNS rebinding) is not answered (issue 20, the L row)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from brain.stack.embedded import flower_argv
from brain.stack.flowerauth import FLOWER_SECRET_FILE, FLOWER_USER, flower_access
from brain.stack.redis_server import RedisServer, free_port
from tests.conftest import wait_until
from tests.integration.test_flower import fetch

pytestmark = pytest.mark.integration


def test_flower_on_loopback_asks_for_the_password_everywhere_and_answers_only_its_own_host(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    access = flower_access("127.0.0.1", tmp_path, env={})  # what `up --flower` decides
    password = (tmp_path / FLOWER_SECRET_FILE).read_text().strip()
    auth = (FLOWER_USER, password)
    port = free_port()
    env = {**os.environ, "VANCETOPE_REDIS_URL": redis_server.url_for("vt-flower"), **access.env()}
    env.pop("FLOWER_UNAUTHENTICATED_API", None)
    with open(tmp_path / "flower.log", "w") as log:
        flower = subprocess.Popen(flower_argv(port), env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: fetch(f"{url}/healthcheck")[0] == 200, timeout=120, what="Flower to answer")
        datatable = "/tasks/datatable?draw=1&start=0&length=5&order[0][column]=0&columns[0][data]=received"
        for path in ("/", "/tasks", datatable, "/metrics", "/api/workers", "/workers?json=1"):
            assert fetch(url + path)[0] == 401, f"{path} without the password"
            assert fetch(url + path, (FLOWER_USER, "wrong"))[0] == 401, f"{path} with a wrong password"
            assert fetch(url + path, auth)[0] == 200, f"{path} with the password"
            assert fetch(url + path, auth, host=f"localhost:{port}")[0] == 200, f"{path} as localhost"
            assert fetch(url + path, auth, host=f"rebound.example:{port}")[0] == 421, (
                f"{path} from a rebound name"
            )
        assert b"flower_events_total" in fetch(f"{url}/metrics", auth)[1]
    finally:
        flower.terminate()
        flower.wait(timeout=120)
