"""The registry and the server MCP config, reloaded while the brain runs (layer: brain/runtime).

The brain watches the registry file and the mcpServers file (watchfiles on their folders,
so an editor's rename or a delete and re-create is seen; their size and mtime decide) and
takes a reload request from ``vancetope reload`` (looked for at least every ``WATCH_EVERY_S``). A change builds a
new registry (discovering the MCP servers again) and swaps it in whole: calls already sent
finish on the definitions they were sent with, new calls use the new ones; server workers
pick up the new snapshot within ``brain.runtime.recorder.REGISTRY_MAX_AGE_S`` and restart an MCP
server whose config changed before their next call (``workers.mcp_clients.get_manager``).
A file that no longer loads is logged and the registry in use is kept.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Protocol

import watchfiles

from brain.config import Settings
from brain.core.snapshot import RegistrySnapshot
from brain.core.toolnames import clash_lines
from brain.errors import BrainError
from brain.hot.state import HotState
from brain.runtime.registry import build_registry
from workers.contracts import KEY_NS
from workers.errors import WorkerError

log = logging.getLogger("vancetope.brain")

WATCH_EVERY_S = 2.0
RELOAD_REQUEST_KEY = f"{KEY_NS}reload-requested"
# The first words of RegistrySnapshot.changes when nothing changed, or when a reload failed.
NO_CHANGE = "no tool changed"
RELOAD_FAILED = "reload failed:"

Signature = tuple[tuple[str, int, int], ...]


def registry_changes(old: RegistrySnapshot, new: RegistrySnapshot) -> list[str]:
    """What a reload changed, one short line each (pure): tools added, removed, redefined."""
    added = sorted(set(new.tools) - set(old.tools))
    removed = sorted(set(old.tools) - set(new.tools))
    changed = sorted(n for n in set(old.tools) & set(new.tools) if old.tools[n] != new.tools[n])
    lines = [
        f"{label}: {', '.join(names)}"
        for label, names in (("added", added), ("removed", removed), ("changed", changed))
        if names
    ]
    lines += [
        f"clash: {line}"
        for line in clash_lines({k: v for k, v in new.clashes.items() if old.clashes.get(k) != v})
    ]
    return lines or [NO_CHANGE]


def sources(settings: Settings) -> list[Path]:
    """The files the server registry is built from."""
    return [p for p in (settings.registry, settings.mcp_config) if p is not None]


def signature(paths: list[Path]) -> Signature:
    """Size and mtime of each file (0, 0 when missing): what a change of a source looks like."""
    out = []
    for path in paths:
        try:
            st = path.stat()
            out.append((str(path), st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((str(path), 0, 0))
    return tuple(out)


class RegistryHolder(Protocol):
    """Whoever routes with the registry in use (the scheduler): a reload swaps it whole."""

    registry: RegistrySnapshot


class Reloader:
    """Handed what it reads and writes, not the brain: the settings (which files), hot state
    (the reload request, the published snapshot) and the registry's holder."""

    def __init__(
        self, settings: Settings, hot: HotState, holder: RegistryHolder, seen: Signature | None = None
    ) -> None:
        self.settings = settings
        self.hot = hot
        self.holder = holder
        self.sources = sources(settings)
        # What the files looked like when the registry in use was built (start_brain), not
        # when this thread starts: a change in between is a change.
        self._seen = seen if seen is not None else signature(self.sources)

    def check(self) -> list[str] | None:
        """Reload if a source changed or a reload was requested; the changes, or None."""
        requested = self.hot.r.getdel(RELOAD_REQUEST_KEY) is not None
        now = signature(self.sources)
        if now == self._seen and not requested:
            return None
        self._seen = now
        return self.reload()

    def reload(self) -> list[str]:
        old = self.holder.registry
        try:
            new = build_registry(self.settings)
        except (BrainError, WorkerError, OSError) as exc:
            log.error("registry reload failed; keeping the registry in use: %s", exc)
            failed = old.model_copy(update={"loaded_at": time.time(), "changes": [f"{RELOAD_FAILED} {exc}"]})
            self.hot.put_registry(failed.model_dump(mode="json"))
            return failed.changes
        new = new.model_copy(update={"loaded_at": time.time(), "changes": registry_changes(old, new)})
        for failure in new.mcp_failures:
            log.error("%s", failure.described())
        self.holder.registry = new
        self.hot.put_registry(new.model_dump(mode="json"))
        log.warning("registry reloaded (%d tools): %s", len(new.tools), "; ".join(new.changes))
        return new.changes

    def run(self, stop: threading.Event) -> threading.Thread:
        log.info("watching %s for changes", ", ".join(map(str, self.sources)) or "no registry sources")

        def check() -> None:
            try:
                self.check()
            except Exception:
                log.exception("watching the registry sources failed; trying again")

        names = {p.name for p in self.sources}

        def loop() -> None:
            while not stop.is_set():
                folders = {p.parent for p in self.sources if p.parent.is_dir()}
                if not folders:  # nothing to watch (yet): look again, and for a request, later
                    if not stop.wait(WATCH_EVERY_S):
                        check()
                    continue
                try:
                    # Wakes on a change of a source, or after WATCH_EVERY_S without one (the
                    # reload request in Redis); check() compares signatures either way.
                    for _ in watchfiles.watch(
                        *folders,
                        # by name: a symlinked folder may report its events under another path
                        watch_filter=lambda _change, name: Path(name).name in names,
                        recursive=False,
                        rust_timeout=int(WATCH_EVERY_S * 1000),
                        yield_on_timeout=True,
                        stop_event=stop,
                        raise_interrupt=False,
                    ):
                        check()
                        if folders != {p.parent for p in self.sources if p.parent.is_dir()}:
                            break  # a folder came or went: watch the ones there are now
                except (OSError, RuntimeError) as exc:  # a folder vanished as watching began
                    log.debug("watching %s: %s; trying again", ", ".join(map(str, folders)), exc)
                    if not stop.wait(WATCH_EVERY_S):
                        check()

        thread = threading.Thread(target=loop, name="vancetope-reload", daemon=True)
        thread.start()
        return thread
