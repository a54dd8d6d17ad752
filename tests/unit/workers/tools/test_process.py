"""workers.tools.process: the environment a native tool's command may see (table)."""

from __future__ import annotations

import pytest

from workers.tools.process import DEFAULT_PATH, minimal_env


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"PATH": "/bin", "HOME": "/home/u"}, {"PATH": "/bin", "HOME": "/home/u"}),
        ({"PATH": "/bin", "VANCETOPE_AGENT_BROKER_URL": "redis://c:pw@h/0"}, {"PATH": "/bin"}),
        ({"PATH": "/bin", "LANG": "C.UTF-8", "LC_CTYPE": "C.UTF-8"},
         {"PATH": "/bin", "LANG": "C.UTF-8", "LC_CTYPE": "C.UTF-8"}),
        ({"PATH": "/bin", "LD_PRELOAD": "/tmp/x.so", "GIT_DIR": "/elsewhere", "AWS_SECRET_ACCESS_KEY": "k"},
         {"PATH": "/bin"}),
        ({"TMPDIR": "/var/tmp"}, {"TMPDIR": "/var/tmp", "PATH": DEFAULT_PATH}),
    ],
    ids=[
        "path and home are kept",
        "the agent's own variables are dropped",
        "locale variables are kept",
        "loader, git and cloud variables are dropped",
        "a missing PATH gets the default",
    ],
)  # fmt: skip
def test_minimal_env_keeps_only_the_basics(environ: dict[str, str], expected: dict[str, str]) -> None:
    assert minimal_env(environ) == expected
