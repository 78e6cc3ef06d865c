"""The parent's spool collector: how `llmtap run` turns its processes' spool frames into records.

The `llmtap run` parent turns frames (`spool.frame`) into the capsule's records with a
`SpoolCollector`: live, on a thread that polls for spool files and does its work once one
appears, and at finalisation (`drain_spool`), which drains the rest whether or not a live
collector ran. Each call becomes exactly one store line, in the order its process wrote the
frames. A torn or damaged frame is counted in capture health and skipped, never raised; a
process's `.inflight` count left non-zero is reported as `calls_in_flight_at_exit`.
"""

from __future__ import annotations

import _thread
import os
import stat
import sys
import time

from .events import STREAMS, EventStreams, event_from_call_frame
from .frame import KIND_CALL, KIND_HEALTH, KIND_NETWORK, KIND_PROCESS, Frame, ScanResult, decode_call, scan_frames
from .writer import IN_FLIGHT_FORMAT, IN_FLIGHT_SUFFIX, SPOOL_SUFFIX, spool_directory

# Only what the recorder needs at once: the rest is imported where it is used (finalisation
# imports this module even for a run that spooled nothing).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any

    from ..capsule.writer import CapsulePaths
    from ..exchange import Exchange

__all__ = ["KEPT_SUFFIX", "SpoolCollector", "drain_spool"]

KEPT_SUFFIX = ".kept"  # a drained spool file that had a problem, kept for inspection and never re-read
_READ_CHUNK = 8 << 20
_READ_LIMIT = 64 << 20  # bytes of frames a collector holds at once (more only for one bigger frame)
_COLLECTOR_NICENESS = 10  # how much the live collector defers to the workload and its model server


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
        self._events = EventStreams(paths)  # tool-calls.jsonl and network_events.jsonl

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
                    self._events.dedup_against_disk()
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
                self._append_events(spool)

    def _append_events(self, spool: _SpoolFile) -> None:
        """Append the event lines this spool file's pass queued (they are all its own)."""
        try:
            self._events.flush()
        except Exception as exc:  # the events of this pass are lost: counted, never raised
            spool.failure("event_write_failed", exc)

    def _open_new_files(self) -> None:
        from ..capsule.writer import is_real_directory

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
                exchange, dialect = decode_call(frame)
                capture = exchange.extra.get("capture")
                if not isinstance(capture, dict):
                    capture = exchange.extra["capture"] = {}
                capture["spool"] = {"file": spool.path.name, "call": number}  # what a later finalisation dedups by
                pending.append((spool, exchange.rollout_id or "default", _build_line(exchange, dialect)))
                event = event_from_call_frame(frame.meta, frame.request, frame.response, f"ne_{spool.path.stem}_call{number}")
                self._events.add(KIND_NETWORK, event)  # a model call is a network request too
            except Exception as exc:
                spool.failure("record_build_failed", exc)
        elif frame.kind in STREAMS:
            if not self._events.add(frame.kind, frame.meta):
                spool.health.count("spool_frames_damaged")
                spool.troubled = True
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
        from ..capsule.writer import is_real_directory

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
        from ..capsule.health import write_process_health
        from ..capsule.writer import is_real_directory

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
        data = os.read(fd, IN_FLIGHT_FORMAT.size)
    except OSError:
        return 0
    finally:
        os.close(fd)
    return max(0, IN_FLIGHT_FORMAT.unpack(data)[0]) if len(data) == IN_FLIGHT_FORMAT.size else 0


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
