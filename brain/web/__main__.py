"""``python -m brain.web --host H --port P``: the web view's process (what `vancetope web` and
`vancetope up` run). The store from the settings (``VANCETOPE_STORE``...), opened read-only for
the pages; the brain's Redis URL (``VANCETOPE_REDIS_URL``), if given, for the actions and the
clients page (brain.web.actions); the password from ``VANCETOPE_WEB_BASIC_AUTH`` in the environment (never on the command line),
without which it does not start."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import uvicorn

from brain.config import load_settings
from brain.errors import BrainError, StoreError
from brain.stack.webauth import (
    BASIC_AUTH_VARIABLE,
    UNAUTHORIZED_DEFAULT,
    UNAUTHORIZED_VARIABLE,
    WEB_PORT,
    credentials,
)
from brain.store import Store, open_store
from brain.web.actions import Actions
from brain.web.app import DEFAULT_FLOWER_URL, create_app

# A read-only store opens an existing database: the brain creates it as it starts.
STORE_WAIT_S = 120.0
log = logging.getLogger("vancetope.web")


def _open_store(url: str) -> Store:
    deadline = time.monotonic() + STORE_WAIT_S
    while True:
        try:
            return open_store(url, read_only=True)
        except StoreError as exc:
            if time.monotonic() > deadline:
                raise
            log.info("waiting for the store: %s", exc)
            time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m brain.web")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=WEB_PORT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    given = os.environ.get(BASIC_AUTH_VARIABLE)
    if not given:
        print(f"error: set {BASIC_AUTH_VARIABLE}=user:password: the web view never serves without one",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        users = credentials(given)
        settings = load_settings()
        store = _open_store(settings.store)
    except ValueError as exc:
        print(f"error: {exc}".replace("FLOWER_BASIC_AUTH", BASIC_AUTH_VARIABLE), file=sys.stderr)
        return 2
    except BrainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3 if isinstance(exc, StoreError) else 2
    actions = Actions(settings, settings.redis_url)
    if not actions.available:
        log.info("no VANCETOPE_REDIS_URL: serving pages only (no cancel, no approve, no clients page)")
    app = create_app(
        store,
        address=args.host,
        users=users,
        unauthorized=os.environ.get(UNAUTHORIZED_VARIABLE) or UNAUTHORIZED_DEFAULT,
        actions=actions,
        flower_url=settings.web_flower_url or DEFAULT_FLOWER_URL,
        result_users=settings.web_result_users,
        argument_users=settings.web_argument_users,
    )
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="info", access_log=False)
    finally:
        actions.close()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
