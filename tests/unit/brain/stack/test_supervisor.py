"""The supervisor's restart decision, table-tested: time is a value, no process runs."""

from __future__ import annotations

import pytest

from brain.stack.supervisor import RestartPolicy, Track, Verdict, decide_restart

POLICY = RestartPolicy(
    first_delay_s=1.0, max_delay_s=30.0, stable_after_s=60.0, quick_exit_s=15.0, give_up_after=3
)


@pytest.mark.parametrize(
    ("track", "exited_at", "verdict", "delay_s", "restarts", "quick_exits"),
    [
        # first crash after a long run: restart after the first delay
        (Track(started_at=0, restarts=0), 100.0, Verdict.RESTART, 1.0, 1, 0),
        # crashes in a row that are not quick: the delay doubles
        (Track(started_at=0, restarts=1), 20.0, Verdict.RESTART, 2.0, 2, 0),
        (Track(started_at=0, restarts=2), 20.0, Verdict.RESTART, 4.0, 3, 0),
        # ... up to the cap
        (Track(started_at=0, restarts=5), 20.0, Verdict.RESTART, 30.0, 6, 0),
        (Track(started_at=0, restarts=40), 20.0, Verdict.RESTART, 30.0, 41, 0),
        # up for stable_after_s since its last start: the backoff starts over
        (Track(started_at=0, restarts=6), 60.0, Verdict.RESTART, 1.0, 1, 0),
        # a quick exit is counted, a slow one resets the count
        (Track(started_at=0, restarts=1, quick_exits=1), 3.0, Verdict.RESTART, 2.0, 2, 2),
        (Track(started_at=0, restarts=2, quick_exits=2), 15.0, Verdict.RESTART, 4.0, 3, 0),
        # give_up_after quick exits in a row: failing at start, stop restarting it
        (Track(started_at=0, restarts=2, quick_exits=2), 14.9, Verdict.GIVE_UP, 0.0, 3, 3),
    ],
)
def test_restart_delay_doubles_to_a_cap_resets_when_stable_and_gives_up_on_repeated_quick_exits(
    track: Track, exited_at: float, verdict: Verdict, delay_s: float, restarts: int, quick_exits: int
) -> None:
    decision = decide_restart(POLICY, track, exited_at)
    assert (decision.verdict, decision.delay_s) == (verdict, delay_s)
    assert (decision.track.restarts, decision.track.quick_exits) == (restarts, quick_exits)
    assert decision.track.started_at == track.started_at  # the glue sets it when it starts again


def test_a_service_that_always_exits_at_start_is_given_up_after_the_policys_count() -> None:
    track, now, verdicts = Track(started_at=0.0), 0.0, []
    for _ in range(5):
        now += 2.0  # exits two seconds after each start
        decision = decide_restart(POLICY, track, now)
        verdicts.append(decision.verdict)
        if decision.verdict is Verdict.GIVE_UP:
            break
        now += decision.delay_s
        track = Track(
            started_at=now, restarts=decision.track.restarts, quick_exits=decision.track.quick_exits
        )
    assert verdicts == [Verdict.RESTART, Verdict.RESTART, Verdict.GIVE_UP]


@pytest.mark.parametrize(
    ("code", "verdict"), [(78, Verdict.GIVE_UP), (1, Verdict.RESTART), (-9, Verdict.RESTART)]
)
def test_a_config_error_exit_is_a_failing_start_however_long_the_start_took(
    code: int, verdict: Verdict
) -> None:
    # Seen in CI: a brain loading a bad mcpServers file on a loaded box took longer than
    # quick_exit_s to exit 78, so the count reset and `up` restarted it for minutes.
    track = Track(started_at=0.0, restarts=2, quick_exits=2)
    decision = decide_restart(POLICY, track, 40.0, code)
    assert decision.verdict is verdict
    assert decision.track.quick_exits == (3 if code == 78 else 0)
