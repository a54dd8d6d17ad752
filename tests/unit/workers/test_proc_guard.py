"""workers.proc_guard: which variables are credentials, and that a child of a protected process
reads none of them in /proc/<parent>/environ (a child process of its own, not this test's)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from workers.proc_guard import secret_variables
from workers.tools.process import mcp_server_env

PASSWORD = "pw-1f2e3d4c5b6a"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"VANCETOPE_REDIS_URL": "redis://127.0.0.1/0"}, ["VANCETOPE_REDIS_URL"]),
        ({"VANCETOPE_VAULT_KEY": "k", "VANCETOPE_DATA_DIR": "/d"}, ["VANCETOPE_VAULT_KEY"]),
        (
            {"VANCETOPE_MONGO_URL": "mongodb://m/", "VANCETOPE_STORE_URL": "x"},
            ["VANCETOPE_MONGO_URL", "VANCETOPE_STORE_URL"],
        ),
        ({"VANCETOPE_HTTP_HEADERS": "{}"}, ["VANCETOPE_HTTP_HEADERS"]),
        ({"VANCETOPE_SOMETHING_URL": f"rediss://u:{PASSWORD}@h:1/0"}, ["VANCETOPE_SOMETHING_URL"]),
        ({"VANCETOPE_AGENT_BROKER_URL": "rediss://broker.example:6380/0"}, []),  # no credential in it
        ({"VANCETOPE_MCP_CONFIG": "/etc/mcp.json", "HOME": "/root"}, []),
        ({"OTHER_URL": f"redis://u:{PASSWORD}@h/0"}, []),  # not ours: the operator's business
    ],
)
def test_the_credential_variables(environ: dict[str, str], expected: list[str]) -> None:
    assert secret_variables(environ) == expected


def test_an_mcp_server_gets_the_basics_and_its_own_env_never_the_stacks() -> None:
    environ = {
        "PATH": "/bin",
        "HOME": "/home/u",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "TMPDIR": "/tmp/x",
        "VANCETOPE_REDIS_URL": f"redis://u:{PASSWORD}@h/0",
        "AWS_SECRET_ACCESS_KEY": "a",
        "FLOWER_BASIC_AUTH": "op:pw",
    }
    env = mcp_server_env({"TOKEN": "t", "VANCETOPE_X": "sneaked"}, environ)
    assert env == {
        "PATH": "/bin",
        "HOME": "/home/u",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "TMPDIR": "/tmp/x",
        "TOKEN": "t",
    }


CHILD = textwrap.dedent(
    """
    import os, subprocess, sys
    from workers.proc_guard import protect_process
    if sys.argv[1] == "protect":
        protect_process("test")
    # A child that has nothing of ours in its own environment reads its parent's.
    out = subprocess.run(
        ["cat", f"/proc/{os.getpid()}/environ"], env={"PATH": os.environ["PATH"]}, capture_output=True
    )
    sys.stdout.write(repr((out.returncode, out.stdout, out.stderr, "VANCETOPE_REDIS_URL" in os.environ)))
    """
)


@pytest.mark.parametrize("mode", ["protect", "control"])
def test_a_child_cannot_read_the_credentials_in_its_parents_environ(mode: str) -> None:
    env = {
        **os.environ,
        "VANCETOPE_REDIS_URL": f"redis://vt-pool:{PASSWORD}@127.0.0.1:1/0",
        "VANCETOPE_DATA_DIR": "/kept",
    }
    ran = subprocess.run(
        [sys.executable, "-c", CHILD, mode], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert ran.returncode == 0, ran.stderr
    code, out, err, still_in_os_environ = eval(ran.stdout)
    if mode == "control":  # without protection the child reads it: the test can fail
        assert PASSWORD.encode() in out and still_in_os_environ
        return
    assert PASSWORD.encode() not in out and not still_in_os_environ
    if os.geteuid() == 0:
        assert code == 0 and b"VANCETOPE_DATA_DIR=/kept" in out  # root reads it, blanked
    else:
        assert code != 0 and b"Permission denied" in err  # not dumpable: closed to the same user
