"""Pairs JSON-RPC requests with their responses, per direction, into `ToolCallRecord`s with timings.

A proxy shows every message to one `Pairing` (per stdio session; per HTTP exchange and session)
with the direction it travelled. Requests of the recorded methods open a pending record keyed by
(who asked, id); the response with that id, travelling the other way, closes it. The session's
identity is learned on the way: the `initialize` handshake (protocol version, client and server
info) or, on the stateless protocol, each request's `_meta` and each result's `_meta`.

The stateless protocol answers a request that needs input with `resultType: "input_required"`,
and the client sends the request again with a new id, carrying `requestState` and
`inputResponses`; the retry's record links to the leg that asked (`retry`), by the digest of the
echoed `requestState`, or, when the server sent none, by the same method, name and arguments
when exactly one such leg waits. Nothing here raises on a peer's bytes: odd messages are counted.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

from .framing import OversizedMessage, oversized_response_id
from .records import (
    DEFAULT_ARGUMENTS_BUDGET,
    DEFAULT_CONTENT_BUDGET,
    ERROR_MESSAGE_CHARS,
    ToolCallRecord,
    bounded_json,
    digest,
    new_call_id,
    summarize_result,
)

__all__ = ["CLIENT_TO_SERVER", "SERVER_TO_CLIENT", "Direction", "Pairing", "PairingStats", "SessionIdentity"]

Direction = Literal["client_to_server", "server_to_client"]
CLIENT_TO_SERVER: Direction = "client_to_server"
SERVER_TO_CLIENT: Direction = "server_to_client"

# Requests a client sends that become records; the server's own requests always do.
CLIENT_METHODS = frozenset({"tools/call", "tools/list", "resources/read", "prompts/get"})
SERVER_METHODS = frozenset({"sampling/createMessage", "elicitation/create", "roots/list"})
_META = "_meta"
_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
_CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"
_SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
MAX_PENDING = 4096  # open requests kept per pairing; older ones are closed as incomplete beyond it
MAX_RETRY_LINKS = 1024


def _other(direction: Direction) -> Direction:
    return SERVER_TO_CLIENT if direction == CLIENT_TO_SERVER else CLIENT_TO_SERVER


def _id_key(value: Any) -> tuple[str, int | str] | None:
    """A request id as a dict key that keeps 1 and "1" apart; None for an id JSON-RPC does not allow."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None
    return (type(value).__name__, value)


def _implementation(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None
    kept = {key: value[key] for key in ("name", "version") if isinstance(value.get(key), str)}
    return {key: text[:200] for key, text in kept.items()} or None


@dataclass(slots=True)
class SessionIdentity:
    """What one proxied session is: its transport, ids, protocol, and the two implementations."""

    transport: str
    session_id: str = field(default_factory=lambda: new_call_id().replace("tc_", "ms_"))
    rollout_id: str | None = None
    era: str | None = None
    version: str | None = None
    client: dict[str, Any] | None = None
    server: dict[str, Any] | None = None
    digest_key: bytes = field(default_factory=lambda: os.urandom(32), repr=False)  # never written


@dataclass(slots=True)
class PairingStats:
    """Counts of what pairing met besides well-formed pairs."""

    records: int = 0
    unmatched_responses: int = 0
    duplicate_ids: int = 0
    evicted: int = 0


@dataclass(slots=True)
class _Pending:
    record: ToolCallRecord
    started: float
    input_keys: dict[str, str] = field(default_factory=dict)


class Pairing:
    """Turns observed messages into finished records; `observe` returns the records each message closed."""

    def __init__(
        self,
        identity: SessionIdentity,
        *,
        content_budget: int = DEFAULT_CONTENT_BUDGET,
        arguments_budget: int = DEFAULT_ARGUMENTS_BUDGET,
        parent: Pairing | None = None,
    ) -> None:
        self.identity = identity
        self.stats = PairingStats()
        self.content_budget = content_budget
        self.arguments_budget = arguments_budget
        self._pending: OrderedDict[tuple[Direction, tuple[str, int | str]], _Pending] = OrderedDict()
        self._parent = parent  # where retry links live when pairings are per exchange (HTTP)
        self._by_state: OrderedDict[str, _Pending] = OrderedDict()
        self._by_request: OrderedDict[str, list[_Pending]] = OrderedDict()
        self._initialize_id: tuple[str, int | str] | None = None

    # -- observation -------------------------------------------------------------------------

    def observe(self, direction: Direction, message: dict[str, Any], wire_bytes: int) -> list[ToolCallRecord]:
        """Note one message that travelled `direction`; return the records it finished."""
        method = message.get("method")
        if isinstance(method, str):
            if "id" in message:
                return self._request(direction, method, message, wire_bytes)
            if method == "notifications/cancelled":
                return self._cancelled(direction, message)
            return []
        if "result" in message or "error" in message:
            return self._response(direction, message, wire_bytes)
        return []

    def observe_oversized(self, direction: Direction, oversized: OversizedMessage) -> list[ToolCallRecord]:
        """Close the request an oversized response answers, when its id can be read from its first bytes."""
        found = oversized_response_id(oversized.prefix)
        if found is None:
            return []
        key = _id_key(found[0])
        pending = self._pending.pop((_other(direction), key), None) if key is not None else None
        if pending is None:
            return []
        record = pending.record
        self._complete(pending, "unknown")
        record.response_bytes = oversized.size
        record.result = {"result_bytes": None, "oversized": True}
        if found[1] == "error":
            record.status = "failed"
            record.error = {"category": "jsonrpc_error", "code": None, "message": None}
        return [self._finished(record)]

    def close_all(
        self, category: str, detail: dict[str, Any] | None = None, *, status: str = "incomplete"
    ) -> list[ToolCallRecord]:
        """Close every open request: the session or stream ended before its answer.

        `status` is `incomplete` when nothing says the call went wrong (the client left, a stream
        ended), `failed` when its server did (it exited with an error, or broke off the answer).
        """
        records = []
        while self._pending:
            _, pending = self._pending.popitem(last=False)
            self._complete(pending, status)
            pending.record.error = {"category": category, **(detail or {})}
            records.append(self._finished(pending.record))
        return records

    @property
    def open_requests(self) -> int:
        """How many recorded requests still wait for an answer."""
        return len(self._pending)

    # -- requests ----------------------------------------------------------------------------

    def _request(
        self, direction: Direction, method: str, message: dict[str, Any], wire_bytes: int
    ) -> list[ToolCallRecord]:
        key = _id_key(message.get("id"))
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        if direction == CLIENT_TO_SERVER:
            self._learn_from_request(method, params, key)
        recorded = CLIENT_METHODS if direction == CLIENT_TO_SERVER else SERVER_METHODS
        if key is None or method not in recorded:
            return []
        identity = self.identity
        record = ToolCallRecord(
            call_id=new_call_id(),
            session_id=identity.session_id,
            transport=identity.transport,
            direction=direction,
            method=method,
            jsonrpc_id=key[1],
            started_at=time.time(),
            rollout_id=identity.rollout_id,
            protocol={"era": identity.era, "version": identity.version},
            client=identity.client,
            server=identity.server,
            request_bytes=wire_bytes,
        )
        pending = _Pending(record, time.monotonic())
        self._describe_request(pending, method, params)
        finished: list[ToolCallRecord] = []
        slot = (direction, key)
        if slot in self._pending:
            self.stats.duplicate_ids += 1
            old = self._pending.pop(slot)
            self._complete(old, "incomplete")
            old.record.error = {"category": "id_reused"}
            finished.append(self._finished(old.record))
        self._pending[slot] = pending
        if len(self._pending) > MAX_PENDING:
            _, oldest = self._pending.popitem(last=False)
            self.stats.evicted += 1
            self._complete(oldest, "incomplete")
            oldest.record.error = {"category": "pending_limit"}
            finished.append(self._finished(oldest.record))
        return finished

    def _learn_from_request(self, method: str, params: dict[str, Any], key: tuple[str, int | str] | None) -> None:
        identity = self.identity
        if method == "initialize":
            identity.era = "handshake"
            if isinstance(params.get("protocolVersion"), str):
                identity.version = params["protocolVersion"][:64]
            identity.client = _implementation(params.get("clientInfo")) or identity.client
            self._initialize_id = key
            return
        meta = params.get(_META)
        if isinstance(meta, dict) and isinstance(meta.get(_VERSION_KEY), str):
            identity.era = "stateless"
            identity.version = meta[_VERSION_KEY][:64]
            identity.client = _implementation(meta.get(_CLIENT_INFO_KEY)) or identity.client

    def _describe_request(self, pending: _Pending, method: str, params: dict[str, Any]) -> None:
        record = pending.record
        if method in ("tools/call", "prompts/get"):
            name = params.get("name")
            record.name = name[:500] if isinstance(name, str) else None
            arguments = params.get("arguments")
            if arguments is not None:
                record.arguments, record.arguments_bytes, record.arguments_truncated = bounded_json(
                    arguments, self.arguments_budget
                )
        elif method == "resources/read":
            uri = params.get("uri")
            record.name = uri[:2000] if isinstance(uri, str) else None
        elif method == "elicitation/create":
            schema = params.get("requestedSchema")
            fields = (
                sorted(schema["properties"])[:100]
                if isinstance(schema, dict) and isinstance(schema.get("properties"), dict)
                else None
            )
            record.arguments = {"mode": params.get("mode"), "requested_fields": fields}
        elif method == "sampling/createMessage":
            messages = params.get("messages")
            record.arguments = {
                "messages": len(messages) if isinstance(messages, list) else None,
                "max_tokens": params.get("maxTokens") if isinstance(params.get("maxTokens"), int) else None,
            }
        self._link_retry(pending, method, params)

    def _link_retry(self, pending: _Pending, method: str, params: dict[str, Any]) -> None:
        """Link a stateless-protocol retry to the leg that answered `input_required`."""
        state = params.get("requestState")
        responses = params.get("inputResponses")
        if state is None and responses is None:
            return
        links = self._parent if self._parent is not None else self
        previous: _Pending | None = None
        linked_by = None
        if isinstance(state, str):
            previous = links._by_state.pop(digest(state, links.identity.digest_key), None)
            linked_by = "request_state"
        if previous is None:
            candidates = links._by_request.get(_request_key(method, pending.record))
            if candidates is not None and len(candidates) == 1:
                previous = candidates.pop()
                linked_by = "same_request"
        record = pending.record
        if isinstance(responses, dict):
            kinds = previous.input_keys if previous is not None else {}
            secret = self.identity.digest_key
            entries = [_input_response(str(key), value, kinds, secret) for key, value in list(responses.items())[:100]]
            record.input = {"responses": entries}
        if isinstance(state, str):
            record.input = {**(record.input or {}), "request_state": digest(state, links.identity.digest_key)}
        if previous is not None:
            before = previous.record.retry or {}
            record.retry = {
                "of": previous.record.call_id,
                "original": before.get("original", previous.record.call_id),
                "round": int(before.get("round", 0)) + 1,
                "linked_by": linked_by,
            }

    # -- responses ---------------------------------------------------------------------------

    def _response(self, direction: Direction, message: dict[str, Any], wire_bytes: int) -> list[ToolCallRecord]:
        key = _id_key(message.get("id"))
        if key is not None and key == self._initialize_id and direction == SERVER_TO_CLIENT:
            self._learn_from_initialize(message.get("result"))
        if key is None:
            self.stats.unmatched_responses += 1
            return []
        pending = self._pending.pop((_other(direction), key), None)
        if pending is None:
            if key != self._initialize_id:
                self.stats.unmatched_responses += 1
            return []
        record = pending.record
        record.response_bytes = wire_bytes
        error = message.get("error")
        if "error" in message:
            self._complete(pending, "failed")
            record.error = _jsonrpc_error(error)
            return [self._finished(record)]
        result = message.get("result")
        self._learn_from_result(result)
        record.server = self.identity.server
        self._complete(pending, "completed")
        self._describe_result(pending, result)
        return [self._finished(record)]

    def _learn_from_initialize(self, result: Any) -> None:
        if not isinstance(result, dict):
            return
        if isinstance(result.get("protocolVersion"), str):
            self.identity.version = result["protocolVersion"][:64]
        self.identity.server = _implementation(result.get("serverInfo")) or self.identity.server

    def _learn_from_result(self, result: Any) -> None:
        meta = result.get(_META) if isinstance(result, dict) else None
        if isinstance(meta, dict):
            self.identity.server = _implementation(meta.get(_SERVER_INFO_KEY)) or self.identity.server

    def _describe_result(self, pending: _Pending, result: Any) -> None:
        record = pending.record
        method = record.method
        result_type = result.get("resultType") if isinstance(result, dict) else None
        record.result_type = result_type if isinstance(result_type, str) else None
        if record.result_type == "input_required" and isinstance(result, dict):
            record.status = "input_required"
            self._expect_retry(pending, result)
            return
        if method == "elicitation/create":
            record.result = _elicitation_result(result, self.identity.digest_key)
            return
        if method == "sampling/createMessage":
            record.result = _sampling_result(result)
            return
        record.result = summarize_result(method, result, budget=self.content_budget)
        if method == "tools/call" and isinstance(result, dict):
            is_error = result.get("isError")
            record.is_error = bool(is_error) if isinstance(is_error, bool) else False
            if record.is_error:
                record.status = "failed"
                record.error = {"category": "tool_error"}

    def _expect_retry(self, pending: _Pending, result: dict[str, Any]) -> None:
        record = pending.record
        requests = result.get("inputRequests")
        asked = []
        if isinstance(requests, dict):
            for key, request in list(requests.items())[:100]:
                method = request.get("method") if isinstance(request, dict) else None
                pending.input_keys[str(key)] = method if isinstance(method, str) else "unknown"
                asked.append({"key": str(key)[:200], "method": pending.input_keys[str(key)]})
        state = result.get("requestState")
        record.result = {"input_requests": asked, "result_bytes": bounded_json(result, 0)[1]}
        links = self._parent if self._parent is not None else self
        if isinstance(state, str):
            state_digest = digest(state, links.identity.digest_key)  # a state may carry answers in the clear
            record.result["request_state"] = state_digest
            links._by_state[state_digest] = pending
            while len(links._by_state) > MAX_RETRY_LINKS:
                links._by_state.popitem(last=False)
        else:
            links._by_request.setdefault(_request_key(record.method, record), []).append(pending)
            while len(links._by_request) > MAX_RETRY_LINKS:
                links._by_request.popitem(last=False)

    # -- cancellation and finishing ----------------------------------------------------------

    def _cancelled(self, direction: Direction, message: dict[str, Any]) -> list[ToolCallRecord]:
        params = message.get("params")
        key = _id_key(params.get("requestId")) if isinstance(params, dict) else None
        # The sender of the cancellation is the side that asked.
        pending = self._pending.pop((direction, key), None) if key is not None else None
        if pending is None:
            return []
        self._complete(pending, "cancelled")
        pending.record.error = {"category": "cancelled"}
        return [self._finished(pending.record)]

    def _complete(self, pending: _Pending, status: str) -> None:
        record = pending.record
        record.status = status
        record.completed_at = time.time()
        record.duration_ms = round((time.monotonic() - pending.started) * 1000.0, 3)

    def _finished(self, record: ToolCallRecord) -> ToolCallRecord:
        self.stats.records += 1
        return record


def _request_key(method: str, record: ToolCallRecord) -> str:
    return digest([method, record.name, record.arguments, record.arguments_bytes])


def _jsonrpc_error(error: Any) -> dict[str, Any]:
    if not isinstance(error, dict):
        return {"category": "jsonrpc_error", "code": None, "message": None}
    code = error.get("code")
    message = error.get("message")
    return {
        "category": "jsonrpc_error",
        "code": code if isinstance(code, int) and not isinstance(code, bool) else None,
        "message": message[:ERROR_MESSAGE_CHARS] if isinstance(message, str) else None,
    }


def _elicitation_result(result: Any, key: bytes) -> dict[str, Any]:
    """An elicitation's outcome: the action and a digest of the value, never the value."""
    if not isinstance(result, dict):
        return {"action": None, "content_digest": None}
    content = result.get("content")
    action = result.get("action")
    return {
        "action": action if isinstance(action, str) else None,
        "content_digest": digest(content, key) if content is not None else None,
        "content_fields": sorted(content)[:100] if isinstance(content, dict) else None,
    }


def _sampling_result(result: Any) -> dict[str, Any]:
    if not isinstance(result, dict):
        return {"model": None}
    keep = {"model": result.get("model"), "stop_reason": result.get("stopReason"), "role": result.get("role")}
    summary: dict[str, Any] = {key: value if isinstance(value, str) else None for key, value in keep.items()}
    summary["result_bytes"] = bounded_json(result, 0)[1]
    return summary


def _input_response(key: str, value: Any, kinds: dict[str, str], secret: bytes) -> dict[str, Any]:
    """One stateless-protocol input response: its kind, action and a digest, never its content."""
    kind = kinds.get(key)
    entry: dict[str, Any] = {"key": key[:200], "method": kind}
    if isinstance(value, dict) and (kind == "elicitation/create" or "action" in value):
        action = value.get("action")
        entry["action"] = action if isinstance(action, str) else None
        entry["content_digest"] = digest(value["content"], secret) if value.get("content") is not None else None
    else:
        entry["digest"] = digest(value, secret)
    return entry
