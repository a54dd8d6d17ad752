"""The vault's rules (brain.runtime.vault) and the worker side of secrets (workers.secret_refs,
workers.masking): encryption bound to the name, rotation, late resolution, masking."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from brain.runtime.vault import Vault, VaultError, load_keys, write_keys
from brain.store.sqlite import SQLiteStore
from tests.conftest import make_settings
from workers import masking, secret_refs


@pytest.fixture(autouse=True)
def fresh_process() -> Iterator[None]:
    masking.forget_all()
    secret_refs.use_resolver(None)
    yield
    masking.forget_all()
    secret_refs.use_resolver(None)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "store.db")
    yield s
    s.close()


def test_set_get_list_delete_and_the_store_holds_no_plaintext(store: SQLiteStore, tmp_path: Path) -> None:
    vault = Vault(store, [Fernet.generate_key()], clock=lambda: 5.0)
    info = vault.set("API_TOKEN", "tok-123456")
    assert (info.name, info.created_at) == ("API_TOKEN", 5.0)
    assert vault.get("API_TOKEN") == "tok-123456"
    assert [i.name for i in vault.list()] == ["API_TOKEN"]
    assert b"tok-123456" not in (tmp_path / "store.db").read_bytes()
    assert vault.delete("API_TOKEN") and not vault.delete("API_TOKEN")
    with pytest.raises(
        VaultError, match="no secret 'API_TOKEN' in the vault; store it with `vancetope secrets set"
    ):
        vault.get("API_TOKEN")


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("bad name", "long-enough", "invalid secret name 'bad name'"),
        ("X", "abc", "shorter than 4 characters"),
        ("X", "x" * 70_000, "larger than"),
    ],
)
def test_bad_names_and_values_are_refused_naming_the_secret(
    store: SQLiteStore, name: str, value: str, problem: str
) -> None:
    with pytest.raises(VaultError, match=problem):
        Vault(store, [Fernet.generate_key()]).set(name, value)


def test_rotation_re_encrypts_under_the_new_key_and_the_old_key_alone_no_longer_opens_it(
    store: SQLiteStore,
) -> None:
    old, new = Fernet.generate_key(), Fernet.generate_key()
    Vault(store, [old]).set("S", "the-value")
    assert Vault(store, [new, old]).rotate() == 1
    assert Vault(store, [new]).get("S") == "the-value"
    with pytest.raises(VaultError, match="does not decrypt with the vault key"):
        Vault(store, [old]).get("S")


def test_keys_come_from_the_env_setting_or_a_private_key_file(tmp_path: Path) -> None:
    with pytest.raises(VaultError, match="no vault key: set VANCETOPE_VAULT_KEY"):
        load_keys(make_settings(tmp_path))
    made = load_keys(make_settings(tmp_path), create=True)
    key_file = tmp_path / "data" / "vault.key"
    assert key_file.stat().st_mode & 0o777 == 0o600 and len(made) == 1
    a, b = Fernet.generate_key(), Fernet.generate_key()
    assert load_keys(make_settings(tmp_path, vault_key=f"{a.decode()},{b.decode()}")) == [a, b]
    with pytest.raises(VaultError, match="key 2 is not a Fernet key"):
        load_keys(make_settings(tmp_path, vault_key=f"{a.decode()},not-a-key"))
    write_keys(key_file, [b, a])
    assert load_keys(make_settings(tmp_path)) == [b, a]


def test_references_resolve_late_and_their_values_are_masked_from_then_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with pytest.raises(
        secret_refs.SecretUnavailable, match=r"server 'x' env 'T' refers to \$\{vault:TOKEN\}, but"
    ):
        secret_refs.resolve("Bearer ${vault:TOKEN}", "server 'x' env 'T'")
    secret_refs.use_resolver({"TOKEN": "s3cret-value"}.__getitem__)
    assert secret_refs.resolve("Bearer ${vault:TOKEN}", "h") == "Bearer s3cret-value"
    assert secret_refs.resolve("no reference", "h") == "no reference"
    with pytest.raises(secret_refs.SecretUnavailable, match=r"refers to \$\{vault:OTHER\}: 'OTHER'"):
        secret_refs.resolve("${vault:OTHER}", "h")
    assert masking.mask("got s3cret-value!") == "got ***!"
    assert masking.mask_data({"k": ["s3cret-value", 1], "s3cret-value": None}) == {
        "k": ["***", 1],
        "***": None,
    }
    masking.mask_logs()
    with caplog.at_level(logging.INFO):
        logging.getLogger("vancetope.test").info("value %s", "s3cret-value")
    assert "s3cret-value" not in caplog.text and "value ***" in caplog.text
