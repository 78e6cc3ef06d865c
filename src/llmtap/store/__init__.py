"""The capture store: the only code that touches capture files.

    capture_store.py   CaptureStore: append (group-committed, durable before release), read, clear
    layout.py          the files beside each rollout, and their paths
    append_path.py     which file each line goes to, its one write and its sync
    inline_sync.py     when an awaited append may sync on the event loop itself
    markers.py         the incomplete marker and the clear() fence
    reading.py         lock-free reads of a rollout's files
    scan.py            a capture file's bytes split into lines: the one parse path
    results.py         what an append or a read returns
    rollout_files.py   each rollout's open descriptors, opened safely relative to the directory
    group_commit.py    many appends sharing one fdatasync
    sync_offload.py    fdatasync handed to a helper process, off the event loop
    sync_worker.py     that helper process
    durable.py         the one toolkit for safe opens, whole writes, fsyncs and atomic replaces
    readers.py         tolerant and strict readers: records, metrics, a rollout's calls

Files: `<rollout_id>.capture.jsonl`, append-only, one JSON object per line, with its lock,
incomplete marker, clear fence and late file beside it (see capture_store.py).
"""

from llmtap.correlation.ids import ROLLOUT_ID_PATTERN, validate_rollout_id
from llmtap.store.capture_store import CaptureStore
from llmtap.store.results import AppendResult, ReadResult

# The id check lives with correlation (it must not load the store); the store's public names
# have always included it.
__all__ = ["ROLLOUT_ID_PATTERN", "AppendResult", "CaptureStore", "ReadResult", "validate_rollout_id"]
