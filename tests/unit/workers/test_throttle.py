"""workers.throttle: reading a 429's Retry-After (seconds or an HTTP-date), bounded."""

from __future__ import annotations

import email.utils

import pytest

from workers.throttle import MAX_PAUSE_S, pause_asked, retry_after_s, throttled_data

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("2", 2.0),
        (" 30 ", 30.0),
        (email.utils.formatdate(NOW + 90, usegmt=True), 90.0),
        (email.utils.formatdate(NOW - 90, usegmt=True), 0.0),  # a time past: no wait
        ("999999", MAX_PAUSE_S),  # a week's pause is cut to the most a server may ask
        ("soon", None),
        ("-3", None),
        ("", None),
        (None, None),
    ],
)
def test_retry_after_reads_seconds_or_a_date(header: str | None, seconds: float | None) -> None:
    assert retry_after_s(header, NOW) == seconds


def test_only_a_429_with_a_readable_retry_after_asks_for_a_pause() -> None:
    assert throttled_data(429, "2", NOW) == {"status": 429, "retry_after_s": 2.0}
    assert throttled_data(429, "2", NOW, "https://Site.example/a") == {
        "status": 429,
        "retry_after_s": 2.0,
        "origin": "https://site.example:443",
    }
    assert throttled_data(429, None, NOW, "https://site.example/a") == {"status": 429}  # nothing to pause
    assert throttled_data(503, "2", NOW, "https://site.example/a") == {"status": 503}
    assert throttled_data(429, None, NOW) == {"status": 429}
    assert throttled_data(503, "2", NOW) == {"status": 503}
    assert pause_asked(throttled_data(429, "2", NOW)) == 2.0
    assert pause_asked({"status": 429}) is None
    assert pause_asked({"status": 503, "retry_after_s": 2}) is None
    assert pause_asked({"status": 429, "retry_after_s": "2"}) is None  # not a number: ignored
    assert pause_asked(None) is None
