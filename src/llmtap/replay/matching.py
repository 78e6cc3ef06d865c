"""Match keys for model calls, and the index that finds the recorded call a new request should get.

A call's match key is the SHA-256 of its request's canonical projection (built by its dialect in
`llmtap.dialects.projection`, which documents the volatile fields left out and their version).
Keys are scoped per rollout. Identical requests within one rollout are never collapsed: the n-th
time a rollout sends a request, it gets the n-th recorded call with that key. A request with no
recorded call left is a `Miss`, which names the closest recorded call (same rollout, endpoint and
model first) and what differs, as JSON Pointers with short before/after values.

Usage::

    index = RecordingIndex.from_store(CaptureStore("/abs/model-calls", create=False))
    found = index.match("0-0", request_body, endpoint="chat")
    if isinstance(found, Miss):
        raise SystemExit(found.describe())
    print(found.record.response)
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..dialects.projection import MATCH_KEY_VERSION, canonical_bytes, request_projection, stable_hash
from ..errors import LlmtapError

__all__ = [
    "MATCH_KEY_VERSION",
    "FieldDifference",
    "Miss",
    "RecordedCall",
    "RecordingError",
    "RecordingIndex",
    "json_differences",
    "match_key",
    "record_projection",
    "short_value",
]

# How much of a value a difference shows, and how many differences a miss lists.
SHORT_VALUE_CHARS = 80
MAX_DIFFERENCES = 12
# How deep a difference is followed before the rest is shown as one value.
MAX_POINTER_DEPTH = 64
# How many recorded calls a miss compares in full when looking for the closest one.
MAX_CLOSEST_CANDIDATES = 256
_ABSENT = object()


class RecordingError(LlmtapError):
    """Raised when a recording cannot be opened as one: not a capsule or capture directory, or a link."""


def record_projection(record: Any) -> dict[str, Any]:
    """Return the canonical projection of a recorded call's request (a `ModelCallRecord`)."""
    return request_projection(record.dialect, record.request, record.request_raw)


def match_key(projection: Mapping[str, Any]) -> str:
    """Return the match key (SHA-256 hex) of a request projection."""
    return stable_hash(projection)


@dataclass(frozen=True, slots=True)
class FieldDifference:
    """One place where two requests differ: a JSON Pointer and short renderings of both values.

    `before` is the recorded value, `after` the new request's; `None` means the place is absent
    on that side. Values are excerpts of at most `SHORT_VALUE_CHARS` characters, never a whole prompt.
    """

    pointer: str
    before: str | None
    after: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"pointer": self.pointer, "before": self.before, "after": self.after}


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def short_value(value: Any, *, around: int = 0) -> str:
    """Render a value as JSON of at most `SHORT_VALUE_CHARS` characters, starting near `around` for long text."""
    if isinstance(value, str):
        text = value
        if len(text) <= SHORT_VALUE_CHARS:
            return repr_json(text)
        start = max(0, around - 20)
        window = text[start : start + SHORT_VALUE_CHARS - 20]
        prefix = "…" if start else ""
        return f"{prefix}{repr_json(window)[1:-1]}… ({len(text)} chars)"
    rendered = canonical_bytes(value).decode("utf-8", "replace")
    if len(rendered) <= SHORT_VALUE_CHARS:
        return rendered
    kind = "object" if isinstance(value, dict) else "array" if isinstance(value, list) else "value"
    return f"{rendered[: SHORT_VALUE_CHARS - 24]}… ({kind}, {len(rendered)} chars)"


def repr_json(text: str) -> str:
    """Quote a string as JSON does."""
    return canonical_bytes(text).decode("utf-8", "replace")


def _common_prefix(a: str, b: str) -> int:
    limit = min(len(a), len(b))
    index = 0
    while index < limit and a[index] == b[index]:
        index += 1
    return index


def _walk(
    before: Any, after: Any, pointer: str, out: list[FieldDifference], counter: list[int], limit: int, depth: int = 0
) -> None:
    """Append differences below `pointer` to `out` (at most `limit`); count every one in `counter`."""
    if before is after or (type(before) is type(after) and before == after):
        return
    # Below MAX_POINTER_DEPTH a hostile nesting ends as one difference, never a RecursionError.
    if depth < MAX_POINTER_DEPTH and isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(before.keys() | after.keys(), key=str):
            left, right = before.get(key, _ABSENT), after.get(key, _ABSENT)
            _walk(left, right, f"{pointer}/{_escape(str(key))}", out, counter, limit, depth + 1)
        return
    if depth < MAX_POINTER_DEPTH and isinstance(before, list) and isinstance(after, list):
        for index in range(max(len(before), len(after))):
            left = before[index] if index < len(before) else _ABSENT
            right = after[index] if index < len(after) else _ABSENT
            _walk(left, right, f"{pointer}/{index}", out, counter, limit, depth + 1)
        return
    counter[0] += 1
    if len(out) >= limit:
        return
    around = _common_prefix(before, after) if isinstance(before, str) and isinstance(after, str) else 0
    out.append(
        FieldDifference(
            pointer=pointer or "/",
            before=None if before is _ABSENT else short_value(before, around=around),
            after=None if after is _ABSENT else short_value(after, around=around),
        )
    )


def json_differences(before: Any, after: Any, *, limit: int = MAX_DIFFERENCES) -> tuple[list[FieldDifference], int]:
    """Return up to `limit` differences between two JSON values, and how many there are in all.

    Objects are compared key by key and arrays index by index; a value present on one side only
    shows as None on the other. Pointers follow RFC 6901 (`~0`, `~1` escapes).
    """
    out: list[FieldDifference] = []
    counter = [0]
    _walk(before, after, "", out, counter, limit)
    return out, counter[0]


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """One recorded call, with its match key and its place among identical requests of its rollout."""

    rollout_id: str
    call_index: int
    key: str
    occurrence: int
    projection: dict[str, Any] = field(repr=False)
    record: Any = field(repr=False)  # ModelCallRecord
    # The persisted capture line, when read from a store: what a replay answers with.
    line: Mapping[str, Any] | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str | None:
        return self.projection.get("endpoint")

    @property
    def model(self) -> str | None:
        request = self.projection.get("request")
        model = request.get("model") if isinstance(request, dict) else None
        return model if isinstance(model, str) else None


MissReason = Literal["unknown_rollout", "no_matching_call", "exhausted"]


@dataclass(frozen=True, slots=True)
class Miss:
    """No recorded call is left for a request: why, the closest recorded call, and what differs from it.

    `reason`: `unknown_rollout` (the recording has no call for this rollout), `no_matching_call`
    (no recorded call has this request), or `exhausted` (every recorded call with this request
    was already served; `occurrence` says how many).
    """

    rollout_id: str
    endpoint: str | None
    model: str | None
    key: str
    occurrence: int
    reason: MissReason
    closest: RecordedCall | None
    differences: tuple[FieldDifference, ...]
    more_differences: int

    def describe(self) -> str:
        """Return the miss as a few readable lines (no prompt text beyond the short excerpts)."""
        head = {
            "unknown_rollout": f"The recording has no call for rollout '{self.rollout_id}'",
            "no_matching_call": f"No recorded call of rollout '{self.rollout_id}' has this {self.endpoint} request",
            "exhausted": (
                f"Rollout '{self.rollout_id}' sent this {self.endpoint} request {self.occurrence + 1} times; "
                f"the recording has it {self.occurrence} times"
            ),
        }[self.reason]
        lines = [f"{head} (match key {self.key[:12]}, version {MATCH_KEY_VERSION})."]
        if self.closest is not None:
            where = f"rollout '{self.closest.rollout_id}' call {self.closest.call_index}"
            lines.append(f"Closest recorded call: {where} ({self.closest.endpoint}, model {self.closest.model}).")
        for difference in self.differences:
            lines.append(
                f"  {difference.pointer}: recorded {difference.before or '(absent)'}, now {difference.after or '(absent)'}"
            )
        if self.more_differences:
            lines.append(f"  … and {self.more_differences} more differences.")
        if self.reason != "exhausted":
            lines.append("Re-record the run, or make the request match the recording.")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rollout_id": self.rollout_id,
            "endpoint": self.endpoint,
            "model": self.model,
            "match_key": self.key,
            "match_key_version": MATCH_KEY_VERSION,
            "occurrence": self.occurrence,
            "reason": self.reason,
            "closest": None
            if self.closest is None
            else {"rollout_id": self.closest.rollout_id, "call_index": self.closest.call_index},
            "differences": [difference.to_dict() for difference in self.differences],
            "more_differences": self.more_differences,
        }


class RecordingIndex:
    """Every recorded call of a recording by rollout and match key, serving each exactly once in recorded order.

    Thread-safe: concurrent requests of one rollout each get a distinct recorded call.
    """

    def __init__(self, calls: Iterable[RecordedCall], *, unreadable_lines: int = 0) -> None:
        self._by_rollout: dict[str, list[RecordedCall]] = {}
        self._by_key: dict[tuple[str, str], list[RecordedCall]] = {}
        for call in calls:
            self._by_rollout.setdefault(call.rollout_id, []).append(call)
            self._by_key.setdefault((call.rollout_id, call.key), []).append(call)
        self._served: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self.unreadable_lines = unreadable_lines

    @classmethod
    def from_records(
        cls, records_by_rollout: Mapping[str, Iterable[Any]], *, unreadable_lines: int = 0
    ) -> RecordingIndex:
        """Build the index from `ModelCallRecord`s per rollout, each rollout's in call order (no persisted lines)."""
        pairs: dict[str, list[tuple[Any, Mapping[str, Any] | None]]] = {
            rollout_id: [(record, None) for record in records] for rollout_id, records in records_by_rollout.items()
        }
        return cls(_recorded_calls(pairs), unreadable_lines=unreadable_lines)

    @classmethod
    def from_store(cls, store: Any, rollout_ids: Iterable[str] | None = None) -> RecordingIndex:
        """Build the index from a `CaptureStore`, read tolerantly (damaged lines are counted in `unreadable_lines`).

        Each recorded call keeps its persisted line (`RecordedCall.line`: status, headers, raw
        stream text), which a replay answers with.
        """
        from ..records import ModelCallRecord

        pairs: dict[str, list[tuple[Any, Mapping[str, Any] | None]]] = {}
        unreadable = 0
        for rollout_id in store.rollouts() if rollout_ids is None else rollout_ids:
            result = store.read(rollout_id)
            unreadable += len(result.invalid_lines)
            found = pairs.setdefault(rollout_id, [])
            for call_index, line in result.entries:
                try:
                    found.append((ModelCallRecord.from_raw_line(line, call_index), line))
                except ValueError:  # not a capture record: counted, its call_index stays used
                    unreadable += 1
        return cls(_recorded_calls(pairs), unreadable_lines=unreadable)

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> RecordingIndex:
        """Build the index from a capsule (a directory with `calls/`) or a capture directory; links are refused."""
        from ..store import CaptureStore

        store = CaptureStore(recording_calls_dir(Path(path)), create=False)
        try:
            return cls.from_store(store)
        finally:
            store.close()

    def rollouts(self) -> list[str]:
        """Return the recorded rollout ids, sorted."""
        return sorted(self._by_rollout)

    def calls(self, rollout_id: str) -> list[RecordedCall]:
        """Return a rollout's recorded calls in call order."""
        return list(self._by_rollout.get(rollout_id, ()))

    def __iter__(self) -> Iterator[RecordedCall]:
        for rollout_id in self.rollouts():
            yield from self._by_rollout[rollout_id]

    def unserved(self) -> list[RecordedCall]:
        """Return the recorded calls no request has got yet, by rollout and call order: what a replayed run skipped."""
        with self._lock:
            served = dict(self._served)
        return [call for call in self if call.occurrence >= served.get((call.rollout_id, call.key), 0)]

    def match(
        self, rollout_id: str, request: Mapping[str, Any] | None, *, endpoint: str | None, raw: str | None = None
    ) -> RecordedCall | Miss:
        """Return the recorded call this request gets (and count it served), or a `Miss`.

        `endpoint` is the dialect name (see `endpoint_for_path`); `request` the parsed JSON body,
        or None with `raw` holding a body that is not a JSON object.
        """
        projection = request_projection(endpoint, request, raw)
        key = match_key(projection)
        with self._lock:
            candidates = self._by_key.get((rollout_id, key), [])
            served = self._served.get((rollout_id, key), 0)
            if served < len(candidates):
                self._served[(rollout_id, key)] = served + 1
                return candidates[served]
        if candidates:
            return self._miss(rollout_id, projection, key, served, "exhausted", candidates[-1], [], 0)
        reason: MissReason = "no_matching_call" if rollout_id in self._by_rollout else "unknown_rollout"
        closest = self.closest(rollout_id, projection)
        differences, total = json_differences(closest.projection, projection) if closest is not None else ([], 0)
        return self._miss(rollout_id, projection, key, 0, reason, closest, differences, total - len(differences))

    def closest(self, rollout_id: str, projection: Mapping[str, Any]) -> RecordedCall | None:
        """Return the recorded call nearest to a request: same rollout, endpoint and model first, then fewest differences."""
        endpoint = projection.get("endpoint")
        request = projection.get("request")
        model = request.get("model") if isinstance(request, dict) else None
        pool = self._by_rollout.get(rollout_id) or [call for calls in self._by_rollout.values() for call in calls]
        tiers = (
            [call for call in pool if call.endpoint == endpoint and call.model == model],
            [call for call in pool if call.endpoint == endpoint],
            pool,
        )
        tier = next((candidates for candidates in tiers if candidates), [])
        best: RecordedCall | None = None
        best_count = -1
        for call in tier[:MAX_CLOSEST_CANDIDATES]:
            _, count = json_differences(call.projection, projection, limit=0)
            if best is None or count < best_count:
                best, best_count = call, count
        return best

    def _miss(
        self,
        rollout_id: str,
        projection: Mapping[str, Any],
        key: str,
        occurrence: int,
        reason: MissReason,
        closest: RecordedCall | None,
        differences: list[FieldDifference],
        more: int,
    ) -> Miss:
        request = projection.get("request")
        model = request.get("model") if isinstance(request, dict) else None
        return Miss(
            rollout_id=rollout_id,
            endpoint=projection.get("endpoint"),
            model=model if isinstance(model, str) else None,
            key=key,
            occurrence=occurrence,
            reason=reason,
            closest=closest,
            differences=tuple(differences),
            more_differences=more,
        )


def _recorded_calls(
    pairs_by_rollout: Mapping[str, list[tuple[Any, Mapping[str, Any] | None]]],
) -> Iterator[RecordedCall]:
    for rollout_id, pairs in pairs_by_rollout.items():
        seen: dict[str, int] = {}
        for record, line in sorted(pairs, key=lambda pair: pair[0].call_index):
            projection = record_projection(record)
            key = match_key(projection)
            occurrence = seen.get(key, 0)
            seen[key] = occurrence + 1
            yield RecordedCall(rollout_id, record.call_index, key, occurrence, projection, record, line)


def recording_calls_dir(path: Path) -> Path:
    """Return the capture directory of a recording: `<capsule>/calls` for a capsule, else the directory itself.

    A recording is untrusted input: the path and its `calls/` must be real directories, not links.
    """
    for candidate in (path, path / "calls"):
        try:
            info = os.lstat(candidate)
        except FileNotFoundError:
            if candidate is path:
                raise RecordingError(
                    f"Could not open the recording '{path}': it does not exist; pass a capsule or capture directory."
                ) from None
            continue
        except OSError as exc:
            raise RecordingError(
                f"Could not open the recording '{candidate}' ({exc.strerror}); check its permissions."
            ) from exc
        if not stat.S_ISDIR(info.st_mode):
            raise RecordingError(
                f"Could not open the recording '{candidate}': it is a link or not a directory; pass a real capsule or capture directory."
            )
    return path / "calls" if (path / "calls").is_dir() else path
