"""How a finished call leaves the workload's thread: as a spool frame, or to a record writer.

Under `llmtap run`, `encode_call` turns the call into the frame its process appends to its spool
file (`capsule.spool`): bytes and metadata only, credential headers dropped, no parsing; the
recorder rebuilds the call's Exchange with `decode_call`. Under `llmtap.capture()`, `RecordWriter` is the capture's background writer
(see `CaptureSession`), and `warm_up` imports the record-building modules on a helper thread when
a process opens its first model call, so processes that never call a model never load them and
the first finished call finds them ready.
"""

from __future__ import annotations

import atexit
import importlib
import queue
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from ..capsule.spool import KIND_CALL, encode_frame, encode_meta
from ..exchange import header_name, safe_headers

if TYPE_CHECKING:
    from ..capsule.spool import Frame
    from ..exchange import Exchange
    from .session import CapturedCall, CaptureSession

__all__ = [
    "WARM_UP_WAIT",
    "RecordWriter",
    "credential_free",
    "decode_call",
    "encode_call",
    "register_exit_flush",
    "warm_up",
    "writing_module",
    "writing_ready",
]

_EXIT_FLUSHES: list[Callable[[], None]] = []
_EXCEPTION_DEPTH = 16


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("latin-1")
    return str(value)


def credential_free(headers: Iterable[tuple[Any, Any]] | None) -> list[tuple[str, str]] | None:
    """Header pairs as text (names lower-cased), without any credential header (`safe_headers`' rule)."""
    if headers is None:
        return None
    kept = []
    for name, value in headers:
        text = header_name(name)
        if text is not None:
            kept.append((text, value.decode("latin-1") if type(value) is bytes else _text(value)))
    return kept


def _describe_exception(exc: BaseException) -> dict[str, Any]:
    """What records need of an exception: each type in its chain and any HTTP status it carries."""
    chain: list[dict[str, Any]] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(chain) < _EXCEPTION_DEPTH:
        seen.add(id(current))
        chain.append(
            {
                "type": type(current).__name__,
                "timeout": isinstance(current, TimeoutError),
                "connection": isinstance(current, ConnectionError),
            }
        )
        current = current.__cause__ or current.__context__
    description: dict[str, Any] = {"chain": chain}
    for key, holder_name, attribute in (("status", "", "status"), ("status_code", "", "status_code"), ("response_status_code", "response", "status_code")):
        try:
            holder = getattr(exc, holder_name, None) if holder_name else exc
            value = getattr(holder, attribute, None)
        except Exception:  # a lazy attribute that fails: the status stays unknown
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            description[key] = value
    return description


def encode_call(
    exchange: Exchange,
    *,
    dialect: str | None,
    request_headers: Iterable[tuple[Any, Any]] | None,
    response_headers: Iterable[tuple[Any, Any]] | None,
    body_decoded: bool,
) -> list[bytes]:
    """The frame of one finished call: everything `decode_call` needs to rebuild its Exchange.

    This runs on the workload's thread for every call, so it does as little as it can: no
    parsing, one dict, one JSON encoding, and fields left out when they hold their default.
    """
    exchange.finish()
    started = exchange.started_mono
    completed = exchange.completed_mono
    first_byte = exchange.first_byte_mono
    chunks = exchange.response_chunks
    meta: dict[str, Any] = {
        "method": exchange.method,
        "path": exchange.path,
        "status": exchange.status_code,
        "started_at": exchange.started_at,
        "completed_at": exchange.completed_at,
        "latency_s": None if completed is None else completed - started,
        "ttft_s": None if first_byte is None else first_byte - started,
        "rollout_id": exchange.rollout_id,
        "provider": exchange.provider,
        "dialect": dialect,
        "request_headers": credential_free(request_headers),
        "response_headers": credential_free(response_headers),
        "chunks": [(offset, len(data)) for offset, data in chunks],
        "extra": exchange.extra,
    }
    if body_decoded:
        meta["body_decoded"] = True
    if exchange.cancelled:
        meta["cancelled"] = True
    if exchange.exception is not None:
        meta["exception"] = _describe_exception(exchange.exception)
    if exchange.status_synthesized:
        meta["status_synthesized"] = True
    if exchange.model_ref is not None:
        meta["model_ref"] = exchange.model_ref
    if exchange.sampling is not None:
        meta["sampling"] = exchange.sampling
    if exchange.model_call_id is not None:
        meta["model_call_id"] = exchange.model_call_id
    response = chunks[0][1] if len(chunks) == 1 else b"".join([data for _, data in chunks])
    return encode_frame(KIND_CALL, encode_meta(meta), exchange.request_body, response)


def decode_call(frame: Frame) -> tuple[Exchange, str | None]:
    """Rebuild a call's Exchange (and its dialect name) from its frame; ValueError if malformed.

    The recorder's side of `encode_call`, kept next to it so the two read the same fields.
    """
    from ..exchange import Exchange

    meta = frame.meta
    try:
        exchange = Exchange(method=str(meta["method"]), path=str(meta["path"]), request_body=frame.request)
        exchange.status_code = _optional(meta.get("status"), int)
        exchange.started_at = float(meta["started_at"])
        exchange.started_mono = 0.0
        exchange.completed_at = _optional(meta.get("completed_at"), float)
        exchange.completed_mono = _optional(meta.get("latency_s"), float)
        exchange.first_byte_mono = _optional(meta.get("ttft_s"), float)
        exchange.rollout_id = _optional(meta.get("rollout_id"), str)
        exchange.provider = _optional(meta.get("provider"), str)
        exchange.model_ref = _optional(meta.get("model_ref"), dict)
        exchange.sampling = _optional(meta.get("sampling"), dict)
        exchange.model_call_id = _optional(meta.get("model_call_id"), str)
        exchange.status_synthesized = bool(meta.get("status_synthesized", False))
        exchange.cancelled = bool(meta.get("cancelled", False))
        exchange.extra = dict(meta.get("extra") or {})
        exchange.request_headers = safe_headers(_pairs(meta.get("request_headers")))
        exchange.response_headers = safe_headers(_pairs(meta.get("response_headers")))
        if meta.get("body_decoded"):
            # The teed bytes were already decompressed: keep the header out so no reader tries
            # to decompress them again.
            encoding = exchange.response_headers.pop("content-encoding", None)
            if encoding is not None:
                exchange.extra.setdefault("capture", {})["content_encoding_removed"] = encoding
        exchange.response_chunks = list(_chunks(meta.get("chunks") or [], frame.response))
        if meta.get("exception") is not None:
            exchange.exception = _stand_in(meta["exception"])
        dialect = _optional(meta.get("dialect"), str)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"The call frame is malformed ({type(exc).__name__}).") from exc
    return exchange, dialect


def _optional(value: Any, kind: type) -> Any:
    if value is None:
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"expected {kind.__name__}, found {type(value).__name__}")
    return value


def _pairs(value: Any) -> Any:
    """Header pairs as `safe_headers` takes them."""
    return [(str(name), str(text)) for name, text in (value or [])]


def _chunks(sizes: list[Any], body: bytes) -> Iterator[tuple[float, bytes]]:
    pos = 0
    for offset, length in sizes:
        yield float(offset), body[pos : pos + int(length)]
        pos += int(length)
    if pos != len(body):
        raise ValueError("the chunk sizes do not add up to the response")


def _stand_in(description: dict[str, Any]) -> BaseException:
    """An exception that reads as the original to `records`: same type names, kinds and status."""
    built: BaseException | None = None
    for link in reversed(description.get("chain") or [{"type": "Exception"}]):
        base: type[Exception] = TimeoutError if link.get("timeout") else ConnectionError if link.get("connection") else Exception
        stand_in = type(str(link.get("type") or "Exception"), (base,), {})()
        stand_in.__cause__ = built
        built = stand_in
    assert built is not None
    for key in ("status", "status_code"):
        if isinstance(description.get(key), int):
            setattr(built, key, description[key])
    if isinstance(description.get("response_status_code"), int):
        from types import SimpleNamespace

        built.response = SimpleNamespace(status_code=description["response_status_code"])  # type: ignore[attr-defined]
    return built


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

    def __init__(self, session: CaptureSession, linger: float) -> None:
        self._session = session
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
                self._session._write_batch(batch)
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
