"""The vault: server-side secrets encrypted at rest in the store (layer: brain/runtime; issue 12 item 1).

Values are encrypted with Fernet (AES-128-CBC + HMAC-SHA256, from ``cryptography``) under a
key from ``VANCETOPE_VAULT_KEY`` (several, comma-separated: the first encrypts, all decrypt —
MultiFernet, for rotation) or from a 0600 key file in the data dir, made on first use. Each
ciphertext holds its secret's name beside the value, checked on decryption, so a ciphertext
copied to another name in the store does not decrypt there.

The store holds only names, dates and ciphertexts; values exist in clear only in the process
that resolves a ``${vault:NAME}`` reference (``install`` -> ``workers.secret_refs``), and are
masked in everything that process sends or logs (``workers.masking``).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from pydantic import BaseModel, ConfigDict

from brain.config import Settings
from brain.core.models import SecretRecord
from brain.errors import BrainError
from brain.store import Store, open_store
from workers import masking, secret_refs

KEY_FILE = "vault.key"
SECRET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
MAX_SECRET_BYTES = 64 * 1024


class VaultError(BrainError):
    """The vault cannot do what was asked; the message names the secret, never its value."""


class SecretInfo(BaseModel):
    """What `vancetope secrets list` shows: never the value."""

    model_config = ConfigDict(frozen=True)

    name: str
    created_at: float
    updated_at: float


def key_file(settings: Settings) -> Path:
    return settings.vault_key_file or settings.data_dir / KEY_FILE


def load_keys(settings: Settings, *, create: bool = False) -> list[bytes]:
    """The vault keys, primary first: ``VANCETOPE_VAULT_KEY``, else the key file (made, mode
    0600, when ``create`` and it does not exist yet)."""
    if settings.vault_key:
        keys = [k.strip().encode() for k in settings.vault_key.split(",") if k.strip()]
        source = "VANCETOPE_VAULT_KEY"
    else:
        path = key_file(settings)
        if not path.is_file():
            if not create:
                raise VaultError(
                    f"no vault key: set VANCETOPE_VAULT_KEY, or store a secret once with "
                    f"`vancetope secrets set NAME` to make {path}"
                )
            write_keys(path, [Fernet.generate_key()])
        keys = [line.strip().encode() for line in path.read_text().splitlines() if line.strip()]
        source = str(path)
    for position, key in enumerate(keys, 1):
        try:
            Fernet(key)
        except ValueError:
            raise VaultError(
                f"{source}: key {position} is not a Fernet key (32 url-safe base64-encoded bytes); "
                "make one with `python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'`"
            ) from None
    if not keys:
        raise VaultError(f"{source}: holds no key")
    return keys


def write_keys(path: Path, keys: Sequence[bytes]) -> None:
    """Write the key file owner-only, atomically (a crash leaves the old file or the new)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(k.decode() + "\n" for k in keys))
    os.replace(tmp, path)


class Vault:
    """Secrets by name, in ``store``, encrypted with ``keys`` (primary first)."""

    def __init__(self, store: Store, keys: Sequence[bytes], clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.fernet = MultiFernet([Fernet(k) for k in keys])
        self.clock = clock

    def set(self, name: str, value: str) -> SecretInfo:
        check_name(name)
        if len(value) < masking.MIN_MASKED_CHARS:
            raise VaultError(
                f"secret {name!r}: a value shorter than {masking.MIN_MASKED_CHARS} characters cannot be "
                "masked in output without mangling it; use a real secret"
            )
        if len(value.encode()) > MAX_SECRET_BYTES:
            raise VaultError(f"secret {name!r}: larger than {MAX_SECRET_BYTES} bytes")
        now = self.clock()
        old = self.store.get_secret(name)
        record = SecretRecord(
            name=name,
            ciphertext=self._encrypt(name, value),
            created_at=old.created_at if old else now,
            updated_at=now,
        )
        self.store.put_secret(record)
        return _info(record)

    def get(self, name: str) -> str:
        check_name(name)
        record = self.store.get_secret(name)
        if record is None:
            raise VaultError(f"no secret {name!r} in the vault; store it with `vancetope secrets set {name}`")
        return self._decrypt(record)

    def list(self) -> list[SecretInfo]:
        return [_info(r) for r in self.store.list_secrets()]

    def delete(self, name: str) -> bool:
        check_name(name)
        return self.store.delete_secret(name)

    def rotate(self) -> int:
        """Re-encrypt every secret under the primary key; how many there were."""
        records = self.store.list_secrets()
        for record in records:
            value = self._decrypt(record)
            self.store.put_secret(record.model_copy(update={"ciphertext": self._encrypt(record.name, value)}))
        return len(records)

    def _encrypt(self, name: str, value: str) -> str:
        return self.fernet.encrypt(json.dumps({"name": name, "value": value}).encode()).decode()

    def _decrypt(self, record: SecretRecord) -> str:
        try:
            plain = json.loads(self.fernet.decrypt(record.ciphertext.encode()))
        except InvalidToken:
            raise VaultError(
                f"secret {record.name!r} does not decrypt with the vault key(s): the key changed or was "
                "rotated away; set it again, or add the old key to VANCETOPE_VAULT_KEY"
            ) from None
        if plain.get("name") != record.name:
            raise VaultError(
                f"secret {record.name!r} holds the ciphertext of another secret; refusing it "
                f"(set it again with `vancetope secrets set {record.name}`)"
            )
        return str(plain["value"])


def check_name(name: str) -> None:
    if not SECRET_NAME.match(name):
        raise VaultError(
            f"invalid secret name {name!r}: a letter or '_' first, then letters, digits, '_', '.', '-' (max 128)"
        )


def _info(record: SecretRecord) -> SecretInfo:
    return SecretInfo(name=record.name, created_at=record.created_at, updated_at=record.updated_at)


def install(settings: Settings) -> None:
    """Let this process resolve ``${vault:NAME}`` (the brain, the server pool, the CLI's
    explain): each reference opens the store and reads the keys at that moment, so a rotated
    key or a changed secret is seen by the next server start without a restart."""

    def resolve(name: str) -> str:
        store = open_store(settings.store)
        try:
            return Vault(store, load_keys(settings)).get(name)
        finally:
            store.close()

    secret_refs.use_resolver(resolve)
    masking.mask_logs()


__all__ = ["SecretInfo", "Vault", "VaultError", "install", "key_file", "load_keys", "write_keys"]
