"""Child processes that do not outlive the stack (layer: brain/stack; process glue).

The embedded stack's services run in sessions of their own (so a Ctrl-C reaches the
parent, which stops them in order). If the parent itself is killed (SIGKILL, OOM), they
would keep running as orphans, retrying a Redis that is gone, forever. On Linux each
service is started through this module: it asks the kernel for SIGTERM when its parent
dies (``PR_SET_PDEATHSIG``, kept across exec), checks the parent is still the one that
started it, then execs the real command. A Celery worker whose warm shutdown then
does not finish is killed by ``workers.orphans``. (Not a ``preexec_fn``: that runs between fork
and exec, unsafe in a process with threads.) Elsewhere commands run as they are.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from workers.orphans import STACK_PID_VARIABLE

_PR_SET_PDEATHSIG = 1


def dies_with_this_process(argv: list[str]) -> list[str]:
    """``argv`` wrapped so that the child gets SIGTERM when this process dies (Linux)."""
    if sys.platform != "linux":
        return argv
    return [sys.executable, "-m", "brain.stack.children", str(os.getpid()), *argv]


def main(args: list[str]) -> None:
    parent, argv = int(args[0]), args[1:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        sys.exit(0)  # the parent died before the request took effect: nothing to serve
    # How a Celery worker knows later that its stack is gone (workers.orphans).
    os.environ[STACK_PID_VARIABLE] = str(parent)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
