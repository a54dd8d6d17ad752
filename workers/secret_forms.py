"""The strings that give a secret away (layer: workers, pure; issue 20 item 5).

One job: for one secret value, every string ``workers.masking`` must mask. A text gives the
secret away when it shows ``WINDOW`` consecutive characters of one of its *forms*:

- the value itself, and reversed, each also in upper and in lower case (a server that shouts
  the secret back, ``SK-LIVE-…``, gives it away all the same);
- its UTF-8 bytes in hex, lower and upper case;
- its UTF-8 bytes in base64, standard and url-safe alphabets, at each of the 3 alignments
  (the secret's first byte at offset 0, 1 or 2 of a 3-byte group of a longer blob). Only the
  characters fully made of the secret's bits are kept (the ones at each end also hold the
  neighbouring bytes' bits, or padding), so with or without ``=`` padding and whatever
  surrounds the secret, the encoded text contains that form.

A form shorter than ``WINDOW`` is masked whole: the value and its reverse from
``MIN_MASKED_CHARS``, an encoded form from ``MIN_ENCODED_CHARS`` (a shorter one would match
by chance in any large base64 or hex blob).
"""

from __future__ import annotations

import base64

WINDOW = 12
MIN_MASKED_CHARS = 4
MIN_ENCODED_CHARS = 8


def base64_forms(data: bytes) -> set[str]:
    """The characters of ``data``'s base64 encodings made only of ``data``'s bits, for each
    alignment and both alphabets."""
    forms: set[str] = set()
    for offset in range(3):
        framed = bytes(offset) + data
        # Character j carries bits [6j, 6j+6); the secret holds bits [8*offset, 8*len(framed)).
        first = -(-8 * offset // 6)
        last = 8 * len(framed) // 6
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            forms.add(encode(framed).decode("ascii")[first:last])
    forms.discard("")
    return forms


def forms(value: str) -> tuple[set[str], set[str]]:
    """(plain forms, encoded forms) of ``value``."""
    data = value.encode("utf-8")
    plain = {form for v in (value, value[::-1]) for form in (v, v.upper(), v.lower())}
    return plain, {data.hex(), data.hex().upper(), *base64_forms(data)}


def masked_runs(value: str) -> set[str]:
    """Every string whose presence in a text gives ``value`` away (see the module doc)."""
    plain, encoded = forms(value)
    runs: set[str] = set()
    for form in plain | encoded:
        if len(form) >= WINDOW:
            runs.update(form[i : i + WINDOW] for i in range(len(form) - WINDOW + 1))
        elif len(form) >= (MIN_MASKED_CHARS if form in plain else MIN_ENCODED_CHARS):
            runs.add(form)
    return runs


__all__ = ["MIN_ENCODED_CHARS", "MIN_MASKED_CHARS", "WINDOW", "base64_forms", "forms", "masked_runs"]
