"""fdatasync in a helper process, acknowledged through the event loop's own selector.

The capture store's awaited appends write their lines on the loop and leave the fdatasync to this
helper (`_sync_worker`, standard library only, so it starts in milliseconds); see
`_helper_process` for why a process and not a thread. When it cannot take a job the store syncs
on its own threads.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from llmtap._helper_process import HelperProcess, SyncResults
from llmtap._sync_worker import NEW_FILE, REQUEST

__all__ = ["SyncOffload"]

T = TypeVar("T")
_WORKER = str(Path(__file__).with_name("_sync_worker.py"))


class SyncOffload(HelperProcess[T]):
    """The sync helper of one store: `on_synced(results)` gets 0 (durable), an errno, or None (not known durable)."""

    def __init__(self, on_synced: Callable[[SyncResults[T]], None], *, enabled: bool = True) -> None:
        super().__init__(
            [sys.executable, "-I", "-S", _WORKER],
            on_synced,
            enabled=enabled and bool(sys.executable),
            description="The capture store's sync helper",
            fallback="appends from event loops now sync on helper threads",
        )

    def submit_sync(self, token: T, path: str, inode: tuple[int, int], new_file: bool) -> bool:
        """Ask the helper to sync `path` (which must still be `inode`); False to sync it another way."""
        encoded = os.fsencode(path)
        flags = NEW_FILE if new_file else 0
        return self.submit(
            token, lambda job_id: (REQUEST.pack(job_id, inode[0], inode[1], len(encoded), flags), encoded)
        )
