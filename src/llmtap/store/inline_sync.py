"""The inline-sync gate: when an awaited append may fdatasync on the event loop itself."""

from __future__ import annotations

import time

__all__ = ["InlineSyncGate"]


class InlineSyncGate:
    """Whether an append may fdatasync on the event loop itself instead of handing the sync off.

    Only for a caller that says nothing else is in flight (nobody waits behind the loop then,
    and the hand-off to a helper and back costs two process wake-ups, more than a fast disk's
    sync), and only while this disk's syncs stay fast: once their moving average passes
    `SLOW_SECONDS` the helper takes them again, and the loop tries one again after
    `RETRY_SECONDS`.
    """

    SLOW_SECONDS = 0.002
    RETRY_SECONDS = 1.0

    def __init__(self) -> None:
        self._average = 0.0
        self._retry_at = 0.0

    def allows(self) -> bool:
        return self._average < self.SLOW_SECONDS or time.monotonic() >= self._retry_at

    def took(self, seconds: float) -> None:
        self._average += (seconds - self._average) * 0.2
        if self._average >= self.SLOW_SECONDS:
            self._retry_at = time.monotonic() + self.RETRY_SECONDS
