"""The fail-open half of a proxy: turn a copy of its traffic into records and keep them durably.

The proxies call `Recorder.observe_*` with the bytes they are about to forward and await
`persist` before forwarding them, so a call's record is on disk before the answer reaches its
asker. Nothing here raises into the proxy: a parse or pairing bug, a full disk or a stuck
filesystem is counted, said once on stderr (never with message content), and the bytes go on.
A stuck write is waited for at most `write_timeout_s`; the session does not stall behind it.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .framing import FramingStats, LineFramer, OversizedMessage, SSEFramer, decode_messages
from .pairing import Direction, Pairing
from .records import CountingToolCallSink, ToolCallRecord, ToolCallSink

__all__ = ["Recorder", "RecorderCounts"]


@dataclass(slots=True)
class RecorderCounts:
    """What one proxy run recorded and what it could not."""

    records: int = 0
    written: int = 0
    dropped: int = 0
    late: int = 0
    recorder_errors: int = 0


def _stderr(message: str) -> None:
    try:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class Recorder:
    """Frames, pairs and persists; every method is safe to call on any bytes and never raises."""

    def __init__(
        self,
        sink: ToolCallSink | None,
        *,
        write_timeout_s: float = 5.0,
        say: Callable[[str], None] = _stderr,
    ) -> None:
        self.sink: ToolCallSink = sink if sink is not None else CountingToolCallSink()
        self.keeps_records = sink is not None and not isinstance(sink, CountingToolCallSink)
        self.write_timeout_s = write_timeout_s
        self.counts = RecorderCounts()
        self.framing = FramingStats()
        self._say = say
        self._said: set[str] = set()
        self._writer = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmtap-mcp-records") if self.keeps_records else None
        )

    def notice(self, kind: str, message: str) -> None:
        """Say `message` on stderr the first time `kind` happens."""
        if kind not in self._said:
            self._said.add(kind)
            self._say(f"llmtap mcp-proxy: {message}")

    def observe_lines(
        self, framer: LineFramer, pairing: Pairing, direction: Direction, chunk: bytes
    ) -> list[ToolCallRecord]:
        """Feed a chunk of newline-delimited JSON-RPC to `framer`; return the records it finished."""
        try:
            return self._observe(framer.feed(chunk), pairing, direction)
        except Exception as exc:  # a recorder bug must not touch the session
            return self._failed(exc)

    def observe_end(self, framer: LineFramer, pairing: Pairing, direction: Direction) -> list[ToolCallRecord]:
        """The stream ended: a last unterminated line is still looked at."""
        try:
            last = framer.close()
            return self._observe([last] if last is not None else [], pairing, direction)
        except Exception as exc:
            return self._failed(exc)

    def observe_events(
        self,
        events: Sequence[str | OversizedMessage],
        pairing: Pairing,
        direction: Direction,
        route: Callable[[dict[str, object]], Pairing] | None = None,
    ) -> list[ToolCallRecord]:
        """Look at whole messages (SSE events' data, or a JSON body); `route` picks a pairing per message."""
        try:
            return self._observe(events, pairing, direction, route)
        except Exception as exc:
            return self._failed(exc)

    def observe_sse(
        self,
        framer: SSEFramer,
        chunk: bytes,
        pairing: Pairing,
        direction: Direction,
        route: Callable[[dict[str, object]], Pairing] | None = None,
    ) -> list[ToolCallRecord]:
        """Feed a chunk of an SSE response to `framer`; return the records its events finished."""
        try:
            return self._observe(framer.feed(chunk), pairing, direction, route)
        except Exception as exc:
            return self._failed(exc)

    def _observe(
        self,
        items: Sequence[bytes | str | OversizedMessage],
        pairing: Pairing,
        direction: Direction,
        route: Callable[[dict[str, object]], Pairing] | None = None,
    ) -> list[ToolCallRecord]:
        finished: list[ToolCallRecord] = []
        for item in items:
            if isinstance(item, OversizedMessage):
                self.framing.oversized += 1
                self.notice("oversized", "a message longer than the recording bound passed through; its record is cut")
                finished += pairing.observe_oversized(direction, item)
                continue
            size = len(item) if isinstance(item, bytes) else len(item.encode("utf-8", "surrogatepass"))
            before = self.framing.malformed
            messages = decode_messages(item, self.framing)
            if self.framing.malformed != before:
                self.notice("malformed", "a line that is not JSON-RPC passed through unchanged (counted)")
            share = size if len(messages) == 1 else None
            for message in messages:
                target = route(message) if route is not None else pairing
                finished += target.observe(direction, message, share if share is not None else size)
        return finished

    def _failed(self, exc: Exception) -> list[ToolCallRecord]:
        self.counts.recorder_errors += 1
        self.notice("recorder_error", f"recording failed ({type(exc).__name__}); the session goes on unrecorded")
        return []

    async def persist(self, records: Sequence[ToolCallRecord]) -> None:
        """Make `records` durable (or count them dropped); returns within `write_timeout_s`."""
        if not records:
            return
        self.counts.records += len(records)
        if self._writer is None:
            self.sink.write(records)  # counting only
            return
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._writer, self.sink.write, list(records))
            await asyncio.wait_for(asyncio.shield(future), self.write_timeout_s)
            self.counts.written += len(records)
        except TimeoutError:
            self.counts.late += len(records)
            self.notice("late", f"a record write took over {self.write_timeout_s:g} s; the answer was released first")
        except Exception as exc:
            self.counts.dropped += len(records)
            self.notice(
                "dropped", f"could not write tool-call records ({type(exc).__name__}); counted, the session goes on"
            )

    def close(self) -> None:
        """Wait for writes in flight and close the sink; never raises."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)
        try:
            self.sink.close()
        except Exception as exc:
            self.notice("close", f"closing the record file failed ({type(exc).__name__})")

    def summary(self) -> str:
        """One line for stderr at the end of a session."""
        counts = self.counts
        where = "recorded" if self.keeps_records else "counted (no --record file)"
        parts = [f"{counts.records} MCP request(s) {where}"]
        if counts.dropped:
            parts.append(f"{counts.dropped} dropped")
        if counts.late:
            parts.append(f"{counts.late} written late")
        if self.framing.malformed:
            parts.append(f"{self.framing.malformed} malformed line(s) passed through")
        if self.framing.oversized:
            parts.append(f"{self.framing.oversized} oversized message(s)")
        if counts.recorder_errors:
            parts.append(f"{counts.recorder_errors} recorder error(s)")
        return "llmtap mcp-proxy: " + ", ".join(parts)
