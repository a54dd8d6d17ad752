"""Secret values never leave a process in clear (layer: workers; issues 12 item 3, 20 item 5).

A process that resolves a ``${vault:NAME}`` reference (``workers.secret_refs``) remembers the
value here. Before a result, an error, a progress message or a log line leaves the process —
to the store, a Celery message, Redis, a log file, Flower — every stretch of it that shows a
remembered secret is replaced by ``***``, as CI systems mask their secrets.

A server that echoes its token cut by one character, reversed or encoded must not get it out
either, so what is masked is any run of ``WINDOW`` (12) characters of any form of a secret
(``workers.secret_forms``): the value, reversed, hex (lower and upper case), and base64
(standard and url-safe, with or without padding, at each of the three byte alignments it
can have inside a longer encoded blob). A form shorter than 12 characters — a secret under
12 characters — is masked only whole (its base64 and hex forms only from 8 characters, so
that short ones do not shred every blob); a part of such a secret is not caught, so real
secrets should have 12+ characters. Values shorter than ``MIN_MASKED_CHARS`` are refused by
the vault: masking "ab" would shred every text.

All the runs of all the secrets go into one Aho-Corasick automaton (``pyahocorasick``, C),
rebuilt when a secret is added: one pass over a text finds every run, whatever the number
of secrets (about 40 ms for a 1 MB result and 20 secrets of 40 characters).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import ahocorasick

from workers.secret_forms import MIN_MASKED_CHARS, WINDOW, masked_runs

MASK = "***"

_lock = threading.Lock()
_values: frozenset[str] = frozenset()
# Every run to mask, its length as the value; None when nothing is remembered. Replaced
# whole (never changed in place) so that a thread scanning the old one is not disturbed.
_automaton: Any = None


def remember(value: str) -> None:
    """Mask ``value`` (and its forms) from now on in this process."""
    global _values, _automaton
    if len(value) < MIN_MASKED_CHARS or value in _values:
        return
    with _lock:
        values = _values | {value}
        automaton = ahocorasick.Automaton()
        for run in set().union(*(masked_runs(v) for v in values)):
            automaton.add_word(run, len(run))
        automaton.make_automaton()
        _values, _automaton = values, automaton


def forget_all() -> None:
    """For tests: a fresh process remembers nothing."""
    global _values, _automaton
    with _lock:
        _values, _automaton = frozenset(), None


def mask(text: str) -> str:
    automaton = _automaton
    if automaton is None or len(text) < MIN_MASKED_CHARS:
        return text
    # Each hit is (index of its last character, its length); overlapping or touching hits
    # (a secret longer than one run matches many runs) become one ***.
    spans = sorted((end + 1 - length, end + 1) for end, length in automaton.iter(text))
    if not spans:
        return text
    pieces: list[str] = []
    done = 0
    start, stop = spans[0]
    for begin, end in spans[1:]:
        if begin <= stop:
            stop = max(stop, end)
            continue
        pieces += [text[done:start], MASK]
        done, (start, stop) = stop, (begin, end)
    pieces += [text[done:start], MASK, text[stop:]]
    return "".join(pieces)


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


__all__ = [
    "MASK",
    "MIN_MASKED_CHARS",
    "WINDOW",
    "active",
    "forget_all",
    "mask",
    "mask_data",
    "mask_logs",
    "remember",
]
