"""workers.tools.process: the environment a native tool's command may see (table), and a
command stopped with its call."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from workers.contracts import ToolCall, ToolType
from workers.execute import execute
from workers.tools.native import Sandbox, native_tools
from workers.tools.process import DEFAULT_PATH, minimal_env, run_bounded


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


def test_a_stopped_shell_command_is_killed_not_left_running(tmp_path: Path) -> None:
    """Found by a reviewer: a ``shell_execute`` whose task was cancelled was reported stopped
    and its slot freed, while the command ran on to its own timeout beside the next call."""
    mark = tmp_path / "ran-to-the-end"
    call = ToolCall(run_id="r1", tree_id="t1", task_id="k1", tool="shell_execute", tool_type=ToolType.NATIVE,
                    args={"command": f"sleep 3; echo done > {mark}", "timeout_s": 60}, timeout_s=60,
                    max_result_bytes=10_000)  # fmt: skip
    result = execute(
        call, mcp=None, worker="client-agent@laptop", native=native_tools(Sandbox([tmp_path]), True),
        stopped=lambda: True,
    )  # fmt: skip
    assert result.error is not None and result.error.type == "Cancelled"
    # The command's process group was killed: nothing of it is left to write the mark.
    time.sleep(4)  # past the sleep it was in
    assert not mark.exists()


def test_a_command_not_stopped_runs_to_its_end_with_its_output(tmp_path: Path) -> None:
    cancel = threading.Event()
    done = run_bounded("shell_execute", "sleep 0.5; echo out", tmp_path, {}, 60, shell=True, cancel=cancel)
    assert (done.returncode, done.stdout) == (0, b"out\n")
