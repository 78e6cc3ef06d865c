"""Every error llmtap raises to its callers, under one base.

    LlmtapError
    ├── ConfigError            a configuration value is missing or invalid
    ├── CollectError           a rollout collection cannot start or go on
    ├── InvalidRolloutIdError  a rollout id fails the one id pattern (also a ValueError)
    ├── StoreError             the capture store could not be read or written
    │   ├── CaptureRecordError a persisted line is damaged (also a ValueError); keeps path and line number
    │   ├── UnsafeCaptureFileError  a capture file is a link, FIFO or other non-regular file: refused
    │   └── CaptureDirectoryError   the capture directory is missing, not a directory, or not writable
    ├── UpstreamError          the proxy's upstream gave no usable answer (llmtap.server)
    │   ├── UpstreamUnreachable     no response came back: refused, unresolvable, timed out
    │   ├── UpstreamProtocolError   the upstream's bytes are not a valid HTTP/1.1 response
    │   ├── UpstreamClosed          the connection closed mid-response (also a ConnectionError)
    │   └── UpstreamReadTimeout     no byte within the read timeout (also a TimeoutError)
    ├── TaskError              a `/run` body is not a task the demo agent can run (also a ValueError)
    └── LocalModelError        the local model server could not start (llmtap.demo.localmodel)
        └── MissingLocalModelError  its packages are not installed (also an ImportError)

Capture code never raises into the workload: it categorises, counts and logs once instead.
These errors are for readers, commands and configuration, where the caller must hear about it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "CaptureDirectoryError",
    "CaptureRecordError",
    "CollectError",
    "ConfigError",
    "InvalidRolloutIdError",
    "LlmtapError",
    "StoreError",
    "UnsafeCaptureFileError",
    "UpstreamError",
]


class LlmtapError(Exception):
    """Base of every error llmtap raises on purpose."""


class ConfigError(LlmtapError):
    """Raised when a configuration value is missing or invalid."""


class CollectError(LlmtapError):
    """Raised when a collection cannot start or go on: bad input, an unreachable agent, an unclearable store."""


class InvalidRolloutIdError(LlmtapError, ValueError):
    """Raised when a rollout id breaks the id rules of `llmtap.correlation.ids`."""

    def __init__(self, rollout_id: object, reason: str = "") -> None:
        self.rollout_id = rollout_id
        detail = f" ({reason})" if reason else ""
        super().__init__(
            f"Rollout id {rollout_id!r} is not valid{detail}: use 1 to 212 ASCII letters, digits, '.', '_' "
            "and '-' (an explicit _ng_rollout_id starting with a letter or digit)."
        )


class UpstreamError(LlmtapError):
    """Base of the errors the proxy's upstream transport raises (`llmtap.server.upstream`, `.http1`)."""


class StoreError(LlmtapError):
    """Raised when the capture store cannot be read or written."""


class CaptureRecordError(StoreError, ValueError):
    """Raised by strict readers when a persisted line is damaged.

    `line_number` is the 1-based physical line when the damage is in the JSON itself; a line that
    is valid JSON but not a capture record is named by its `call_index` instead.
    """

    def __init__(self, path: Path, line_number: int | None, reason: str, *, call_index: int | None = None) -> None:
        self.path = path
        self.line_number = line_number
        self.call_index = call_index
        self.reason = reason
        where = f"Line {line_number}" if line_number is not None else f"The line at call_index {call_index}"
        super().__init__(
            f"{where} of '{path}' is not a valid capture record: {reason}. "
            "Read it with strict=False to skip damaged lines."
        )


class UnsafeCaptureFileError(StoreError):
    """Raised when a capture file is a symbolic link, FIFO, hard link or other non-regular file.

    The store never writes or reads through such a file: another program planted it, and
    following it could change or block on something outside the capture directory.
    """

    def __init__(self, name: str, found: str) -> None:
        self.name = name
        self.found = found
        super().__init__(
            f"Refused to open capture file '{name}': it is {found}, not a regular file; "
            "remove it and check who else writes to the capture directory."
        )


class CaptureDirectoryError(StoreError):
    """Raised when the capture directory is missing, is not a directory (or is a refused link), or cannot be written."""
