"""Every component over a real TLS connection that checks the certificate (issue 7, item 7).

The brain, the server pool, the CLI and an enrolled client agent all reach Redis only
through ``rediss://…?ssl_cert_reqs=required&ssl_ca_certs=…`` (a TLS relay in front of the
test redis-server, tests/fixtures/tls.py); a tree with a server task and a client task
runs to the end. A certificate from another authority is refused.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from brain.stack.redis_server import RedisServer
from tests.conftest import EXAMPLES, ROOT, wait_until
from tests.fixtures.tls import TLSRelay, make_ca_and_server_cert
from tests.integration.test_client_path import make_agent
from workers.urls import without_credentials

pytestmark = pytest.mark.integration


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[RedisServer, TLSRelay, Path]]:
    server = RedisServer(tmp_path / "redis", appendonly=False).start()
    ca, cert, key = make_ca_and_server_cert(tmp_path / "certs")
    relay = TLSRelay(cert, key, server.port).start()
    yield server, relay, ca
    relay.stop()
    server.stop()


def over_tls(url: str, relay: TLSRelay, ca: Path) -> str:
    """``url`` (plain, to the Redis behind the relay) as a certificate-checking rediss:// URL."""
    plain = url.replace("redis://", "rediss://", 1).rsplit(":", 1)[0]
    return f"{plain}:{relay.port}/0?ssl_cert_reqs=required&ssl_ca_certs={ca}"


def test_brain_pool_cli_and_agent_run_a_tree_over_tls_with_certificate_checks(
    tmp_path: Path, tls_redis: tuple[RedisServer, TLSRelay, Path]
) -> None:
    server, relay, ca = tls_redis
    admin_url = over_tls(server.url, relay, ca)
    base = {
        **os.environ,
        "VANCETOPE_DATA_DIR": str(tmp_path / "data"),
        "VANCETOPE_REGISTRY": str(EXAMPLES / "registry.yaml"),
        "VANCETOPE_AGENT_BROKER_URL": without_credentials(admin_url),  # what `clients enroll` prints
        "COLUMNS": "250",
    }
    base.pop("VANCETOPE_MCP_CONFIG", None)
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(logs / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        env = {**base, "VANCETOPE_REDIS_URL": admin_url}
        return subprocess.run(  # noqa: PLW1510 - callers assert on returncode
            [sys.executable, "-m", "brain", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    try:
        brain_url = over_tls(server.url_for("vt-brain"), relay, ca)
        pool_url = over_tls(server.url_for("vt-pool"), relay, ca)
        start("brain", [sys.executable, "-m", "brain", "brain"], {**base, "VANCETOPE_REDIS_URL": brain_url})
        start("pool", [sys.executable, "-m", "brain", "worker"], {**base, "VANCETOPE_REDIS_URL": pool_url})
        wait_until(lambda: cli("clients").returncode == 0, timeout=120, what="the brain to answer over TLS")

        enrolled = cli("clients", "enroll", "laptop", "--user", "ada")
        assert enrolled.returncode == 0, enrolled.stderr
        agent_url = enrolled.stdout.strip().split("=", 1)[1]
        assert agent_url.startswith("rediss://vtc-laptop:") and "ssl_cert_reqs=required" in agent_url
        agent_env = {k: v for k, v in os.environ.items() if not k.startswith("VANCETOPE_")}
        start(
            "agent",
            [sys.executable, "-m", "client_agent", "run", "--config", str(make_agent(tmp_path))],
            {**agent_env, "VANCETOPE_AGENT_BROKER_URL": agent_url},
        )
        wait_until(
            lambda: "connected" in cli("clients").stdout, timeout=120, what="the agent to connect over TLS"
        )

        tree = tmp_path / "t.yaml"
        tree.write_text(
            "id: tls\ntasks:\n"
            "  - {id: up, tool: text_transform, args: {op: upper, text: sealed}}\n"
            "  - {id: notes, tool: read_local_file, args: {path: notes.txt}}\n"
        )
        run = cli("run", str(tree), "--client", "laptop", "--timeout", "90")
        assert run.returncode == 0, run.stdout + run.stderr + (logs / "agent.log").read_text()[-3000:]
        assert re.search(r"notes .*done .*client:laptop", run.stdout)
        assert relay.handshakes >= 4  # brain, pool, agent, CLI: each a verified TLS session
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_a_server_certificate_from_another_authority_is_refused(
    tmp_path: Path, tls_redis: tuple[RedisServer, TLSRelay, Path]
) -> None:
    server, relay, _ = tls_redis
    other_ca, _, _ = make_ca_and_server_cert(tmp_path / "other", ca_name="someone else's CA")
    url = over_tls(server.url, relay, other_ca)
    proc = subprocess.run(  # noqa: PLW1510
        [sys.executable, "-m", "brain", "clients"],
        cwd=ROOT,
        env={**os.environ, "VANCETOPE_REDIS_URL": url, "VANCETOPE_DATA_DIR": str(tmp_path / "d")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 3, proc.stderr
    assert "CERTIFICATE_VERIFY_FAILED" in said and "certificate not trusted" in said
    assert "Traceback" not in said and server.admin_secret not in said
