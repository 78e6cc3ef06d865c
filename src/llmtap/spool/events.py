"""The capsule's event streams the spool collector appends to: `tool-calls.jsonl` and `network_events.jsonl`.

A workload process (or an `llmtap mcp-proxy` under `llmtap run`) spools each finished tool call
and each HTTP request's network event as one frame whose metadata is the line itself
(`spool.frame.KIND_TOOL_CALL`, `KIND_NETWORK`). The collector hands those frames here; each pass
appends them in frame order, with one write and one fdatasync per file, under an flock on the
file, never through a link (the capsule's root is opened once, `O_NOFOLLOW`, and every file is
checked to be a regular file with one name). A line that is not an object with its id is
counted as a damaged frame, never written.

Each line carries its own id (`call_id` for a tool call, `event_id` for a network event), so a
finalisation run again after an interrupted one appends only the lines not already there.
"""

from __future__ import annotations

import os

from .frame import KIND_NETWORK, KIND_TOOL_CALL

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..capsule.writer import CapsulePaths

__all__ = ["NETWORK_EVENTS_FILE", "STREAMS", "TOOL_CALLS_FILE", "EventStreams", "event_from_call_frame"]

TOOL_CALLS_FILE = "tool-calls.jsonl"
NETWORK_EVENTS_FILE = "network_events.jsonl"
# frame kind -> (capsule file, the key holding each line's id)
STREAMS: dict[int, tuple[str, str]] = {KIND_TOOL_CALL: (TOOL_CALLS_FILE, "call_id"), KIND_NETWORK: (NETWORK_EVENTS_FILE, "event_id")}
_MAX_DEDUP_READ = 256 << 20


class EventStreams:
    """Lines waiting to be appended to the capsule's event files, and the ids already there."""

    def __init__(self, paths: CapsulePaths) -> None:
        self.paths = paths
        self._pending: dict[str, list[bytes]] = {}
        self._present: dict[str, set[str]] | None = None
        self.appended: dict[str, int] = {}

    def dedup_against_disk(self) -> None:
        """Skip lines whose id a file already holds (a finalisation run again after an interruption)."""
        self._present = {name: _ids_in(self.paths.root / name, key) for name, key in STREAMS.values()}

    def add(self, kind: int, meta: dict[str, Any]) -> bool:
        """Queue the line of one event frame; False when it is not a line this stream can keep."""
        import orjson

        name, key = STREAMS[kind]
        identity = meta.get(key)
        if not isinstance(identity, str) or not identity:
            return False
        if self._present is not None:
            seen = self._present[name]
            if identity in seen:
                return True
            seen.add(identity)
        try:
            line = orjson.dumps(meta) + b"\n"
        except TypeError:
            return False
        self._pending.setdefault(name, []).append(line)
        return True

    def flush(self) -> None:
        """Append what is queued; raises OSError (the caller counts the loss) and drops the queue either way."""
        pending, self._pending = self._pending, {}
        if not pending:
            return
        from ..capsule.writer import is_real_directory
        from ..store.durable import append_lines_durably

        if not is_real_directory(self.paths.root):
            raise OSError(f"'{self.paths.root}' is no longer a directory of the capsule")
        dir_fd = os.open(self.paths.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for name, lines in pending.items():
                append_lines_durably(name, dir_fd, lines, lock_file=True)
                self.appended[name] = self.appended.get(name, 0) + len(lines)
        finally:
            os.close(dir_fd)


def _ids_in(path: Any, key: str) -> set[str]:
    """The ids of the lines a stream file already holds (none when it is missing or not a plain file)."""
    import orjson

    from ..capsule.writer import read_regular_file

    try:
        data = read_regular_file(path)[:_MAX_DEDUP_READ]
    except OSError:
        return set()
    found: set[str] = set()
    for line in data.splitlines():
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict) and isinstance(value.get(key), str):
            found.add(value[key])
    return found


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def event_from_call_frame(meta: dict[str, Any], request: bytes, response: bytes, event_id: str) -> dict[str, Any]:
    """The network event of a model call, from its spool frame (`spool.frame.encode_call`'s metadata)."""
    extra = _mapping(meta.get("extra"))
    server = _mapping(extra.get("server"))
    capture = _mapping(extra.get("capture"))
    chain = _mapping(meta.get("exception")).get("chain")
    latency = meta.get("latency_s")
    port = server.get("port")
    return {
        "schema_version": 1,
        "record": "network_event",
        "event_id": event_id,
        "hook": capture.get("hook"),
        "pid": capture.get("pid"),
        "method": meta.get("method"),
        "scheme": server.get("scheme"),
        "host": server.get("address"),
        "port": port if isinstance(port, int) else None,
        "path": str(meta.get("path") or "/").split("?", 1)[0][:2048],
        "request_bytes": len(request),
        "response_bytes": len(response),
        "started_at": meta.get("started_at"),
        "duration_ms": round(latency * 1000.0, 3) if isinstance(latency, (int, float)) else None,
        "status": meta.get("status"),
        "error": chain[0].get("type") if isinstance(chain, list) and chain and isinstance(chain[0], dict) else None,
        "model_call": True,
        "provider": meta.get("provider"),
    }
