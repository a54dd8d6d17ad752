"""What the web view may change (layer: brain/web; glue): cancel a tree or a task, approve a
client's changed tools, read the clients view. The operations are the CLI's
(``brain.runtime.operations``); this holds the web process's one brain connection to the
running stack, made on first use (a page needs none) and used by one request at a time.

Without a Redis URL (``VANCETOPE_REDIS_URL``) the web view reads the store only and offers no
action: ``available`` is False and each action answers 503 saying what to set.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from brain.config import Settings
from brain.errors import StackNotRunning
from brain.runtime.recorder import REGISTRY_MAX_AGE_S
from brain.runtime.service import Brain, published_registry

T = TypeVar("T")

NO_REDIS = (
    "this web view reads the store only: actions (cancel, approve) and the clients page need the "
    "brain's Redis URL in VANCETOPE_REDIS_URL (`vancetope up` gives it one; compose.yaml's web service sets it)"
)


class Actions:
    def __init__(self, settings: Settings, redis_url: str | None) -> None:
        self.settings, self.redis_url = settings, redis_url
        self._brain: Brain | None = None
        self._registry_read_at = 0.0
        # One request at a time: the brain's store connection and caches are not shared
        # between threads, and operators' clicks are rare.
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        return bool(self.redis_url)

    def run(self, operation: Callable[[Brain], T]) -> T:
        """``operation`` on the brain (connected now if it is not yet): raises StackNotRunning
        when there is no Redis URL or no brain answers there."""
        if not self.redis_url:
            raise StackNotRunning(NO_REDIS)
        with self._lock:
            if self._brain is None:
                self._brain = Brain.connect(self.settings, self.redis_url)
                self._registry_read_at = time.monotonic()
            elif time.monotonic() - self._registry_read_at > REGISTRY_MAX_AGE_S:
                # A long-lived process: the brain's reloads reach it as they reach the pools.
                self._brain.scheduler.registry = published_registry(self._brain.hot, self.redis_url)
                self._registry_read_at = time.monotonic()
            return operation(self._brain)

    def close(self) -> None:
        with self._lock:
            if self._brain is not None:
                self._brain.close()
                self._brain = None
