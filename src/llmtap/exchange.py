"""The Exchange: what every capture point hands to the core, and nothing more.

A capture point (ASGI middleware, proxy, in-process hook) fills one Exchange per model call with
bytes and timings as they pass. It never parses a dialect: that is the job of `dialects/`, which
turns a finished Exchange into a record (see `records.raw_line_from_exchange`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CREDENTIAL_WORDS",
    "Exchange",
    "SAFE_HEADER_NAMES",
    "SAFE_HEADER_PREFIXES",
    "SECRET_HEADERS",
    "header_name",
    "is_credential_header",
    "new_model_call_id",
    "safe_headers",
]

# Header names whose values are credentials or identify an account, whatever their shape. They are
# dropped at the Exchange, so no later stage can persist them by mistake (principle 6).
SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "cookie",
        "set-cookie",
        "openai-organization",
        "openai-project",
        "x-goog-api-key",
        "anthropic-admin-api-key",
    }
)

# A header whose name contains one of these words is taken for a credential (`apikey`, `x-auth`,
# `x-session-id`, `x-amz-security-token`...): a list of names would always miss the next one.
CREDENTIAL_WORDS = ("key", "token", "auth", "secret", "password", "passwd", "cookie", "session", "credential")

# Known names that contain such a word but carry no secret: rate limits and token counts, and the
# API version headers. Kept because they explain a call (why it was throttled, what it cost).
SAFE_HEADER_NAMES = frozenset({"anthropic-version", "openai-version", "openai-processing-ms"})
SAFE_HEADER_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-", "ratelimit-")


def is_credential_header(name: str) -> bool:
    """True when a lower-cased header name is, by its name or its shape, a credential: never recorded.

    The rule: a name in `SECRET_HEADERS`, or one containing any of `CREDENTIAL_WORDS`, unless it
    is in `SAFE_HEADER_NAMES` or starts with one of `SAFE_HEADER_PREFIXES`. It decides only what
    is recorded: what is forwarded upstream or to the client is never changed by it.
    """
    if name in SECRET_HEADERS:
        return True
    if name in SAFE_HEADER_NAMES or name.startswith(SAFE_HEADER_PREFIXES):
        return False
    return any(word in name for word in CREDENTIAL_WORDS)


_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


def new_model_call_id() -> str:
    """A random UUID4 as 32 hex digits, the spec's `model_call_id` form.

    `uuid.uuid4()` reads os.urandom, which lets go of the interpreter lock: on a busy server with
    helper threads that hand-off costs far more than the id. `random` is seeded from the OS and
    reseeded in forked children, so ids stay unique across processes; they are ids, not secrets.
    """
    value = (random.getrandbits(128) & _UUID4_CLEAR) | _UUID4_SET
    return f"{value:032x}"


# Header names seen so far: lower-cased, or None for a credential. Servers and SDKs send the same
# few names on every call, and deciding and decoding them was most of what filtering cost.
_HEADER_NAMES: dict[Any, str | None] = {}
_HEADER_NAMES_KEPT = 4096
_UNKNOWN = object()


def header_name(raw_name: Any) -> str | None:
    """A header's name lower-cased as text, or None when the header carries a credential."""
    try:
        known = _HEADER_NAMES.get(raw_name, _UNKNOWN)
    except TypeError:  # an unhashable name (a bytearray): decided afresh
        known = _UNKNOWN
    if known is not _UNKNOWN:
        return known  # type: ignore[return-value]
    name = raw_name.decode("latin-1") if isinstance(raw_name, (bytes, bytearray)) else str(raw_name)
    name = name.lower()
    decided = None if is_credential_header(name) else name
    if len(_HEADER_NAMES) < _HEADER_NAMES_KEPT and isinstance(raw_name, (bytes, str)):
        _HEADER_NAMES[raw_name] = decided
    return decided


def safe_headers(headers: Mapping[str, str] | list[tuple[bytes, bytes]] | None) -> dict[str, str]:
    """Return headers with lower-cased names and every credential header removed (`is_credential_header`)."""
    result: dict[str, str] = {}
    if not headers:
        return result
    # ASGI servers hand over a list: test for it first, the Mapping ABC check is the slow one.
    items = headers if isinstance(headers, list) else headers.items() if isinstance(headers, Mapping) else headers
    for raw_name, raw_value in items:
        name = header_name(raw_name)
        if name is not None:
            result[name] = raw_value.decode("latin-1") if isinstance(raw_value, bytes) else str(raw_value)
    return result


@dataclass
class Exchange:
    """One model call's bytes, timings and correlation, as a capture point saw them.

    Times: `started_at` is wall-clock UTC seconds (for the record); the `*_mono` fields are
    `time.perf_counter()` readings used only for durations, so a clock step never yields a
    negative latency. `response_chunks` keeps each body chunk with its arrival offset in seconds
    from the start, so streams can be reassembled and inter-chunk timing studied later.
    """

    method: str
    path: str
    request_headers: dict[str, str] = field(default_factory=dict)
    request_body: bytes = b""
    status_code: int | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    response_chunks: list[tuple[float, bytes]] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    started_mono: float = field(default_factory=time.perf_counter)
    first_byte_mono: float | None = None
    completed_mono: float | None = None
    completed_at: float | None = None
    exception: BaseException | None = None
    cancelled: bool = False
    # True when the status was made up by the capture point (a proxy's 502 for an unreachable
    # upstream), not sent by the model server.
    status_synthesized: bool = False
    rollout_id: str | None = None
    model_ref: dict[str, Any] | None = None
    provider: str | None = None
    sampling: dict[str, Any] | None = None
    model_call_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Request chunks received so far; joined into `request_body` once, by `finish()`, so a large
    # body that arrives in many chunks is not copied again at each one.
    _request_parts: list[bytes] = field(default_factory=list, repr=False)

    def add_request_bytes(self, data: bytes) -> None:
        """Append bytes of the request body as they are received (in `request_body` after `finish()`)."""
        if data:
            self._request_parts.append(data)

    def add_response_chunk(self, data: bytes) -> None:
        """Record one chunk of the response body, with its arrival time."""
        if not data:
            return
        now = time.perf_counter()
        if self.first_byte_mono is None:
            self.first_byte_mono = now
        self.response_chunks.append((now - self.started_mono, data))

    def finish(self) -> None:
        """Mark the call as ended now (idempotent: the first end wins) and settle the request body."""
        if self._request_parts:
            self.request_body += b"".join(self._request_parts)
            self._request_parts.clear()
        if self.completed_mono is None:
            self.completed_mono = time.perf_counter()
            self.completed_at = self.started_at + (self.completed_mono - self.started_mono)

    @property
    def response_body(self) -> bytes:
        """The whole response body received so far."""
        chunks = self.response_chunks
        if len(chunks) == 1 and type(chunks[0][1]) is bytes:  # a JSON body as it came: no copy
            return chunks[0][1]
        return b"".join([chunk for _, chunk in chunks])

    @property
    def is_stream(self) -> bool:
        """True when the response is a server-sent event stream."""
        content_type = self.response_headers.get("content-type", "")
        return content_type.lower().startswith("text/event-stream")

    @property
    def latency_ms(self) -> float | None:
        """Duration from start to end of the call, in milliseconds."""
        if self.completed_mono is None:
            return None
        return round((self.completed_mono - self.started_mono) * 1000.0, 3)

    @property
    def ttft_ms(self) -> float | None:
        """Time to the first non-empty response chunk, in milliseconds."""
        if self.first_byte_mono is None:
            return None
        return round((self.first_byte_mono - self.started_mono) * 1000.0, 3)
