"""Who may open Flower: a password whenever it listens beyond loopback, never in the clear."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from brain.flowerauth import (
    BASIC_AUTH_VARIABLE,
    FLOWER_USER,
    FlowerAccess,
    FlowerUnprotected,
    decide_access,
    is_loopback,
)


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.0.2.10", False),
        ("flower.example.org", False),
    ],
)
def test_only_loopback_addresses_count_as_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_beyond_loopback_a_password_is_generated_once_into_a_private_file(tmp_path: Path) -> None:
    secret = tmp_path / "flower.secret"
    first = decide_access("0.0.0.0", {}, secret)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert first.users == (FLOWER_USER,) and first.secret_file == secret
    assert first.env() == {BASIC_AUTH_VARIABLE: f"{FLOWER_USER}:{secret.read_text().strip()}"}
    assert decide_access("0.0.0.0", {}, secret).basic_auth == first.basic_auth  # kept across starts
    assert first.basic_auth is not None and first.basic_auth not in repr(first)


def test_on_loopback_no_password_is_asked_unless_the_operator_sets_one(tmp_path: Path) -> None:
    secret = tmp_path / "flower.secret"
    assert decide_access("127.0.0.1", {}, secret).env() == {}
    assert not secret.exists()
    given = decide_access("127.0.0.1", {BASIC_AUTH_VARIABLE: "ops:pw,ann:pw2"}, secret)
    assert given.users == ("ops", "ann") and given.secret_file is None
    assert given.env() == {BASIC_AUTH_VARIABLE: "ops:pw,ann:pw2"}


def test_the_operators_credentials_win_over_a_generated_password(tmp_path: Path) -> None:
    access = decide_access("0.0.0.0", {BASIC_AUTH_VARIABLE: "ops:pw"}, tmp_path / "flower.secret")
    assert access.env() == {BASIC_AUTH_VARIABLE: "ops:pw"}
    assert not (tmp_path / "flower.secret").exists()


@pytest.mark.parametrize("given", ["", "ops", "ops:", ":pw", "ops:pw,ann"])
def test_malformed_credentials_are_refused_naming_the_variable(tmp_path: Path, given: str) -> None:
    with pytest.raises(FlowerUnprotected, match=f"{BASIC_AUTH_VARIABLE} must be user:password"):
        decide_access("0.0.0.0", {BASIC_AUTH_VARIABLE: given}, tmp_path / "flower.secret")


def test_flower_beyond_loopback_without_a_password_is_refused() -> None:
    with pytest.raises(FlowerUnprotected, match="flower not started on 0.0.0.0: no password is set"):
        FlowerAccess("0.0.0.0").env()
