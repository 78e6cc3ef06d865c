"""The spool frame: its format, its encoder (in the workload) and its decoder (in the recorder).

A workload process does no record building. When a call ends it turns the call into one
self-describing frame (`encode_call`: the call's metadata, then its request and response bytes)
and appends it to its own spool file (`spool.writer`). Credential headers are removed before the
frame is built, and the frame carries no exception message, only types (which is all a record
keeps). In the `llmtap run` parent, `scan_frames` splits a spool file back into frames and
`decode_call` turns a call's frame back into its Exchange (`spool.collector`).

Frame (little-endian):

    header   32 bytes  magic "LTSP", version, kind, 2 reserved, meta length (u32),
                       request length (u64), response length (u64), CRC-32 of these 28 bytes
    meta     JSON      kind 1 (call): what `Exchange` needs; 2 (health): count deltas;
                       3 (process): pid and argv[0]; 4 (tool call): one finished
                       `ToolCallRecord` as its line's object; 5 (network): one HTTP
                       request's network event (`hooks.network`)
    request  bytes
    response bytes
    trailer  4 bytes   CRC-32 of meta, request and response

A frame cut short (a process killed in the middle of its write, a full disk) or damaged is
skipped: the reader looks for the next header, counts the loss, and never raises. A frame still
being written is left for the next pass, until the final one.
"""

from __future__ import annotations

import struct
import zlib
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from ..exchange import header_name, safe_headers

if TYPE_CHECKING:
    from ..exchange import Exchange

__all__ = [
    "FRAME_VERSION",
    "HEADER_SIZE",
    "KIND_CALL",
    "KIND_HEALTH",
    "KIND_NETWORK",
    "KIND_PROCESS",
    "KIND_TOOL_CALL",
    "TRAILER_SIZE",
    "Frame",
    "ScanResult",
    "credential_free",
    "decode_call",
    "encode_call",
    "encode_frame",
    "encode_meta",
    "scan_frames",
]

MAGIC = b"LTSP"
FRAME_VERSION = 1
KIND_CALL, KIND_HEALTH, KIND_PROCESS = 1, 2, 3
KIND_TOOL_CALL, KIND_NETWORK = 4, 5  # events beside the calls: each frame's meta is the line to append
_HEADER = struct.Struct("<4sBBHIQQ")
_CRC = struct.Struct("<I")
HEADER_SIZE = _HEADER.size + _CRC.size
TRAILER_SIZE = _CRC.size
_MAX_META = 64 << 20
_EXCEPTION_DEPTH = 16


# --- encoding (in the workload: cheap, stdlib only until the first frame) -------------------------

_dumps: Callable[[Any], bytes] | None = None


def _json_dumps(value: Any) -> bytes:
    import json

    return json.dumps(value, separators=(",", ":"), default=str).encode("utf-8")


def encode_meta(value: Any) -> bytes:
    """JSON bytes of `value`: orjson when this interpreter can load it (the faster encoder), else json."""
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

