"""The per-process spool writer: how a workload process under `llmtap run` hands over its calls.

When a call ends, the process appends its frame (`spool.frame.encode_call`) to its own spool file
under the capsule's `internal/spool/`, with a single `writev` on an `O_APPEND` descriptor
(`SpoolWriter`): no thread, no lock, no fsync. The page cache keeps what was written when the
process then ends by `os._exit`, SIGTERM or SIGKILL. `SpoolSink` is the capture session's
`RecordSink` that does this; the parent turns the frames into records (`spool.collector`).

Next to its spool file, a process keeps the number of its calls in flight in
`<same name>.inflight` (8 bytes, little-endian), a file it maps into memory at its first call:
updating it is a store into memory, no system call, and the page cache keeps the last value when
the process is killed. Finalisation reports a non-zero count as calls in flight at exit
(`calls_in_flight_at_exit`): calls a killed process never finished, which leave no frame.
"""

from __future__ import annotations

import os
import struct
import sys
from typing import TYPE_CHECKING, Any, Mapping

from .frame import KIND_HEALTH, KIND_PROCESS, encode_call, encode_frame, encode_meta

if TYPE_CHECKING:
    from pathlib import Path

    from ..hooks.call import CapturedCall
    from ..hooks.session import CaptureSession

__all__ = ["IN_FLIGHT_FORMAT", "IN_FLIGHT_SUFFIX", "SPOOL_SUFFIX", "SpoolSink", "SpoolWriter", "build_frame", "spool_directory"]

SPOOL_SUFFIX = ".spool"
IN_FLIGHT_SUFFIX = ".inflight"  # replaces SPOOL_SUFFIX: the process's count of calls in flight
IN_FLIGHT_FORMAT = struct.Struct("<q")


def spool_directory(capsule_root: Path) -> Path:
    """Where the processes of a run write their spool files (in the capsule's `internal/`)."""
    return capsule_root / "internal" / "spool"


class SpoolWriter:
    """Appends frames to this process's own spool file, one `writev` each: no thread, lock or fsync.

    The file is created at the first frame, so a process that never calls a model leaves none.
    Writes raise OSError (the caller counts the loss). A short write is left as it is: the reader
    skips the torn frame and counts it, and the next frame still lands whole after it.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = os.fspath(directory)
        self._fd: int | None = None
        self._name = _spool_name()
        self._in_flight: Any = None  # the mapped `.inflight` file, once a call has started

    @property
    def path(self) -> str:
        return os.path.join(self.directory, self._name)

    def write(self, parts: list[bytes]) -> None:
        fd = self._fd
        if fd is None:
            fd = self._open()
        os.writev(fd, parts)

    def set_in_flight(self, count: int) -> None:
        """Record how many calls this process has in flight; the caller serialises the calls. Raises OSError."""
        mapped = self._in_flight
        if mapped is None:
            mapped = self._in_flight = self._map_in_flight()
        IN_FLIGHT_FORMAT.pack_into(mapped, 0, count)

    def _map_in_flight(self) -> Any:
        import mmap

        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, self._name[: -len(SPOOL_SUFFIX)] + IN_FLIGHT_SUFFIX)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, IN_FLIGHT_FORMAT.size)
            return mmap.mmap(fd, IN_FLIGHT_FORMAT.size)
        finally:
            os.close(fd)  # the mapping keeps the file

    def _open(self) -> int:
        # No lock: two threads racing here open the same name (O_APPEND keeps both whole), and
        # only the one that created the file writes the process frame.
        os.makedirs(self.directory, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags | os.O_EXCL, 0o600)
        except FileExistsError:
            fd = os.open(self.path, flags, 0o600)
        else:
            process = {"pid": os.getpid(), "argv0": sys.argv[0] if getattr(sys, "argv", None) else None}
            os.writev(fd, encode_frame(KIND_PROCESS, encode_meta(process)))
        self._fd = fd
        return fd

    def after_fork(self) -> None:
        """In a forked child: write to a file of its own from the next frame on."""
        fd, self._fd = self._fd, None
        self._name = _spool_name()
        self._in_flight = None  # the parent's mapping, shared with it: the child maps a file of its own
        if fd is not None:
            try:
                os.close(fd)  # the child's copy only; the parent keeps writing through its own
            except OSError:
                pass


def _spool_name() -> str:
    return f"{os.getpid()}-{os.urandom(4).hex()}{SPOOL_SUFFIX}"



def build_frame(call: CapturedCall) -> list[bytes]:
    """The frame of a finished call (a session's default `frame_builder`)."""
    return encode_call(
        call.exchange,
        dialect=call.match.dialect,
        request_headers=call.request_headers,
        response_headers=call.response_headers,
        body_decoded=call.body_decoded,
    )


class SpoolSink:
    """The `RecordSink` of a process under `llmtap run`: each finished call becomes one spool frame.

    Nothing is parsed here: the frame is written before the call returns, and the recorder builds
    the record. This process counts no call itself (the recorder counts each from its frame); what
    went wrong here, and the calls that will leave no frame, are reported as count frames in the
    same file. Never raises (see `hooks.sinks.RecordSink`).
    """

    def __init__(self, session: CaptureSession, writer: SpoolWriter) -> None:
        self.session = session
        self.writer = writer

    def call_opened(self, open_calls: int) -> None:
        """Keep the spool's in-flight count current (a store into shared memory, no system call),
        so a process killed mid-call leaves its open calls counted; the caller holds the counts lock."""
        try:
            self.writer.set_in_flight(open_calls)
        except Exception:  # best effort, like every count
            pass

    call_ended = call_opened

    def put(self, call: CapturedCall) -> None:
        session = self.session
        try:
            parts = session.frame_builder(call)
        except Exception as exc:
            session.failure("record_build_failed", call.hook, exc, call_lost=True)
            return
        try:
            self.writer.write(parts)
        except Exception as exc:
            session.failure("record_write_failed", call.hook, exc, call_lost=True)

    async def put_async(self, call: CapturedCall) -> None:
        self.put(call)  # one write to the page cache: nothing to wait for

    enqueue = put  # no lock taken: safe from a garbage collector's callback

    def mark_incomplete(self, counts: Mapping[str, int]) -> None:
        """Append count deltas to the spool file, for the recorder to add up; best effort."""
        try:
            self.writer.write(encode_frame(KIND_HEALTH, encode_meta({"counts": counts})))
        except Exception:  # the counts stay in memory; nothing else to do without raising
            pass

    def put_event(self, kind: int, event: Mapping[str, Any]) -> bool:
        """Append one event frame (a tool call, a network event): the line the recorder appends
        to the capsule's stream. False (counted by the caller) when it could not be written."""
        try:
            self.writer.write(encode_frame(kind, encode_meta(event)))
        except Exception:
            return False
        return True

    def flush(self, timeout: float) -> int:
        return 0  # each call's frame is written before it returns: nothing is pending

    def close(self, open_calls: int) -> None:
        if open_calls > 0:  # calls that will leave no frame
            self.mark_incomplete({"calls_open_at_close": open_calls, "calls_captured": open_calls})
            try:
                self.writer.set_in_flight(0)  # reported just now: not in flight at a kill later
            except Exception:
                pass

    def after_fork(self) -> SpoolSink:
        """A forked child writes to a spool file of its own."""
        self.writer.after_fork()
        return self
