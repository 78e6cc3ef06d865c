"""ULIDs for run ids: 48 bits of milliseconds then 80 random bits, in Crockford base32.

Sortable by creation time as plain strings, so `ls .llmtap/runs` lists runs in order. Within one
millisecond in one process the random part is incremented instead of redrawn, so ids made in a
tight loop still sort in creation order.
"""

from __future__ import annotations

import os
import time
from _thread import allocate_lock  # `threading` and `re` cost milliseconds on `llmtap run`'s start-up path

__all__ = ["is_ulid", "new_ulid", "ulid_time"]

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_CHARACTERS = frozenset(_ALPHABET)
_lock = allocate_lock()
_last = (0, 0)


def _encode(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_ulid(now_ms: int | None = None) -> str:
    """Return a new ULID string (26 characters); `now_ms` pins the time part (no ordering guarantee then)."""
    global _last
    if now_ms is not None:
        return _encode(now_ms, 10) + _encode(int.from_bytes(os.urandom(10), "big"), 16)
    millis = int(time.time() * 1000)
    with _lock:
        last_ms, last_random = _last
        if millis <= last_ms:
            millis, random_part = last_ms, (last_random + 1) & ((1 << 80) - 1)
        else:
            random_part = int.from_bytes(os.urandom(10), "big")
        _last = (millis, random_part)
    return _encode(millis, 10) + _encode(random_part, 16)


def is_ulid(text: str) -> bool:
    """True for 26 Crockford base32 characters (upper case) whose time part fits 48 bits."""
    return len(text) == 26 and "0" <= text[0] <= "7" and _CHARACTERS.issuperset(text)


def ulid_time(ulid: str) -> float:
    """Return the creation time (Unix seconds) a ULID carries; ValueError for anything else."""
    if not is_ulid(ulid):
        raise ValueError(f"{ulid!r} is not a ULID: expected 26 Crockford base32 characters.")
    value = 0
    for char in ulid[:10]:
        value = value * 32 + _ALPHABET.index(char)
    return value / 1000.0
