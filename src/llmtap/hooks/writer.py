"""The background record writer of `llmtap.capture()`, and the warm-up of the record machinery.

Under `llmtap.capture()`, `RecordWriter` is the capture's background writer thread (used by
`hooks.sinks.BackgroundStoreSink`), and `warm_up` imports the record-building modules on a
helper thread when a process opens its first model call, so processes that never call a model
never load them and the first finished call finds them ready. (Under `llmtap run` a finished call
leaves as a spool frame instead: `spool.writer`.)
"""

from __future__ import annotations

import atexit
import importlib
import queue
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from .call import CapturedCall

__all__ = [
    "WARM_UP_WAIT",
    "RecordWriter",
    "register_exit_flush",
    "warm_up",
    "writing_module",
    "writing_ready",
]

_EXIT_FLUSHES: list[Callable[[], None]] = []


def register_exit_flush(handler: Callable[[], None]) -> None:
    """Run `handler` at exit, before the capture store's own exit handler closes the stores."""
    _EXIT_FLUSHES.append(handler)
    atexit.register(handler)  # registered again once the store is imported (see warm_up)


class RecordWriter:
    """One writer thread that builds records in batches and commits them, with a drain for close.

    The writer waits `linger` seconds after the first record of a batch before working, so
    records are built in short bursts instead of one at a time: far fewer moments where the
    writer holds the interpreter lock just as the workload's thread comes back from the network.
    """

    def __init__(self, write_batch: Callable[[list[CapturedCall]], None], linger: float) -> None:
        self._write_batch = write_batch
        self._linger = linger
        self._reset()

    def _reset(self) -> None:
        self._queue: queue.SimpleQueue[CapturedCall] = queue.SimpleQueue()  # put() is GC-safe
        self._cond = threading.Condition(threading.RLock())
        self._pending = 0
        self._hurry = threading.Event()
        self._thread: threading.Thread | None = None

    def after_fork(self) -> None:
        """A forked child owns none of the parent's queued records or threads."""
        self._reset()

    def put(self, call: CapturedCall) -> None:
        with self._cond:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="llmtap-capture-writer", daemon=True)
                self._thread.start()
        self._queue.put(call)

    def _work(self) -> None:
        while True:
            batch = [self._queue.get()]
            self._hurry.wait(self._linger)
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._write_batch(batch)
            finally:
                with self._cond:
                    self._pending -= len(batch)
                    if self._pending == 0:
                        self._hurry.clear()
                        self._cond.notify_all()

    def drain(self, timeout: float) -> int:
        """Wait until every queued record is written; return how many are still pending."""
        deadline = time.monotonic() + timeout
        with self._cond:
            if self._pending:
                self._hurry.set()  # no lingering while someone waits
            while self._pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return self._pending


WRITING_MODULES = ("llmtap.store", "llmtap.records", "llmtap.dialects", "llmtap.capsule.health")
writing_ready = threading.Event()
WARM_UP_WAIT = 30.0
_warm_up_started = False
_warm_up_lock = threading.Lock()


def warm_up() -> None:
    """When the first call is opened, import what writing records needs, off the caller's thread.

    Not earlier, so a process that never calls a model pays nothing. The first finished call
    waits for these imports (they overlap its network time), so they are never left to run at
    exit: on CPython an import made while the interpreter exits after an unhandled Ctrl-C turns
    its exit status 130 into 1.
    """
    global _warm_up_started
    if _warm_up_started:
        return
    with _warm_up_lock:
        if _warm_up_started:
            return
        _warm_up_started = True
    threading.Thread(target=_import_writing_modules, name="llmtap-capture-warmup", daemon=True).start()


def _import_writing_modules() -> None:
    try:
        for name in WRITING_MODULES:
            importlib.import_module(name)
            if name == "llmtap.store":
                # The store closes its stores at exit; the captures' last flush must run before
                # that, and exit handlers run last-registered first.
                for handler in _EXIT_FLUSHES:
                    atexit.unregister(handler)
                    atexit.register(handler)
    finally:
        writing_ready.set()


def writing_module(name: str) -> Any:
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        warm_up()
        writing_ready.wait(30.0)
        module = importlib.import_module(name)
    return module
