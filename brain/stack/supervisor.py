"""Keep the embedded stack running (layer: brain/stack; a pure decision beside its process glue).

``vancetope up`` hands its stack to a ``Supervisor``: a service that exits (brain, server
pool, client agent, Flower) or redis-server itself is started again after a backoff that
doubles from ``first_delay_s`` to ``max_delay_s`` and starts over once the service has
stayed up ``stable_after_s``. A service that exits within ``quick_exit_s`` of its start
``give_up_after`` times in a row is failing at start (a config error, say), and so is one that
exits with a code of ``config_error_codes`` (78, sysexits' EX_CONFIG, is how the brain, beat and
pools say their configuration is wrong) however long its start took — on a loaded machine
loading a bad config can take longer than ``quick_exit_s``: restarting it only loops, so the supervisor gives up — on Flower by reporting it and carrying on, on
anything else by stopping the stack. ``decide_restart`` is the decision, a function of
values (time passed in); ``Supervisor`` does the I/O.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from brain.errors import BrainError
from brain.stack.embedded import EmbeddedStack, tail

REDIS = "redis-server"
# Services whose giving up is reported but does not stop the stack.
OPTIONAL_SERVICES = frozenset({"flower", "gateway", "web"})
POLL_S = 0.5
LOG_LINES_SHOWN = 8


@dataclass(frozen=True)
class RestartPolicy:
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    # Up this long: its next exit is a new failure, and the backoff starts over.
    stable_after_s: float = 60.0
    # An exit this soon after a start counts as failing at start.
    quick_exit_s: float = 15.0
    give_up_after: int = 3
    # Exit codes that say "my configuration is wrong": a failing start whatever the uptime.
    config_error_codes: frozenset[int] = frozenset({78})


@dataclass(frozen=True)
class Track:
    """One service's restart history: when it was last started and how it has fared since."""

    started_at: float
    restarts: int = 0  # restarts since it last stayed up stable_after_s
    quick_exits: int = 0  # failing starts in a row: exits within quick_exit_s, or config errors


class Verdict(StrEnum):
    RESTART = "restart"
    GIVE_UP = "give_up"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    delay_s: float
    track: Track  # the history after this exit


def decide_restart(
    policy: RestartPolicy, track: Track, exited_at: float, code: int | None = None
) -> Decision:
    """What to do about a service that exited at ``exited_at`` (same clock as ``track``) with
    exit code ``code``."""
    uptime = exited_at - track.started_at
    restarts = 0 if uptime >= policy.stable_after_s else track.restarts
    failed_start = uptime < policy.quick_exit_s or code in policy.config_error_codes
    quick_exits = track.quick_exits + 1 if failed_start else 0
    after = replace(track, restarts=restarts + 1, quick_exits=quick_exits)
    if quick_exits >= policy.give_up_after:
        return Decision(Verdict.GIVE_UP, 0.0, after)
    delay = min(policy.first_delay_s * 2**restarts, policy.max_delay_s)
    return Decision(Verdict.RESTART, delay, after)


class GaveUp(BrainError):
    """A required service kept failing at start; the stack stops."""


@dataclass
class Supervisor:
    """Watches the stack's processes and restarts what exits, per ``decide_restart``.
    ``say`` prints a line for the operator; ``clock`` is monotonic seconds."""

    stack: EmbeddedStack
    say: Callable[[str], None]
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    clock: Callable[[], float] = time.monotonic
    tracks: dict[str, Track] = field(default_factory=dict)
    due: dict[str, float] = field(default_factory=dict)  # name -> when to start it again

    def run(self, stop: threading.Event) -> None:
        """Until ``stop`` is set; raises GaveUp when a required service keeps failing at start."""
        now = self.clock()
        for name in [REDIS, *(s.name for s in self.stack.services)]:
            self.tracks.setdefault(name, Track(started_at=now))
        while not stop.wait(POLL_S):
            self.check_once()

    def check_once(self) -> None:
        for name, code in self._exited():
            self._on_exit(name, code)
        now = self.clock()
        for name, when in sorted(self.due.items(), key=lambda item: item[1]):
            if when <= now:
                self._start(name)

    def _exited(self) -> list[tuple[str, int]]:
        found: list[tuple[str, int]] = []
        redis_proc = self.stack.redis.process if self.stack.redis else None
        if REDIS not in self.due and redis_proc is not None and redis_proc.poll() is not None:
            found.append((REDIS, redis_proc.returncode))
        for s in self.stack.services:
            if s.name not in self.due and s.process is not None and s.process.poll() is not None:
                found.append((s.name, s.process.returncode))
        return found

    def _on_exit(self, name: str, code: int) -> None:
        now = self.clock()
        decision = decide_restart(self.policy, self.tracks.get(name, Track(started_at=now)), now, code)
        self.tracks[name] = decision.track
        ending = self._log_tail(name)
        if decision.verdict is Verdict.GIVE_UP:
            why = (
                f"{name} exited with code {code}: failing at start {decision.track.quick_exits} times "
                f"in a row (exits within {self.policy.quick_exit_s:g}s of starting, or code 78: "
                f"its configuration is wrong); not restarting it.{ending}"
            )
            if name not in OPTIONAL_SERVICES:
                raise GaveUp(f"{why}\nStopping the stack.")
            self.say(f"{why} The rest of the stack keeps running.")
            self._forget(name)
            return
        self.say(f"{name} exited with code {code}; restarting it in {decision.delay_s:g}s.{ending}")
        self.due[name] = now + decision.delay_s

    def _start(self, name: str) -> None:
        del self.due[name]
        try:
            if name == REDIS:
                self.stack.restart_redis()
                pid = self.stack.redis.process.pid if self.stack.redis and self.stack.redis.process else None
            else:
                proc = self.stack.start_service(name).process
                pid = proc.pid if proc else None
        except (BrainError, OSError, subprocess.SubprocessError) as exc:
            # Could not even start: counts as an exit at once, so the backoff and give-up apply.
            self.say(f"{name} could not be started: {exc}")
            self.tracks[name] = replace(self.tracks[name], started_at=self.clock())
            self._on_exit(name, -1)
            return
        self.tracks[name] = replace(self.tracks[name], started_at=self.clock())
        with contextlib.suppress(OSError):
            self.stack.write_stack_file()
        self.say(f"{name} restarted (pid {pid})")

    def _forget(self, name: str) -> None:
        self.stack.services = [s for s in self.stack.services if s.name != name]
        self.tracks.pop(name, None)

    def _log_tail(self, name: str) -> str:
        if name == REDIS:
            path = self.stack.redis.data_dir / "redis.log" if self.stack.redis else None
        else:
            path = next((s.log_path for s in self.stack.services if s.name == name), None)
        text = tail(path, LOG_LINES_SHOWN)
        return f" {path} ends with:\n{text}" if text else ""
