"""Secret values never leave a process in clear (layer: workers; issue 12 item 3).

A process that resolves a ``${vault:NAME}`` reference (``workers.secret_refs``) remembers the
value here. Before a result, an error, a progress message or a log line leaves the process —
to the store, a Celery message, Redis, a log file, Flower — every remembered value in it is
replaced by ``***``, as CI systems mask their secrets. Values shorter than ``MIN_MASKED_CHARS``
are refused by the vault instead: masking "ab" would shred every text.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

MASK = "***"
MIN_MASKED_CHARS = 4

_lock = threading.Lock()
# Longest first, sorted once when a value is added (mask runs on every result): a secret
# that contains another is masked whole.
_values: tuple[str, ...] = ()


def remember(value: str) -> None:
    """Mask ``value`` from now on in this process."""
    global _values
    if len(value) < MIN_MASKED_CHARS or value in _values:
        return
    with _lock:
        _values = tuple(sorted({*_values, value}, key=len, reverse=True))


def forget_all() -> None:
    """For tests: a fresh process remembers nothing."""
    global _values
    with _lock:
        _values = ()


def mask(text: str) -> str:
    for value in _values:
        if value in text:
            text = text.replace(value, MASK)
    return text


def mask_data(data: Any) -> Any:
    """``data`` (JSON-like) with every string masked; the same object when nothing changes."""
    if not _values:
        return data
    if isinstance(data, str):
        return mask(data)
    if isinstance(data, dict):
        return {mask(k) if isinstance(k, str) else k: mask_data(v) for k, v in data.items()}
    if isinstance(data, list):
        return [mask_data(v) for v in data]
    if isinstance(data, tuple):
        return tuple(mask_data(v) for v in data)
    return data


def active() -> bool:
    return bool(_values)


class _MaskedRecords:
    """A log record factory that masks each record's message and exception text as it is made:
    every logger and handler of the process sees only the masked record."""

    def __init__(self, factory: Any) -> None:
        self.factory = factory

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record: logging.LogRecord = self.factory(*args, **kwargs)
        if not _values:
            return record
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is the handler's to report
            return record
        record.msg, record.args = mask(message), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = mask(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return record


def mask_logs() -> None:
    """Install the masking record factory in this process (idempotent)."""
    current = logging.getLogRecordFactory()
    if not isinstance(current, _MaskedRecords):
        logging.setLogRecordFactory(_MaskedRecords(current))


__all__ = ["MASK", "MIN_MASKED_CHARS", "active", "forget_all", "mask", "mask_data", "mask_logs", "remember"]
