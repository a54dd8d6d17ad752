"""workers.masking and workers.secret_forms: every 12-character run of every form of a secret is
masked (issue 20, M2), as a table; texts that show no such run are left alone."""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator

import pytest

from workers import masking
from workers.secret_forms import base64_forms, masked_runs

SECRET = "canary-7f3a9c1e-do-not-leak"  # 27 characters
SHORT = "pw-9x!"  # 6 characters: masked whole only
RAW = SECRET.encode()


@pytest.fixture(autouse=True)
def remembered() -> Iterator[None]:
    masking.forget_all()
    masking.remember(SECRET)
    masking.remember(SHORT)
    yield
    masking.forget_all()


def b64(data: bytes, *, url: bool = False, pad: bool = True) -> str:
    text = (base64.urlsafe_b64encode if url else base64.b64encode)(data).decode()
    return text if pad else text.rstrip("=")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"token={SECRET}.", "token=***."),
        (f"{SECRET}{SECRET}", "***"),
        (f"token={SECRET[:-1]}", "token=***"),  # truncated by one
        (f"token={SECRET[1:]}", "token=***"),
        (f"[{SECRET[7:19]}]", "[***]"),  # any 12-character run
        (f"[{SECRET[::-1]}]", "[***]"),  # reversed
        (f"[{SECRET[::-1][3:15]}]", "[***]"),
        (f"[{SECRET.upper()}]", "[***]"),  # shouted back
        (f"[{SECRET.lower()[2:14]}]", "[***]"),
        (f"[{SECRET[::-1].upper()}]", "[***]"),
        (RAW.hex(), "***"),
        (RAW.hex().upper(), "***"),
        (f"0x{RAW[2:9].hex()}", "0x***"),
        (b64(RAW), "***"),
        (b64(RAW, pad=False), "***"),
        (b64(RAW, url=True), "***"),
        (b64(b"\xfb\xff" + RAW, url=True, pad=False), "-_9***s"),  # url-safe alphabet, offset 2
        (b64(b"{" + RAW + b"}"), "e2***30="),  # offset 1 inside a larger blob
        (b64(b"ab" + RAW[:-3] + b"cd"), "YWJ***jZA=="),  # offset 2, truncated
        # a run shorter than 12 characters of a long secret is not a leak
        (f"[{SECRET[7:18]}]", f"[{SECRET[7:18]}]"),
        # a short secret: whole, reversed, hex; not a part of it
        (f"pw={SHORT}", "pw=***"),
        (SHORT[::-1], "***"),
        (SHORT.encode().hex(), "***"),
        (b64(SHORT.encode()), "***"),
        (f"pw={SHORT[:-1]}", f"pw={SHORT[:-1]}"),
        ("nothing to see here", "nothing to see here"),
    ],
)
def test_every_form_of_a_secret_is_masked(text: str, expected: str) -> None:
    assert masking.mask(text) == expected


def test_masking_keeps_the_rest_of_a_large_text_and_every_leak_in_it() -> None:
    filler = "x" * 100_000
    text = f"{filler}{SECRET[:-1]}{filler}{b64(RAW)}{filler}"
    assert masking.mask(text) == f"{filler}***{filler}***{filler}"


def test_a_base64_form_holds_only_the_secrets_own_characters() -> None:
    # "abc" at offsets 0, 1, 2: "YWJj", "AGFiYw==" -> characters 2..4 (bits 12..30 of the
    # secret's 8..32), "AABhYmM=" -> characters 3..5; the others hold the neighbours' bits.
    assert base64_forms(b"abc") == {"YWJj", "FiY", "hYm"}
    forms = base64_forms(RAW)
    for prefix in (b"", b"x", b"xy"):
        for suffix in (b"", b"z", b"zz"):
            encoded = b64(prefix + RAW + suffix)
            assert any(form in encoded for form in forms), (prefix, suffix)


def test_runs_are_twelve_characters_and_a_short_secret_is_whole() -> None:
    assert {len(run) for run in masked_runs(SECRET)} == {12}
    assert {SHORT, SHORT[::-1]} <= masked_runs(SHORT)
    assert all(len(run) >= 6 for run in masked_runs(SHORT))


def test_data_and_log_records_are_masked() -> None:
    assert masking.mask_data({"k": [f"a {SECRET[:-2]}", (SECRET[::-1],)], SECRET: 1}) == {
        "k": ["a ***", ("***",)],
        "***": 1,
    }
    masking.mask_logs()
    record = logging.getLogRecordFactory()("x", logging.INFO, __file__, 1, "got %s", (b64(RAW),), None)
    assert record.getMessage() == "got ***"
