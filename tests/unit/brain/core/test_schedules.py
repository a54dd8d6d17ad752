"""brain.core.schedules: reading [[schedules]] tables, and the overlap and catch-up decisions (tables)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from brain.config import load_settings
from brain.core.schedules import (
    MAX_CATCH_UP_RUNS,
    CatchUp,
    FireAction,
    Overlap,
    Schedule,
    decide_catch_up,
    decide_overlap,
    fires_to_catch_up,
    missed_every,
    missed_fires,
    parse_schedules,
    run_tree_id,
)
from brain.errors import ConfigError

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def write_toml(tmp_path: Path, body: str) -> Path:
    (tmp_path / "night.yaml").write_text("id: night\ntasks:\n  - {id: a, tool: echo, args: {value: hi}}\n")
    (tmp_path / "vancetope.toml").write_text(body)
    return tmp_path


def test_schedules_load_from_toml_with_paths_relative_to_the_file(tmp_path: Path) -> None:
    write_toml(
        tmp_path,
        '[vancetope]\nuser = "demo"\n\n[[schedules]]\nname = "nightly"\ntree = "night.yaml"\n'
        'cron = "0 2 * * *"\ntimezone = "Europe/Paris"\nsummary_file = "reports/{schedule}-{date}.md"\n',
    )
    settings = load_settings(env={}, cwd=tmp_path)
    (spec,) = settings.schedules
    assert spec.name == "nightly" and spec.tree == tmp_path / "night.yaml"
    assert spec.user is None and spec.overlap is Overlap.SKIP and spec.catch_up is CatchUp.NONE
    assert spec.summary_file == str(tmp_path / "reports/{schedule}-{date}.md")


def test_schedules_travel_to_child_processes_through_the_environment(tmp_path: Path) -> None:
    write_toml(
        tmp_path, '[[schedules]]\nname = "fast"\ntree = "night.yaml"\nevery_s = 5\noverlap = "queue"\n'
    )
    settings = load_settings(env={}, cwd=tmp_path)
    env = settings.to_env()
    again = load_settings(env=env, cwd=tmp_path / "elsewhere")
    assert again.schedules == settings.schedules


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('cron = "0 2 * *"', "schedule 'bad': cron: '0 2 * *' has 4 field(s); write 5"),
        ('cron = "61 * * * *"', "schedule 'bad': cron: '61 * * * *' is not valid"),
        ('cron = "0 2 * * *"\ntimezone = "Mars/Olympus"', "schedule 'bad': timezone: unknown time zone"),
        ('every_s = 5\ncron = "* * * * *"', "schedule 'bad': set exactly one of cron"),
        ("enabled = true", "schedule 'bad': set exactly one of cron"),
        (
            'every_s = 5\noverlap = "wait"',
            "schedule 'bad': overlap: Input should be 'skip', 'queue' or 'allow'",
        ),
        (
            'every_s = 5\ncatch_up = "some"',
            "schedule 'bad': catch_up: Input should be 'none', 'latest' or 'all'",
        ),
        ("every_s = 0", "schedule 'bad': every_s: Input should be greater than 0"),
        ('every_s = 5\nsummary_file = "out.txt"', "the extension picks the format"),
        ('every_s = 5\nsummary_file = "{when}.md"', "is not a valid template"),
        ('every_s = 5\nsummary_webhook = "ftp://x"', "is not an http:// or https:// URL"),
        ('every_s = 5\nnext_run = "soon"', "schedule 'bad': next_run: Extra inputs are not permitted"),
    ],
)
def test_a_bad_schedule_is_a_config_error_naming_the_schedule(
    tmp_path: Path, table: str, message: str
) -> None:
    write_toml(tmp_path, f'[[schedules]]\nname = "bad"\ntree = "night.yaml"\n{table}\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(env={}, cwd=tmp_path)
    assert message in str(caught.value)


def test_a_missing_tree_file_is_a_config_error_naming_the_schedule_and_the_path(tmp_path: Path) -> None:
    write_toml(tmp_path, '[[schedules]]\nname = "gone"\ntree = "nowhere.yaml"\nevery_s = 5\n')
    with pytest.raises(ConfigError, match=r"schedule 'gone': tree file .*nowhere.yaml does not exist"):
        load_settings(env={}, cwd=tmp_path)


def test_two_schedules_with_one_name_are_refused(tmp_path: Path) -> None:
    table = '[[schedules]]\nname = "twin"\ntree = "night.yaml"\nevery_s = 5\n'
    write_toml(tmp_path, table + table)
    with pytest.raises(ConfigError, match="schedule name\\(s\\) 'twin' used twice"):
        load_settings(env={}, cwd=tmp_path)


def test_schedules_must_be_an_array_of_tables(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"write \[\[schedules\]\]"):
        parse_schedules({"name": "x"}, tmp_path)


@pytest.mark.parametrize(
    ("overlap", "running", "action"),
    [
        (Overlap.SKIP, False, FireAction.START),
        (Overlap.SKIP, True, FireAction.SKIP),
        (Overlap.QUEUE, False, FireAction.START),
        (Overlap.QUEUE, True, FireAction.QUEUE),
        (Overlap.ALLOW, False, FireAction.START),
        (Overlap.ALLOW, True, FireAction.START),
    ],
)
def test_overlap_decides_what_a_fire_does_while_the_previous_run_goes_on(
    overlap: Overlap, running: bool, action: FireAction
) -> None:
    assert decide_overlap(overlap, running) is action


MISSED = [T0 + timedelta(minutes=m) for m in (15, 30, 45)]


@pytest.mark.parametrize(
    ("catch_up", "missed", "runs"),
    [
        (CatchUp.NONE, MISSED, []),
        (CatchUp.LATEST, MISSED, MISSED[-1:]),
        (CatchUp.ALL, MISSED, MISSED),
        (CatchUp.ALL, [], []),
        (CatchUp.LATEST, [], []),
    ],
)
def test_catch_up_decides_which_missed_fires_run(
    catch_up: CatchUp, missed: list[datetime], runs: list[datetime]
) -> None:
    assert decide_catch_up(catch_up, missed) == runs


def test_cron_times_are_read_in_the_schedules_time_zone() -> None:
    paris = Schedule(name="n", tree=Path("/t.yaml"), cron="0 2 * * *", timezone="Europe/Paris")
    assert paris.next_fire(T0) == datetime(2026, 12, 1, 1, 0, tzinfo=UTC)  # 02:00 CET
    summer = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
    assert paris.next_fire(summer) == datetime(2026, 7, 2, 0, 0, tzinfo=UTC)  # 02:00 CEST


def test_missed_cron_fires_are_those_after_the_last_fire_up_to_now() -> None:
    quarter = Schedule(name="q", tree=Path("/t.yaml"), cron="*/15 * * * *")
    missed, count = missed_fires(quarter.next_fire, T0, T0 + timedelta(minutes=50))
    assert missed == MISSED and count == 3


def test_a_long_downtime_catches_up_at_most_the_latest_runs() -> None:
    missed, count = missed_every(60, T0, T0 + timedelta(days=1))
    assert count == 24 * 60 and len(missed) == MAX_CATCH_UP_RUNS
    assert missed[-1] == T0 + timedelta(days=1)


def test_beat_catches_up_nothing_without_a_last_fire_on_record() -> None:
    spec = Schedule(name="q", tree=Path("/t.yaml"), every_s=60, catch_up=CatchUp.ALL)
    assert fires_to_catch_up(spec, None, T0) == []
    assert len(fires_to_catch_up(spec, T0, T0 + timedelta(seconds=150))) == 2


def test_a_scheduled_runs_tree_id_has_the_shape_of_every_runs() -> None:
    assert run_tree_id("night", "nightly", T0.timestamp(), "abcdef0123") == "night-20261130-120000-abcdef"
