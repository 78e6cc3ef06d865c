"""Hand tool-call records to a run capsule: one spool frame each, which the run's recorder appends to `tool-calls.jsonl`.

Under `llmtap run` every process of the workload (an `llmtap mcp-proxy` an agent starts as its
MCP server, or an agent whose `mcp` SDK the zero-code hook records) spools its records into the
capsule's `internal/spool/` like its model calls (`spool.frame.KIND_TOOL_CALL`): one `writev`, no
lock, no fsync; the page cache keeps the frame when the process is killed, and the run's
recorder appends the line at its next pass or at finalisation.

`capsule_root_from_environment` says which capsule a process is running under, if any.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import LlmtapError
from ..spool.frame import KIND_TOOL_CALL, encode_frame, encode_meta
from ..spool.writer import SpoolWriter, spool_directory

if TYPE_CHECKING:
    from .records import ToolCallRecord

__all__ = ["CapsuleToolCallSink", "CapsuleToolCallSinkError", "capsule_root_from_environment"]

CAPSULE_ENV = "LLMTAP_RUN_CAPSULE"  # set by `llmtap run` for its workload (hooks.bootstrap)


class CapsuleToolCallSinkError(LlmtapError):
    """Raised when a directory given as a capsule is not one: no `capsule.json` or no `internal/` folder."""


def capsule_root_from_environment() -> Path | None:
    """The capsule of the `llmtap run` this process runs under, or None."""
    root = os.environ.get(CAPSULE_ENV)
    return Path(root) if root else None


class CapsuleToolCallSink:
    """A `ToolCallSink` that spools each record into a capsule, for its run's recorder to append."""

    def __init__(self, capsule_root: str | os.PathLike[str]) -> None:
        self.root = Path(capsule_root)
        self.count = 0
        self._writer: SpoolWriter | None = None

    def open(self) -> None:
        """Check that the directory is a capsule (so a wrong `--capsule` is reported before the session)."""
        internal = self.root / "internal"
        if not (self.root / "capsule.json").is_file() or internal.is_symlink() or not internal.is_dir():
            raise CapsuleToolCallSinkError(
                f"'{self.root}' is not a run capsule (no capsule.json and internal/ folder): "
                "give the directory `llmtap run` created, e.g. .llmtap/runs/<run id>."
            )
        self._writer = SpoolWriter(spool_directory(self.root))

    def write(self, records: Sequence[ToolCallRecord]) -> None:
        """Spool each record as one frame; raises OSError when the spool file cannot be written."""
        writer = self._writer
        if writer is None:
            writer = self._writer = SpoolWriter(spool_directory(self.root))
        for record in records:
            writer.write(encode_frame(KIND_TOOL_CALL, encode_meta(record.to_dict())))
            self.count += 1

    def close(self) -> None:
        return None
