"""Reading a rollout's files without a lock: its lines, marker and late writes, and the directory's rollouts.

Lines land whole, by one `write()`. An unterminated last segment (a write in progress, or a
crashed writer) is reported as `torn_tail` and not counted, unless it is a whole JSON object,
which is a record (see `scan`); the next committer ends it with a newline first, so it becomes
one line and the new record stays intact. Blank lines are
skipped and take no `call_index`; damaged lines take one, so they never shift the others.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from llmtap.correlation.ids import rollout_file_stem, rollout_id_from_file_stem, validate_rollout_id
from llmtap.errors import CaptureRecordError, StoreError, UnsafeCaptureFileError
from llmtap.store.durable import open_regular
from llmtap.store.layout import DATA_SUFFIX, LATE_SUFFIX, MARKER_SUFFIX, _describe
from llmtap.store.markers import MarkersAndFence
from llmtap.store.results import ReadResult
from llmtap.store.scan import is_torn, scan_lines

__all__ = ["CaptureReads"]


class CaptureReads(MarkersAndFence):
    """CaptureStore's reads: `read`, `rollouts` and `size_of`, lock-free."""

    def rollouts(self) -> list[str]:
        """Return the sorted ids that have a data file or an incomplete marker."""
        if self._dir_fd < 0:
            return []
        try:
            names = os.listdir(self._dir_fd)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(
                f"Could not list the capture directory '{self.root}' ({_describe(exc)}); check that it is readable."
            ) from exc
        found: set[str] = set()
        for name in names:
            for suffix in (DATA_SUFFIX, MARKER_SUFFIX):
                rollout_id = rollout_id_from_file_stem(name[: -len(suffix)]) if name.endswith(suffix) else None
                if rollout_id is not None:
                    found.add(rollout_id)
        return sorted(found)

    def size_of(self, rollout_id: str) -> int:
        """Return the size in bytes of a rollout's capture file (0 when it has none)."""
        name = rollout_file_stem(validate_rollout_id(rollout_id)) + DATA_SUFFIX
        if self._dir_fd < 0:
            return 0
        try:
            found = os.stat(name, dir_fd=self._dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise StoreError(
                f"Could not stat '{self.path_for(rollout_id)}' ({_describe(exc)}); check its permissions."
            ) from exc
        return found.st_size if stat.S_ISREG(found.st_mode) else 0

    def read(self, rollout_id: str, *, strict: bool = False) -> ReadResult:
        """Read a rollout's capture without locking; damaged lines are skipped and counted.

        With `strict=True`, the first damaged line raises CaptureRecordError with its 1-based
        line number instead. Neither mode treats a torn tail as damage: it may be a write in
        progress.
        """
        rollout_id = validate_rollout_id(rollout_id)
        path = self.root / f"{rollout_file_stem(rollout_id)}{DATA_SUFFIX}"
        data = self._read_bytes(rollout_file_stem(rollout_id) + DATA_SUFFIX)
        entries: list[tuple[int, dict[str, Any]]] = []
        invalid_lines: list[int] = []
        for line_number, call_index, record, problem in scan_lines(data or b""):
            if record is not None:
                entries.append((call_index, record))
            elif strict:
                raise CaptureRecordError(path, line_number, problem)
            else:
                invalid_lines.append(call_index)
        late = self._read_bytes(rollout_file_stem(rollout_id) + LATE_SUFFIX)
        marker = rollout_file_stem(rollout_id) + MARKER_SUFFIX
        marked = self._dir_fd >= 0 and os.access(marker, os.F_OK, dir_fd=self._dir_fd, follow_symlinks=False)
        return ReadResult(
            rollout_id=rollout_id,
            exists=data is not None,
            entries=entries,
            invalid_lines=invalid_lines,
            torn_tail=data is not None and is_torn(data),
            incomplete=marked,
            late_writes=sum(1 for _ in scan_lines(late or b"")),
            capture_failures=self._marker_failures(marker) if marked else 0,
        )

    def _read_bytes(self, name: str) -> bytes | None:
        """A file's bytes, None when it does not exist; StoreError (caused by UnsafeCaptureFileError)
        for a link, FIFO or other non-regular file, which is never followed or read."""
        if self._dir_fd < 0:
            return None
        try:
            fd = open_regular(name, os.O_RDONLY, dir_fd=self._dir_fd)
        except FileNotFoundError:
            return None
        except UnsafeCaptureFileError as exc:  # a StoreError like any unreadable file; the cause says why
            raise StoreError(
                f"Could not read '{self._sibling('', name)}': {exc.found} stands there, not a regular file; "
                "it was not opened. Remove it and check who else writes to the capture directory."
            ) from exc
        except OSError as exc:
            raise StoreError(f"Could not read '{self._sibling('', name)}' ({_describe(exc)}); check its permissions.") from exc
        try:
            with open(fd, "rb", closefd=False) as handle:
                return handle.read()
        except OSError as exc:
            raise StoreError(f"Could not read '{self._sibling('', name)}' ({_describe(exc)}); check its permissions.") from exc
        finally:
            os.close(fd)
