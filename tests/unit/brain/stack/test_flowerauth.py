"""Who may open Flower: always a password, on loopback too, never in the clear; on loopback only
its own address in the Host header."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from brain.stack.flowerauth import (
    BASIC_AUTH_VARIABLE,
    FLOWER_USER,
    UNAUTHORIZED_VARIABLE,
    FlowerAccess,
    FlowerUnprotected,
    decide_access,
    host_allowed,
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


@pytest.mark.parametrize("address", ["0.0.0.0", "127.0.0.1"])
def test_a_password_is_generated_once_into_a_private_file_on_every_address(
    tmp_path: Path, address: str
) -> None:
    secret = tmp_path / "flower.secret"
    first = decide_access(address, {}, secret)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert first.users == (FLOWER_USER,) and first.secret_file == secret
    assert first.env()[BASIC_AUTH_VARIABLE] == f"{FLOWER_USER}:{secret.read_text().strip()}"
    assert decide_access(address, {}, secret).basic_auth == first.basic_auth  # kept across starts
    assert first.basic_auth is not None and first.basic_auth not in repr(first)


def test_on_loopback_the_operators_password_is_used_and_none_generated(tmp_path: Path) -> None:
    secret = tmp_path / "flower.secret"
    given = decide_access("127.0.0.1", {BASIC_AUTH_VARIABLE: "ops:pw,ann:pw2"}, secret)
    assert given.users == ("ops", "ann") and given.secret_file is None
    assert given.env()[BASIC_AUTH_VARIABLE] == "ops:pw,ann:pw2"


def test_the_operators_credentials_win_over_a_generated_password(tmp_path: Path) -> None:
    access = decide_access("0.0.0.0", {BASIC_AUTH_VARIABLE: "ops:pw"}, tmp_path / "flower.secret")
    assert access.env()[BASIC_AUTH_VARIABLE] == "ops:pw"
    assert not (tmp_path / "flower.secret").exists()


@pytest.mark.parametrize("given", ["", "ops", "ops:", ":pw", "ops:pw,ann"])
def test_malformed_credentials_are_refused_naming_the_variable(tmp_path: Path, given: str) -> None:
    with pytest.raises(FlowerUnprotected, match=f"{BASIC_AUTH_VARIABLE} must be user:password"):
        decide_access("0.0.0.0", {BASIC_AUTH_VARIABLE: given}, tmp_path / "flower.secret")


@pytest.mark.parametrize("address", ["0.0.0.0", "127.0.0.1"])
def test_flower_without_a_password_is_refused_on_every_address(address: str) -> None:
    with pytest.raises(FlowerUnprotected, match=f"flower not started on {address}: no password is set"):
        FlowerAccess(address).env()


# (Host header, Flower's address, answered). On loopback any other name is a DNS rebinding:
# a page of the attacker's whose name now resolves to 127.0.0.1.
@pytest.mark.parametrize(
    ("host", "address", "answered"),
    [
        ("127.0.0.1:5555", "127.0.0.1", True),
        ("localhost:5555", "127.0.0.1", True),
        ("LOCALHOST", "127.0.0.1", True),
        ("[::1]:5555", "::1", True),
        ("127.0.0.2:5555", "127.0.0.2", True),
        ("evil.example:5555", "127.0.0.1", False),
        ("127.0.0.1.nip.io:5555", "127.0.0.1", False),
        ("127.0.0.1:5555@evil.example", "127.0.0.1", False),
        ("evil.example#@127.0.0.1", "127.0.0.1", False),
        ("", "127.0.0.1", False),
        ("flower.example.org", "0.0.0.0", True),  # beyond loopback the password guards it
    ],
)
def test_on_loopback_only_a_loopback_host_header_is_answered(host: str, address: str, answered: bool) -> None:
    assert host_allowed(host, address) is answered


# --- what a refused caller is told: who to log in as and where the password is ------------------


def test_on_loopback_the_401_names_the_user_and_the_password_file(tmp_path: Path) -> None:
    access = decide_access("127.0.0.1", {}, tmp_path / "flower.secret")
    body = access.env()[UNAUTHORIZED_VARIABLE]
    assert body == access.unauthorized()
    assert f"Log in as user {FLOWER_USER}, the password in {tmp_path / 'flower.secret'}." in body
    assert f'curl -u "{FLOWER_USER}:$(cat {tmp_path / "flower.secret"})"' in body
    password = (tmp_path / "flower.secret").read_text().strip()
    assert password not in body and "UNAUTHENTICATED" not in body


def test_beyond_loopback_the_401_does_not_show_the_data_dirs_path(tmp_path: Path) -> None:
    body = decide_access("0.0.0.0", {}, tmp_path / "flower.secret").unauthorized()
    assert str(tmp_path) not in body
    assert "flower.secret in the stack's data dir" in body


def test_with_the_operators_credentials_the_401_points_to_flower_basic_auth(tmp_path: Path) -> None:
    body = decide_access(
        "127.0.0.1", {BASIC_AUTH_VARIABLE: "ops:pw"}, tmp_path / "flower.secret"
    ).unauthorized()
    assert "Log in as user ops, the password in the FLOWER_BASIC_AUTH its operator set." in body
    assert ":pw" not in body and "UNAUTHENTICATED" not in body
