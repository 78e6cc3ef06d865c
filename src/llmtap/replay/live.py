"""The process-wide replayer: answers each captured model call from a recording instead of sending it.

`llmtap replay` (and the pytest plugin) start the workload with the capture hooks and set
`LLMTAP_REPLAY_SOURCE` to the recording; the bootstrap then calls `start_from_environment`, and
every hooked HTTP library asks `replay_answer(call)` before it would send a model call:

- a recorded call matches: its `RecordedAnswer` (the library builds its own response from it);
- no recorded call matches, `on_miss="error"` (the default): `ReplayMissError` is raised, naming
  the closest recorded call and the differing fields;
- no match, `on_miss="passthrough"`: None, and the call goes to the real endpoint (and is
  captured like any other call).

Why `ReplayMissError` is not the library's transport error: the SDKs retry transport errors
(openai's `request_exceptions()`, httpx `RequestError`) and wrap them as a connection error, so
a miss dressed as one would be retried and reported as a network failure. Raised as itself, the
openai SDK lets it through unchanged; the anthropic SDK, which retries any exception, re-asks the
recording (the same miss, no network) and raises `APIConnectionError` whose cause is the miss.
Either way every miss is written to the replay's event file, and `llmtap replay` exits non-zero.

Each served call, miss and passthrough goes to `<capsule>/internal/replay-events.jsonl` (one
line per event, appended with one write) so the recorder can write the replay report.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson

from ..errors import LlmtapError
from .answers import RecordedAnswer, answer_from_line
from .matching import Miss, RecordedCall, RecordingIndex

if TYPE_CHECKING:
    from ..hooks.call import CapturedCall
    from .intervention import Override

__all__ = [
    "EVENTS_NAME",
    "REPLAY_ENV",
    "OnMiss",
    "ReplayMissError",
    "Replayer",
    "active_replayer",
    "replay_answer",
    "replaced_tool_result",
    "set_replayer",
    "start_from_environment",
]

REPLAY_ENV = "LLMTAP_REPLAY_SOURCE"
SPEED_ENV = "LLMTAP_REPLAY_SPEED"
ON_MISS_ENV = "LLMTAP_REPLAY_ON_MISS"
OVERRIDE_ENV = "LLMTAP_REPLAY_OVERRIDE"  # an intervention file (see `intervention`)
EVENTS_NAME = "replay-events.jsonl"
OnMiss = Literal["error", "passthrough"]

_replayer: Replayer | None = None


class ReplayMissError(LlmtapError):
    """Raised into the workload when a model call it makes has no recorded call left to answer it."""

    def __init__(self, miss: Miss) -> None:
        self.miss = miss
        super().__init__(f"llmtap replay: this model call is not in the recording.\n{miss.describe()}")


class Replayer:
    """Answers model calls from one recording; thread-safe (the index serves each recorded call once)."""

    def __init__(
        self,
        index: RecordingIndex,
        *,
        speed: float = 0.0,
        on_miss: OnMiss = "error",
        events_path: str | os.PathLike[str] | None = None,
        override: Override | None = None,
    ) -> None:
        from .intervention import ToolResultOverride

        self.index = index
        self.speed = speed
        self.on_miss: OnMiss = on_miss
        self.events_path = Path(events_path) if events_path is not None else None
        self.tool_override = override if isinstance(override, ToolResultOverride) else None
        self.override = None if isinstance(override, ToolResultOverride) else override
        self.misses: list[Miss] = []
        self.served = 0
        self._tool_calls_seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def install_guard(self, registry: Any = None) -> Any:
        """Refuse connections to the registry's model APIs and the recording's servers while this replayer answers."""
        from .guard import install_guard

        hosts = registry.named_hosts() if registry is not None else None
        lines = [call.line for call in self.index]

        def refused(host: str, port: Any) -> None:
            self._event({"event": "network_refused", "host": str(host), "port": port if isinstance(port, int) else None})

        return install_guard(hosts, lines, refused)

    def answer(self, rollout_id: str, path: str, body: bytes | None) -> RecordedAnswer | None:
        """Return the recorded answer for a request, None to send it live (passthrough), or raise `ReplayMissError`."""
        from ..dialects.projection import endpoint_for_path

        request: dict[str, Any] | None = None
        raw: str | None = None
        if body:
            try:
                parsed = orjson.loads(body)
            except orjson.JSONDecodeError:
                parsed = None
            if isinstance(parsed, dict):
                request = parsed
            else:
                raw = body.decode("utf-8", "replace")
        found = self.index.match(rollout_id, request, endpoint=endpoint_for_path(path), raw=raw)
        if isinstance(found, Miss):
            with self._lock:
                self.misses.append(found)
            self._event({"event": "miss", **found.to_dict()})
            if self.on_miss == "passthrough":
                self._event({"event": "passthrough", "rollout_id": rollout_id})
                return None
            raise ReplayMissError(found)
        with self._lock:
            self.served += 1
        return self._answer_for(found)

    def _answer_for(self, found: RecordedCall) -> RecordedAnswer:
        line = found.line
        replaced = False
        if self.override is not None and (found.rollout_id, found.call_index) == self.override[:2]:
            line = {**(line or {}), **self.override[2]}
            replaced = True
        answer = answer_from_line(line, speed=self.speed)
        self._event(
            {
                "event": "served",
                "rollout_id": found.rollout_id,
                "call_index": found.call_index,
                "replaced": replaced,
                "exact_bytes": answer.exact,
            }
        )
        return answer

    def tool_result(self, tool: str) -> dict[str, Any] | None:
        """The result that replaces this MCP tool call's (as `CallToolResult` JSON), or None to call the server.

        Counts each tool's calls in this process, so the intervention's `occurrence` picks one.
        """
        override = self.tool_override
        if override is None or tool != override.tool:
            return None
        with self._lock:
            occurrence = self._tool_calls_seen.get(tool, 0)
            self._tool_calls_seen[tool] = occurrence + 1
        if occurrence != override.occurrence:
            return None
        self._event({"event": "tool_result_replaced", "tool": tool, "occurrence": occurrence})
        return override.result

    def _event(self, event: dict[str, Any]) -> None:
        """Append one event line (best effort: a replay report with a gap beats a failed workload)."""
        if self.events_path is None:
            return
        try:
            fd = os.open(self.events_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError:
            return
        try:
            os.write(fd, orjson.dumps({**event, "pid": os.getpid()}) + b"\n")
        except OSError:
            pass
        finally:
            os.close(fd)


def set_replayer(replayer: Replayer | None) -> None:
    """Make `replayer` answer this process's model calls (None: send them as usual)."""
    global _replayer
    _replayer = replayer


def active_replayer() -> Replayer | None:
    return _replayer


def replay_answer(call: CapturedCall) -> RecordedAnswer | None:
    """The hooks' question: the recorded answer for this captured call, None to send it, or `ReplayMissError`."""
    replayer = _replayer
    if replayer is None:
        return None
    exchange = call.exchange
    return replayer.answer(exchange.rollout_id or "default", exchange.path, exchange.request_body)


def replaced_tool_result(tool: Any) -> Any:
    """The MCP hook's question: an `mcp.types.CallToolResult` that answers this `tools/call` instead
    of the server (an intervention replay), or None to send it. Raises `InterventionError` when the
    file's result is not one the SDK accepts."""
    replayer = _replayer
    if replayer is None or replayer.tool_override is None or not isinstance(tool, str):
        return None
    result = replayer.tool_result(tool)
    if result is None:
        return None
    from mcp import types

    from .intervention import InterventionError

    try:
        return types.CallToolResult.model_validate(result)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise InterventionError(
            f"The intervention's result for tool {tool!r} is not an MCP CallToolResult: {exc}"
        ) from exc


def _override_from(path: str) -> Override | None:
    from .intervention import load_override

    return load_override(Path(path))


def start_from_environment(capsule: str | os.PathLike[str], registry: Any = None) -> Replayer | None:
    """In a workload started by `llmtap replay`: load the recording named by `LLMTAP_REPLAY_SOURCE` and answer from it.

    With `on_miss="error"` the network guard goes in too, over `registry`'s named hosts and the
    hosts the recording's calls went to.
    """
    source = os.environ.get(REPLAY_ENV)
    if not source:
        return None
    try:
        speed = max(0.0, float(os.environ.get(SPEED_ENV, "0") or 0))
    except ValueError:
        speed = 0.0
    on_miss: OnMiss = "passthrough" if os.environ.get(ON_MISS_ENV) == "passthrough" else "error"
    override_path = os.environ.get(OVERRIDE_ENV)
    replayer = Replayer(
        RecordingIndex.from_path(source),
        speed=speed,
        on_miss=on_miss,
        events_path=Path(capsule) / "internal" / EVENTS_NAME,
        override=_override_from(override_path) if override_path else None,
    )
    set_replayer(replayer)
    if on_miss == "error":
        replayer.install_guard(registry)
    return replayer
