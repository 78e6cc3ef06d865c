"""One MCP request and its answer as a persisted line (`ToolCallRecord`), and the sinks that keep them.

A record is one JSON-RPC request seen by an MCP proxy, paired with its response: `tools/call`,
`tools/list`, `resources/read`, `prompts/get`, or a request the server sent the client (sampling,
elicitation, roots). The line carries `schema_version` and `record` (always `"mcp_request"`), so
a store can keep these lines beside model calls and a tolerant reader can skip what it does not
know. Its fields, all null when unknown:

- identity: `call_id` (unique per record), `session_id` (one proxied session), `transport`,
  `direction` (`client_to_server` when the client asked), `method`, `jsonrpc_id`, `rollout_id`;
- `protocol` (`era`: `handshake` or `stateless`, `version`), `client` and `server` (name, version);
- `name` (tool or prompt name, resource URI), `arguments` (kept whole up to a bound, else null
  with `arguments_truncated`), `arguments_bytes`;
- timing as the proxy saw it: `started_at`, `completed_at` (Unix seconds), `duration_ms`;
- outcome: `status` (`completed`, `failed`, `cancelled`, `incomplete`, `input_required`,
  `unknown`), `is_error` (a tool's own `isError`), `error` (`category`, `code`, `message`),
  `result_type`, `result` (bounded content with its full sizes: see `summarize_result`);
- `retry` (stateless protocol: `of`, `original`, `round`, `linked_by`) links a retried request to
  the leg that asked for input; `input` holds digests of what the client supplied (an elicited
  value is only ever a keyed digest, never the value: see `digest`);
- `http` (status, response mode, a digest of the session id): no header value is ever recorded.

`ng_trajectory`'s tool attempts need status, timing, arguments and result size: all here.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import os
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson

from ..errors import LlmtapError, UnsafeCaptureFileError
from ..store.durable import open_for_append, sync_data, sync_directory, write_all

__all__ = [
    "RECORD_KIND",
    "SCHEMA_VERSION",
    "CountingToolCallSink",
    "FanOutToolCallSink",
    "JsonlToolCallSink",
    "ToolCallRecord",
    "ToolCallRecordError",
    "ToolCallSink",
    "ToolCallSinkError",
    "bounded_json",
    "digest",
    "new_call_id",
    "parse_tool_call_line",
    "summarize_result",
]

SCHEMA_VERSION = 1
RECORD_KIND = "mcp_request"

# How much of a result's content, and of a request's arguments, a record keeps (serialized bytes).
DEFAULT_CONTENT_BUDGET = 64 * 1024
DEFAULT_ARGUMENTS_BUDGET = 16 * 1024
ERROR_MESSAGE_CHARS = 1000


class ToolCallRecordError(LlmtapError, ValueError):
    """Raised by `parse_tool_call_line` when a line is not a tool-call record this version can read."""


class ToolCallSinkError(LlmtapError):
    """Raised when a tool-call record file cannot be opened: a link, not a regular file, or unwritable."""


def new_call_id() -> str:
    """Return a fresh record id (`tc_` and 32 hex digits)."""
    return f"tc_{uuid.uuid4().hex}"


def digest(value: object, key: bytes | None = None) -> str:
    """Return `sha256:<hex>` of a JSON value in canonical form (sorted keys), or of bytes/str as given.

    With `key`, an HMAC-SHA256 under it (`hmac-sha256:<hex>`): what a record keeps of a value a
    person typed (an elicited answer), so a short value cannot be recovered by hashing guesses.
    Digests under one session's key compare equal for equal values; the key is never written.
    """
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
    else:
        data = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    if key is not None:
        return "hmac-sha256:" + hmac.new(key, data, hashlib.sha256).hexdigest()
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _size(value: object) -> int:
    return len(orjson.dumps(value))


def bounded_json(value: Any, budget: int) -> tuple[Any, int, bool]:
    """Return `(kept, full_size, truncated)`: `value` itself if its JSON fits `budget` bytes, else None."""
    try:
        size = _size(value)
    except (TypeError, orjson.JSONEncodeError):
        return None, 0, True
    if size <= budget:
        return value, size, False
    return None, size, True


def _bounded_items(items: list[Any], budget: int) -> tuple[list[Any], bool]:
    """Keep content items in order while they fit; the first that does not is cut (text) or dropped.

    A cut text item keeps a prefix of its text and says `"llmtap_truncated": true` with the text's
    full length, so a reader knows it holds part of the result, never all of it.
    """
    kept: list[Any] = []
    used = 2
    for item in items:
        size = _size(item) + 1
        if used + size <= budget:
            kept.append(item)
            used += size
            continue
        if isinstance(item, dict) and isinstance(item.get("text"), str):
            room = budget - used - _size({**item, "text": ""}) - 64
            if room > 0:
                text: str = item["text"]
                cut = text.encode("utf-8", "surrogatepass")[:room].decode("utf-8", "ignore")
                kept.append({**item, "text": cut, "llmtap_truncated": True, "llmtap_text_chars": len(text)})
        return kept, True
    return kept, False


def summarize_result(method: str, result: Any, *, budget: int = DEFAULT_CONTENT_BUDGET) -> dict[str, Any]:
    """Return the bounded part of a result a record keeps, with the full sizes.

    `tools/call` keeps `content` (items while they fit `budget`, then `content_truncated`),
    `structured_content` when it still fits, `content_items` and `content_bytes`; `resources/read`
    keeps `contents` likewise; `prompts/get` keeps `messages`; `tools/list` keeps tool names only.
    Every summary has `result_bytes`, the size of the whole result as serialized JSON.
    """
    if not isinstance(result, dict):
        return {"result_bytes": _size(result)}
    summary: dict[str, Any] = {"result_bytes": _size(result)}
    list_key = {"tools/call": "content", "resources/read": "contents", "prompts/get": "messages"}.get(method)
    if list_key is not None and isinstance(result.get(list_key), list):
        items: list[Any] = result[list_key]
        kept, truncated = _bounded_items(items, budget)
        summary[list_key] = kept
        summary[f"{list_key}_items"] = len(items)
        summary[f"{list_key}_bytes"] = _size(items)
        summary[f"{list_key}_truncated"] = truncated
        structured = result.get("structuredContent")
        if structured is not None:
            left = budget - _size(kept)
            value, size, cut = bounded_json(structured, max(left, 0))
            summary["structured_content"] = value
            summary["structured_content_bytes"] = size
            summary["structured_content_truncated"] = cut
    elif method == "tools/list" and isinstance(result.get("tools"), list):
        names = [tool.get("name") for tool in result["tools"] if isinstance(tool, dict)]
        summary["tools"] = [name for name in names if isinstance(name, str)][:1000]
        summary["tool_count"] = len(result["tools"])
    if isinstance(result.get("nextCursor"), str):
        summary["has_next_cursor"] = True
    return summary


@dataclass(slots=True)
class ToolCallRecord:
    """One proxied MCP request and its outcome; `to_line` gives the persisted JSON line."""

    call_id: str
    session_id: str
    transport: str
    direction: str
    method: str
    jsonrpc_id: int | str | None
    started_at: float
    status: str = "incomplete"
    completed_at: float | None = None
    duration_ms: float | None = None
    rollout_id: str | None = None
    protocol: dict[str, Any] = field(default_factory=dict)
    client: dict[str, Any] | None = None
    server: dict[str, Any] | None = None
    name: str | None = None
    arguments: Any = None
    arguments_bytes: int | None = None
    arguments_truncated: bool = False
    request_bytes: int | None = None
    response_bytes: int | None = None
    is_error: bool | None = None
    error: dict[str, Any] | None = None
    result_type: str | None = None
    result: dict[str, Any] | None = None
    retry: dict[str, Any] | None = None
    input: dict[str, Any] | None = None
    http: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as the JSON object of its line (schema version and kind first)."""
        return {"schema_version": SCHEMA_VERSION, "record": RECORD_KIND, **asdict(self)}

    def to_line(self) -> bytes:
        """The record as one newline-terminated JSON line."""
        return orjson.dumps(self.to_dict()) + b"\n"


_FIELDS = frozenset(ToolCallRecord.__slots__)
_REQUIRED = ("call_id", "session_id", "transport", "direction", "method", "started_at")


def parse_tool_call_line(line: bytes | str | Mapping[str, Any]) -> ToolCallRecord:
    """Read one persisted line back; unknown keys (a newer writer's) are ignored, not an error.

    Raises ToolCallRecordError for a line that is not JSON, not a record, or from a newer schema.
    """
    try:
        data = dict(line) if isinstance(line, Mapping) else orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise ToolCallRecordError("A tool-call line is not valid JSON: skip it or read tolerantly.") from exc
    if not isinstance(data, dict) or data.get("record") != RECORD_KIND:
        raise ToolCallRecordError(f"A line is not a tool-call record (its 'record' is not {RECORD_KIND!r}).")
    version = data.get("schema_version")
    if not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        raise ToolCallRecordError(
            f"A tool-call record has schema_version {version!r}; this llmtap reads 1 to {SCHEMA_VERSION}: upgrade it."
        )
    missing = [key for key in _REQUIRED if data.get(key) is None]
    if missing:
        raise ToolCallRecordError(f"A tool-call record lacks {', '.join(missing)}.")
    return ToolCallRecord(**{key: value for key, value in data.items() if key in _FIELDS})


class ToolCallSink(Protocol):
    """Where finished records go. `write` returns once they are durable, or raises; it may block."""

    def write(self, records: Sequence[ToolCallRecord]) -> None: ...

    def close(self) -> None: ...


class CountingToolCallSink:
    """A sink that keeps nothing and counts what it was given (no `--record` file configured)."""

    def __init__(self) -> None:
        self.count = 0

    def write(self, records: Sequence[ToolCallRecord]) -> None:
        self.count += len(records)

    def close(self) -> None:
        return None


class FanOutToolCallSink:
    """A sink that writes every batch to several sinks in turn (a file and a capsule, say); the first failure raises."""

    def __init__(self, sinks: Sequence[ToolCallSink]) -> None:
        self.sinks = list(sinks)

    def write(self, records: Sequence[ToolCallRecord]) -> None:
        failure: BaseException | None = None
        for sink in self.sinks:
            try:
                sink.write(records)
            except Exception as exc:  # the others still get the batch
                failure = failure or exc
        if failure is not None:
            raise failure

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


class JsonlToolCallSink:
    """Appends records to a JSONL file: one write per batch, under a lock, fsynced before returning.

    The file is opened once (O_NOFOLLOW, O_NONBLOCK, then checked to be a regular file with one
    link), so a link or FIFO put in its place is refused, and a later swap of the name does not
    redirect records. Several proxies may share one file: each batch is appended under `flock`,
    and a torn last line (a crashed writer's) is ended with a newline before new lines land.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.count = 0
        self._lock = threading.Lock()
        self._fd: int | None = None

    def open(self) -> None:
        """Open (creating) the file now, so a bad path is reported before the session starts."""
        with self._lock:
            self._open_locked()

    def _open_locked(self) -> int:
        if self._fd is None:
            try:
                existed = self.path.exists()
                self._fd = open_for_append(str(self.path))
            except (OSError, UnsafeCaptureFileError) as exc:
                raise ToolCallSinkError(
                    f"Could not open the tool-call record file {str(self.path)!r} ({type(exc).__name__}): "
                    "check that its directory exists and that it is not a link."
                ) from exc
            if not existed:
                sync_directory(self.path.parent)
        return self._fd

    def write(self, records: Sequence[ToolCallRecord]) -> None:
        """Append `records` as lines and fsync them; raises OSError or ToolCallSinkError on failure."""
        if not records:
            return
        payload = b"".join(record.to_line() for record in records)
        with self._lock:
            fd = self._open_locked()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    payload = b"\n" + payload
                write_all(fd, payload)
                sync_data(fd)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            self.count += len(records)

    def close(self) -> None:
        """Close the file; idempotent."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
