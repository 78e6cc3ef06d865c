"""Spool files: how each process under `llmtap run` hands its finished calls to the recorder.

A workload process does no record building. When a call ends it appends one self-describing
frame (the call's metadata, then its request and response bytes; `hooks.writer.encode_call`) to
its own spool file under the capsule's `internal/spool/`, with a single `writev` on an
`O_APPEND` descriptor (`SpoolWriter`): no thread, no lock, no fsync. The page cache keeps what
was written when the process then ends by `os._exit`, SIGTERM or SIGKILL. Credential headers are
removed before the frame is built, and the frame carries no exception message, only types (which
is all a record keeps). `hooks.writer.decode_call` turns a call's frame back into its Exchange.

The `llmtap run` parent turns frames into the capsule's records with a `SpoolCollector`: live,
on a thread that polls for spool files and does its work once one appears, and at finalisation
(`drain_spool`), which drains the rest whether or not a live collector ran. Each call becomes
exactly one store line, in the order its process wrote the frames.

Frame (little-endian):

    header   32 bytes  magic "LTSP", version, kind, 2 reserved, meta length (u32),
                       request length (u64), response length (u64), CRC-32 of these 28 bytes
    meta     JSON      kind 1 (call): what `Exchange` needs; 2 (health): count deltas;
                       3 (process): pid and argv[0]
    request  bytes
    response bytes
    trailer  4 bytes   CRC-32 of meta, request and response

Next to its spool file, a process keeps the number of its calls in flight in
`<same name>.inflight` (8 bytes, little-endian), a file it maps into memory at its first call:
updating it is a store into memory, no system call, and the page cache keeps the last value when
the process is killed. Finalisation reports a non-zero count as calls in flight at exit
(`calls_in_flight_at_exit`): calls a killed process never finished, which leave no frame.

A frame cut short (a process killed in the middle of its write, a full disk) or damaged is
skipped: the reader looks for the next header, counts the loss in capture health, and never
raises. A frame still being written is left for the next pass, until the final one.
"""

from __future__ import annotations

import _thread
import os
import stat
import struct
import sys
import time
import zlib

# Only what the workload has loaded already and the recorder needs at once: the rest is imported
# where it is used (finalisation imports this module even for a run that spooled nothing).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any

    from ..exchange import Exchange
    from .writer import CapsulePaths

__all__ = [
    "FRAME_VERSION", "KIND_CALL", "KIND_HEALTH", "KIND_PROCESS", "Frame", "ScanResult", "SpoolCollector",
    "SpoolWriter", "drain_spool", "encode_frame", "encode_meta", "scan_frames", "spool_directory",
]

MAGIC = b"LTSP"
FRAME_VERSION = 1
KIND_CALL, KIND_HEALTH, KIND_PROCESS = 1, 2, 3
SPOOL_SUFFIX = ".spool"
IN_FLIGHT_SUFFIX = ".inflight"  # replaces SPOOL_SUFFIX: the process's count of calls in flight
_IN_FLIGHT = struct.Struct("<q")
KEPT_SUFFIX = ".kept"  # a drained spool file that had a problem, kept for inspection and never re-read
_HEADER = struct.Struct("<4sBBHIQQ")
_CRC = struct.Struct("<I")
HEADER_SIZE = _HEADER.size + _CRC.size
TRAILER_SIZE = _CRC.size
_MAX_META = 64 << 20
_READ_CHUNK = 8 << 20
_READ_LIMIT = 64 << 20  # bytes of frames a collector holds at once (more only for one bigger frame)
_COLLECTOR_NICENESS = 10  # how much the live collector defers to the workload and its model server


def spool_directory(capsule_root: Path) -> Path:
    """Where the processes of a run write their spool files (in the capsule's `internal/`)."""
    return capsule_root / "internal" / "spool"


# --- encoding (in the workload: cheap, stdlib only until the first frame) -------------------------

_dumps: Callable[[Any], bytes] | None = None


def _json_dumps(value: Any) -> bytes:
    import json

    return json.dumps(value, separators=(",", ":"), default=str).encode("utf-8")


def encode_meta(value: Any) -> bytes:
    """JSON bytes of `value`: orjson when this interpreter can load it (ten times faster), else json."""
    global _dumps
    dumps = _dumps
    if dumps is None:
        try:
            import orjson

            option = orjson.OPT_NON_STR_KEYS

            def dumps(value: Any) -> bytes:
                try:
                    return orjson.dumps(value, default=str, option=option)
                except TypeError:  # a lone surrogate, an integer over 64 bits: json copes
                    return _json_dumps(value)

        except ImportError:  # the workload's interpreter cannot load the recorder's orjson
            dumps = _json_dumps
        _dumps = dumps
    return dumps(value)


def encode_frame(kind: int, meta: bytes, request: bytes = b"", response: bytes = b"") -> list[bytes]:
    """The parts of one frame, to be written with a single `os.writev`."""
    head = _HEADER.pack(MAGIC, FRAME_VERSION, kind, 0, len(meta), len(request), len(response))
    crc = zlib.crc32(response, zlib.crc32(request, zlib.crc32(meta)))
    return [head + _CRC.pack(zlib.crc32(head)), meta, request, response, _CRC.pack(crc)]


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
        _IN_FLIGHT.pack_into(mapped, 0, count)

    def _map_in_flight(self) -> Any:
        import mmap

        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, self._name[: -len(SPOOL_SUFFIX)] + IN_FLIGHT_SUFFIX)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, _IN_FLIGHT.size)
            return mmap.mmap(fd, _IN_FLIGHT.size)
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


# --- reading ------------------------------------------------------------------------------------


class Frame:
    """One whole frame read back: its kind, decoded metadata, and the request and response bytes."""

    __slots__ = ("kind", "meta", "request", "response")

    def __init__(self, kind: int, meta: dict[str, Any], request: bytes, response: bytes) -> None:
        self.kind, self.meta, self.request, self.response = kind, meta, request, response

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Frame) and all(getattr(self, name) == getattr(other, name) for name in self.__slots__)

    def __repr__(self) -> str:
        return f"Frame({self.kind}, {self.meta!r}, {len(self.request)} + {len(self.response)} bytes)"


class ScanResult:
    """What `scan_frames` found: whole frames in order, damaged stretches, and bytes consumed."""

    __slots__ = ("consumed", "damaged", "frames")

    def __init__(self, frames: list[Frame], damaged: list[int | None], consumed: int) -> None:
        # `damaged`: the kind of each frame lost, None where even its header was unreadable
        self.frames, self.damaged, self.consumed = frames, damaged, consumed


def _loads(data: bytes) -> Any:
    import orjson  # a dependency of the recorder, which is the reader

    return orjson.loads(data)


def scan_frames(data: bytes | bytearray, *, final: bool) -> ScanResult:
    """Split spool bytes into frames; never raises.

    A frame whose end is not there yet stops the scan (`consumed` ends before it), unless `final`:
    then it is counted as damaged, like a frame whose checksum fails, and the scan goes on at the
    next sound header.
    """
    frames: list[Frame] = []
    damaged: list[int | None] = []
    pos, size = 0, len(data)
    while pos < size:
        kind: int | None = None
        if size - pos < HEADER_SIZE:
            if not final:
                break  # a header still being written
        elif (header := _header_at(data, pos)) is not None:
            kind, meta_length, request_length, response_length = header
            end = pos + HEADER_SIZE + meta_length + request_length + response_length + TRAILER_SIZE
            if end > size and not final:
                break  # a frame still being written
            if end <= size:
                frame = _frame_at(data, pos, kind, meta_length, request_length, end)
                if frame is not None:
                    if isinstance(frame, Frame):
                        frames.append(frame)
                    else:
                        damaged.append(kind)  # whole, but its metadata is not a JSON object
                    pos = end
                    continue
        following = _next_header(data, pos + 1)
        if following is None and not final:
            break  # the frame after the damage may still be on its way: count it all once it is here
        damaged.append(kind)
        pos = size if following is None else following
    return ScanResult(frames, damaged, pos)


def _header_at(data: bytes | bytearray, pos: int) -> tuple[int, int, int, int] | None:
    """(kind, meta, request, response lengths) of a sound header at `pos`, else None."""
    if data[pos : pos + 4] != MAGIC or len(data) - pos < HEADER_SIZE:
        return None
    head = bytes(data[pos : pos + _HEADER.size])
    (crc,) = _CRC.unpack_from(data, pos + _HEADER.size)
    if zlib.crc32(head) != crc:
        return None
    _, version, kind, _, meta_length, request_length, response_length = _HEADER.unpack(head)
    if version != FRAME_VERSION or meta_length > _MAX_META:
        return None
    return kind, meta_length, request_length, response_length


def _next_header(data: bytes | bytearray, start: int) -> int | None:
    """Where the next sound header starts, if anywhere."""
    pos = data.find(MAGIC, start)
    while pos >= 0 and _header_at(data, pos) is None:
        pos = data.find(MAGIC, pos + 1)
    return pos if pos >= 0 else None


def _frame_at(
    data: bytes | bytearray, pos: int, kind: int, meta_length: int, request_length: int, end: int
) -> Frame | bool | None:
    """The frame at `pos`; None if its checksum fails, False if its metadata is unreadable."""
    meta_start = pos + HEADER_SIZE
    request_start = meta_start + meta_length
    response_start = request_start + request_length
    trailer = end - TRAILER_SIZE
    meta_bytes = bytes(data[meta_start:request_start])
    request = bytes(data[request_start:response_start])
    response = bytes(data[response_start:trailer])
    (crc,) = _CRC.unpack_from(data, trailer)
    if zlib.crc32(response, zlib.crc32(request, zlib.crc32(meta_bytes))) != crc:
        return None
    try:
        meta = _loads(meta_bytes)
    except ValueError:
        return False
    return Frame(kind, meta, request, response) if isinstance(meta, dict) else False


# --- collecting (in the `llmtap run` parent) -----------------------------------------------------

if TYPE_CHECKING:
    Pending = list[tuple["_SpoolFile", str, dict[str, Any]]]  # (whose, rollout id, line) in frame order


class _SpoolFile:
    """One process's spool file as the collector reads it: how far, and that process's counts."""

    def __init__(self, path: Path, fd: int) -> None:
        from ..health import CaptureHealth

        self.path = path
        self.fd = fd
        self.offset = 0
        self.buffer = bytearray()
        self.health = CaptureHealth()
        prefix = path.name.split("-", 1)[0]
        self.pid: int | None = int(prefix) if prefix.isdigit() else None
        self.argv0: str | None = None
        self.troubled = False  # a frame did not become a record: the file is kept, not removed
        self.calls = 0  # call frames read so far: the next one's number, which its record keeps

    def read(self, final: bool) -> tuple[ScanResult, bool]:
        """The frames written since the last read (a bounded amount), and whether all was read."""
        at_end = False
        while len(self.buffer) < _READ_LIMIT or not scan_frames(self.buffer, final=False).consumed:
            chunk = os.pread(self.fd, _READ_CHUNK, self.offset)
            if not chunk:
                at_end = True
                break
            self.offset += len(chunk)
            self.buffer += chunk
        result = scan_frames(self.buffer, final=final and at_end)
        del self.buffer[: result.consumed]
        return result, at_end

    def failure(self, event: str, exc: BaseException | None = None) -> None:
        self.troubled = True
        self.health.failure(event, "spool", exc)


class SpoolCollector:
    """Turns a run's spool frames into the capsule's records: live on a thread, and at the end.

        collector = SpoolCollector(paths).start()   # once the capsule exists
        ...                                         # the workload runs
        collector.finish()                          # or let finalise_capsule do it (drain_spool)

    The thread wakes every `interval` seconds and only lists `internal/spool/` until a spool file
    appears; then, whenever the files stop growing for a tick or new frames have waited
    `max_delay` seconds, it loads the record machinery (once) and appends each new frame's record
    to `calls/<rollout_id>.capture.jsonl` through CaptureStore. `finish` reads what is left, counts
    torn frames, writes each process's counts to `internal/health/`, and removes each spool file
    whose frames all became records (one with a problem is renamed `*.spool.kept`). Never raises.
    """

    def __init__(self, paths: CapsulePaths, *, interval: float = 0.1, max_delay: float = 2.0) -> None:
        self.paths = paths
        self.directory = spool_directory(paths.root)
        self.interval = interval
        self.max_delay = max_delay
        self._files: dict[str, _SpoolFile] = {}
        self._lock = _thread.allocate_lock()
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._finished = False
        self._store: Any = None
        self._recorded: set[tuple[str, int]] | None = None  # (spool file, call number) already in calls/

    def start(self) -> SpoolCollector:
        """Collect live on a daemon thread until `finish`, which finalisation calls; never raises
        (without the thread, finalisation still turns every frame into its record)."""
        import threading

        with _LIVE_LOCK:
            _LIVE[self.paths.root] = self
        stop = threading.Event()
        thread = threading.Thread(target=self._watch, args=(stop,), name="llmtap-spool-collector", daemon=True)
        try:
            thread.start()
        except RuntimeError as exc:  # no thread can be started now
            _collector_failed(exc)
        else:
            self._stop, self._thread = stop, thread
        return self

    def _watch(self, stop: threading.Event) -> None:
        """Collect when the spool files stop growing for a tick (the workload waits on a model),
        or when new frames have waited `max_delay`: a workload calling a fast model back to back
        gets its records in batches, and the CPU it shares with the collector is not taken at
        every call."""
        _yield_the_cpu()
        collected: dict[str, int] = {}
        previous: dict[str, int] = {}
        waiting_since: float | None = None
        while not stop.wait(self.interval):
            sizes = self._sizes()
            if sizes == collected:
                previous, waiting_since = sizes, None
                continue
            now = time.monotonic()
            waiting_since = now if waiting_since is None else waiting_since
            quiet, previous = sizes == previous, sizes
            if quiet or now - waiting_since >= self.max_delay:
                with self._lock:
                    if self._finished:
                        return
                    self._collect(final=False)
                collected, waiting_since = sizes, None

    def _sizes(self) -> dict[str, int]:
        try:
            with os.scandir(self.directory) as entries:
                return {entry.name: entry.stat(follow_symlinks=False).st_size for entry in entries if entry.name.endswith(SPOOL_SUFFIX)}
        except OSError:
            return {}

    def finish(self) -> None:
        """Stop the live thread, turn every remaining frame into its record, and tidy; idempotent."""
        thread = self._thread
        if thread is not None and self._stop is not None:
            self._stop.set()
            if thread.ident != _thread.get_ident():
                thread.join()
        with self._lock:
            if not self._finished:
                self._finished = True
                if self._thread is None:
                    # Nothing was collected live in this process: a recovery, or a finalisation
                    # killed halfway, may find some of these frames' records in calls/ already.
                    self._recorded = _recorded_calls(self.paths)
                self._collect(final=True)
                self._close()
        with _LIVE_LOCK:
            if _LIVE.get(self.paths.root) is self:
                del _LIVE[self.paths.root]

    def _collect(self, *, final: bool) -> None:
        try:
            self._open_new_files()
        except Exception as exc:  # never raise: the next pass (or the final one) tries again
            _collector_failed(exc)
        for spool in self._files.values():
            at_end = False
            while not at_end:
                try:
                    result, at_end = spool.read(final)
                except Exception as exc:  # an unreadable file: what it still holds stays unread
                    _collector_failed(exc)
                    spool.troubled = True
                    break
                pending: Pending = []
                for frame in result.frames:
                    self._take(spool, frame, pending)
                for kind in result.damaged:
                    spool.health.count("spool_frames_damaged")
                    if kind in (KIND_CALL, None):  # a call's record is lost (None: probably one)
                        spool.health.count("calls_captured")
                        spool.failure("record_write_failed")
                self._append(pending)

    def _open_new_files(self) -> None:
        from .writer import is_real_directory

        if not is_real_directory(self.directory):
            return  # none yet, or a link the workload put there: never read through it
        try:
            names = sorted(name for name in os.listdir(self.directory) if name.endswith(SPOOL_SUFFIX))
        except OSError:
            return  # no process has written a frame yet
        for name in names:
            if name in self._files:
                continue
            path = self.directory / name
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue  # a link, or gone: nothing of ours to read
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                continue
            self._files[name] = _SpoolFile(path, fd)

    def _take(self, spool: _SpoolFile, frame: Frame, pending: Pending) -> None:
        if frame.kind == KIND_CALL:
            spool.health.count("calls_captured")
            number, spool.calls = spool.calls, spool.calls + 1
            if self._recorded and (spool.path.name, number) in self._recorded:
                spool.health.count("records_written")  # by an earlier, interrupted finalisation
                return
            try:
                from ..hooks.writer import decode_call

                exchange, dialect = decode_call(frame)
                capture = exchange.extra.get("capture")
                if not isinstance(capture, dict):
                    capture = exchange.extra["capture"] = {}
                capture["spool"] = {"file": spool.path.name, "call": number}  # what a later finalisation dedups by
                pending.append((spool, exchange.rollout_id or "default", _build_line(exchange, dialect)))
            except Exception as exc:
                spool.failure("record_build_failed", exc)
        elif frame.kind == KIND_HEALTH:
            counts = frame.meta.get("counts")
            for event, amount in counts.items() if isinstance(counts, dict) else ():
                if isinstance(amount, int) and not isinstance(amount, bool) and amount > 0:
                    spool.health.count(str(event), amount)
        elif frame.kind == KIND_PROCESS:
            pid, argv0 = frame.meta.get("pid"), frame.meta.get("argv0")
            spool.pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else spool.pid
            spool.argv0 = argv0 if isinstance(argv0, str) else None

    def _append(self, pending: Pending) -> None:
        """Append a pass's records in frame order, sharing the fdatasyncs of each rollout file.

        Awaited appends from one event loop write their lines on that loop, one after the
        other, and only the syncs are batched on the store's threads: the file keeps the order
        of the frames, which `call_index` depends on, at a few syncs a pass instead of one a call.
        """
        if not pending:
            return
        try:
            if self._store is None:
                from ..store import CaptureStore

                # No helper process here; and calls/ must still be the capsule's own directory, not a link.
                self._store = CaptureStore(self.paths.calls, sync_process=False, refuse_links=True)
            store = self._store

            async def append_all() -> list[Any]:
                import asyncio

                appends = [store.append_async(rollout_id, line) for _, rollout_id, line in pending]
                return await asyncio.gather(*appends, return_exceptions=True)

            outcomes: list[Any] = _run_coroutine(append_all)
        except Exception as exc:
            outcomes = [exc] * len(pending)
        for (spool, _, _), outcome in zip(pending, outcomes):
            if isinstance(outcome, BaseException):
                spool.failure("record_write_failed", outcome)
            else:
                spool.health.count("records_written")

    def _take_in_flight_counts(self) -> dict[str, int]:
        """Non-zero in-flight counts by `.inflight` file name; every one read is removed."""
        from .writer import is_real_directory

        if not is_real_directory(self.directory):
            return {}
        try:
            names = [name for name in os.listdir(self.directory) if name.endswith(IN_FLIGHT_SUFFIX)]
        except OSError:
            return {}
        counts: dict[str, int] = {}
        for name in names:
            count = _read_in_flight(self.directory, name)
            if count:
                counts[name] = count
            try:
                os.unlink(self.directory / name)
            except OSError:
                pass
        return counts

    def _close(self) -> None:
        from .health import write_process_health
        from .writer import is_real_directory

        if self._store is not None:
            try:
                self._store.close()
            except Exception as exc:
                _collector_failed(exc)
        in_flight = self._take_in_flight_counts()
        for name, count in in_flight.items():
            spool_name = name[: -len(IN_FLIGHT_SUFFIX)] + SPOOL_SUFFIX
            spool = self._files.get(spool_name)
            if spool is None:  # killed before any frame: it still has a health file of its own
                spool = self._files[spool_name] = _SpoolFile(self.directory / spool_name, -1)
            spool.health.failure("calls_in_flight_at_exit", "spool", None)  # counted once, warned once
            if count > 1:
                spool.health.count("calls_in_flight_at_exit", count - 1)
        for spool in self._files.values():
            try:
                if spool.fd < 0:  # no spool file, only an in-flight count
                    counts = spool.health.snapshot()
                    write_process_health(self.paths.process_health / f"spool-{spool.path.stem}.json", counts, pid=spool.pid)
                    continue
                os.close(spool.fd)
                counts = spool.health.snapshot()
                if counts:
                    health = self.paths.process_health / f"spool-{spool.path.stem}.json"
                    write_process_health(health, counts, pid=spool.pid, argv0=spool.argv0)
                if not is_real_directory(self.directory):  # swapped for a link since: touch nothing through it
                    raise OSError(f"'{self.directory}' is no longer a directory of the capsule")
                if spool.troubled or spool.buffer:
                    os.replace(spool.path, spool.path.with_name(spool.path.name + KEPT_SUFFIX))
                else:
                    os.unlink(spool.path)  # every frame of it is a durable record now
            except Exception as exc:
                _collector_failed(exc)


def _read_in_flight(directory: Path, name: str) -> int:
    """The count in one `.inflight` file (0 for anything that is not one of ours)."""
    try:
        fd = os.open(directory / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return 0
        data = os.read(fd, _IN_FLIGHT.size)
    except OSError:
        return 0
    finally:
        os.close(fd)
    return max(0, _IN_FLIGHT.unpack(data)[0]) if len(data) == _IN_FLIGHT.size else 0


def _recorded_calls(paths: CapsulePaths) -> set[tuple[str, int]]:
    """The (spool file, call number) of every record already in the capsule's calls/; never raises."""
    found: set[tuple[str, int]] = set()
    try:
        from ..store import CaptureStore

        with CaptureStore(paths.calls, create=False, refuse_links=True) as store:
            for rollout_id in store.rollouts():
                for _, line in store.read(rollout_id).entries:
                    capture = line.get("capture")
                    origin = capture.get("spool") if isinstance(capture, dict) else None
                    if isinstance(origin, dict) and isinstance(origin.get("file"), str) and isinstance(origin.get("call"), int):
                        found.add((origin["file"], origin["call"]))
    except Exception as exc:  # unreadable: every frame is appended again rather than none
        _collector_failed(exc)
    return found


def _yield_the_cpu() -> None:
    """Lower this thread's priority (and that of the store threads it starts) below the workload's:
    the records can wait, the workload and its model server should not. Linux only, where a
    thread's nice value is its own and the threads it starts inherit it."""
    if not sys.platform.startswith("linux"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, _thread.get_native_id(), _COLLECTOR_NICENESS)
    except OSError:
        pass


def _run_coroutine(make: Callable[[], Any]) -> Any:
    """Run a coroutine on a new event loop (on a helper thread when this thread runs one already)."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="llmtap-spool") as helper:
        return helper.submit(lambda: asyncio.run(make())).result()


def _build_line(exchange: Exchange, dialect_name: str | None) -> dict[str, Any]:
    from ..dialects import get_dialect
    from ..records import raw_line_from_exchange

    return raw_line_from_exchange(exchange, dialect=get_dialect(dialect_name) if dialect_name else None)


def drain_spool(paths: CapsulePaths) -> None:
    """Turn every spool frame of the capsule not yet collected into its record (a finalisation step).

    Finishes the live collector of this capsule when one runs in this process, else collects
    once from the start of each spool file. Never raises.
    """
    with _LIVE_LOCK:
        collector = _LIVE.get(paths.root)
    (collector or SpoolCollector(paths)).finish()


_LIVE: dict[Path, SpoolCollector] = {}
_LIVE_LOCK = _thread.allocate_lock()


def _collector_failed(exc: BaseException) -> None:
    """Count a failure of the collector itself, with a warning once per kind (never raised)."""
    from ..health import HEALTH

    HEALTH.failure("spool_collect_failed", "spool", exc)
