"""The vault commands (layer: brain/cli): secrets set, list, delete, rotate-key. They talk
to the store only, so they work whether or not the stack runs."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator

import click
from cryptography.fernet import Fernet
from rich.markup import escape
from rich.table import Table

from brain.cli.base import (
    EXIT_BAD_INPUT,
    cli,
    console,
    fail,
)
from brain.config import Settings
from brain.runtime.vault import SecretInfo, Vault, VaultError, check_name, key_file, load_keys, write_keys
from brain.store import open_store


@cli.group()
def secrets() -> None:
    """The vault: server-side secrets, encrypted in the store, used as ${vault:NAME}.

    Works whether or not the stack runs (it talks to the store). Values are read from stdin
    or a hidden prompt, never from the command line, and never printed.
    """


@contextlib.contextmanager
def _vault(settings: Settings, *, create: bool = False) -> Iterator[Vault]:
    """The vault on the configured store; a VaultError inside is exit 2 with its message."""
    store = open_store(settings.store)
    try:
        yield Vault(store, load_keys(settings, create=create))
    except VaultError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    finally:
        store.close()


@secrets.command("set")
@click.argument("name")
@click.pass_obj
def secrets_set(settings: Settings, name: str) -> None:
    """Store secret NAME: its value from stdin (piped) or a hidden prompt.

    The first secret of an embedded stack makes its key file (<data_dir>/vault.key, 0600)
    unless VANCETOPE_VAULT_KEY is set.
    """
    try:
        check_name(name)
    except VaultError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    if sys.stdin.isatty():
        value = click.prompt(f"value of {name}", hide_input=True, confirmation_prompt=True, err=True)
    else:
        value = sys.stdin.read().removesuffix("\n")
    if not value:
        fail(f"no value for secret {name!r}: pipe it on stdin or type it at the prompt", EXIT_BAD_INPUT)
    with _vault(settings, create=True) as vault:
        info = vault.set(name, value)
    verb = "updated" if info.updated_at != info.created_at else "stored"
    console.print(f"{verb} secret [bold]{name}[/]; use it as ${{vault:{name}}}", highlight=False)


@secrets.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: names and dates, never values.")
@click.pass_obj
def secrets_list(settings: Settings, as_json: bool) -> None:
    """List the secrets' names and dates (never their values)."""
    store = open_store(settings.store)
    try:
        infos = [
            SecretInfo(name=r.name, created_at=r.created_at, updated_at=r.updated_at)
            for r in store.list_secrets()
        ]
    finally:
        store.close()
    if as_json:
        click.echo(json.dumps([i.model_dump() for i in infos], indent=2))
        return
    if not infos:
        console.print("no secrets yet: `vancetope secrets set NAME`")
        return
    table = Table(title="secrets", title_justify="left")
    for col in ("name", "created", "updated"):
        table.add_column(col)
    for info in infos:
        table.add_row(info.name, _when(info.created_at), _when(info.updated_at))
    console.print(table)


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


@secrets.command("delete")
@click.argument("name")
@click.pass_obj
def secrets_delete(settings: Settings, name: str) -> None:
    """Delete secret NAME. A server that refers to it fails at its next start, naming it."""
    store = open_store(settings.store)
    try:
        check_name(name)
        deleted = store.delete_secret(name)
    except VaultError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    finally:
        store.close()
    if not deleted:
        fail(f"no secret {name!r}; `vancetope secrets list` shows them", EXIT_BAD_INPUT)
    console.print(f"deleted secret [bold]{name}[/]")


@secrets.command("rotate-key")
@click.pass_obj
def secrets_rotate_key(settings: Settings) -> None:
    """Re-encrypt every secret under a new key.

    With the key file: a new key is made, every secret re-encrypted, and the old key
    dropped. With VANCETOPE_VAULT_KEY: put the new key first in it (keeping the old ones)
    on every process, run this, then remove the old keys.
    """
    if settings.vault_key:
        with _vault(settings) as vault:
            count = vault.rotate()
        console.print(
            f"re-encrypted {count} secret(s) with the first key of VANCETOPE_VAULT_KEY; "
            "you can now remove the other keys from it"
        )
        return
    path = key_file(settings)
    store = open_store(settings.store)
    try:
        old = load_keys(settings)
        new = Fernet.generate_key()
        write_keys(path, [new, *old])  # a crash mid-way leaves keys that open every ciphertext
        count = Vault(store, [new, *old]).rotate()
        write_keys(path, [new])
    except VaultError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    finally:
        store.close()
    console.print(escape(f"re-encrypted {count} secret(s) with a new key in {path}; the old key is gone"))
