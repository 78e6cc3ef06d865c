"""Zero-code MCP capture: the `mcp` SDK's client requests become tool-call records, with no proxy configured.

Every request an `mcp` client makes (stdio, streamable HTTP, in memory; `ClientSession` directly
or through `mcp.client.Client`) goes through `ClientSession.send_request`, so that one method is
the choke point patched here. A `tools/call`, `tools/list`, `resources/read` or `prompts/get`
becomes one `ToolCallRecord` (`mcp.records`: tool name, arguments, bounded result, `isError`,
status, timing, the JSON-RPC error), the same line the proxies write; other requests
(`initialize`, `ping`) pass untouched. Under an intervention replay that replaces a tool result
(`replay.intervention`), that `tools/call` is answered here without asking the server, and its
record says so (`protocol.replay = "replaced"`). The result is described from what the SDK returned
(its model dumped as JSON), never by reading the wire.

Where the record goes: under `llmtap run`, one spool frame (`spool.frame.KIND_TOOL_CALL`) that the
run's recorder appends to the capsule's `tool-calls.jsonl`; under `llmtap.capture()`,
`<rollout_id>.tool-calls.jsonl` beside the capture's model calls (`store.tool_calls`), written
on a worker thread before the call returns. Fail-open: a recording failure is counted in the
capture's health (`hook_failed`) and the request's own result or exception reaches the caller
unchanged. The hook is installed only when the workload imports `mcp.client.session`.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from .base import Hook, Patch, replaced_tool_result

__all__ = ["RECORDED_METHODS", "McpClientHook"]

RECORDED_METHODS = frozenset({"tools/call", "tools/list", "resources/read", "prompts/get"})
_NAME_KEYS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
_SESSION_IDS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _session_id(client_session: Any) -> str:
    """One id per SDK session object, so a reader can group a session's calls."""
    try:
        found = _SESSION_IDS.get(client_session)
        if found is None:
            import uuid

            found = _SESSION_IDS[client_session] = f"sdk_{uuid.uuid4().hex}"
        return found
    except TypeError:  # not weakly referenceable: each call its own session
        import uuid

        return f"sdk_{uuid.uuid4().hex}"


def _request_fields(request: Any) -> tuple[str | None, dict[str, Any] | None]:
    """The request's method and params as the SDK will send them; (None, None) when unreadable."""
    try:
        method = getattr(request, "method", None)
        if not isinstance(method, str) or method not in RECORDED_METHODS:
            return None, None
        params = getattr(request, "params", None)
        dumped = params.model_dump(by_alias=True, mode="json", exclude_none=True) if params is not None else {}
        return method, dumped if isinstance(dumped, dict) else {}
    except Exception:  # an SDK model we cannot read: the call is not recorded, never disturbed
        return None, None


def _new_record(client_session: Any, method: str, params: dict[str, Any]) -> Any:
    from ..mcp.records import DEFAULT_ARGUMENTS_BUDGET, ToolCallRecord, bounded_json, new_call_id
    from .session import _explicit_rollout_id, active_session

    session = active_session()
    if session is None:
        return None, None
    record = ToolCallRecord(
        call_id=new_call_id(),
        session_id=_session_id(client_session),
        transport="sdk",
        direction="client_to_server",
        method=method,
        jsonrpc_id=None,
        started_at=time.time(),
        rollout_id=_explicit_rollout_id() or session.default_rollout_id,
    )
    record.protocol = {"capture": "zero_code_hook"}
    name = params.get(_NAME_KEYS.get(method, ""))
    record.name = name[:1000] if isinstance(name, str) else None
    if method in ("tools/call", "prompts/get"):
        kept, size, cut = bounded_json(params.get("arguments"), DEFAULT_ARGUMENTS_BUDGET)
        record.arguments, record.arguments_bytes, record.arguments_truncated = kept, size, cut
    return session, record


def _describe_result(record: Any, result: Any) -> None:
    from ..mcp.records import summarize_result

    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True) if hasattr(result, "model_dump") else result
    record.status = "completed"
    result_type = dumped.get("resultType") if isinstance(dumped, dict) else None
    record.result_type = result_type if isinstance(result_type, str) else None
    if record.result_type == "input_required":
        record.status = "input_required"
        return
    record.result = summarize_result(record.method, dumped)
    if record.method == "tools/call" and isinstance(dumped, dict):
        record.is_error = dumped.get("isError") is True
        if record.is_error:
            record.status = "failed"
            record.error = {"category": "tool_error"}


def _describe_exception(record: Any, exc: BaseException) -> None:
    from ..mcp.records import ERROR_MESSAGE_CHARS

    record.status = "cancelled" if _is_cancellation(exc) else "failed"
    error = getattr(exc, "error", None)
    code = getattr(error, "code", None)
    message = getattr(error, "message", None)
    if isinstance(code, int) and not isinstance(code, bool):
        # an error the server answered (the MCP error's message is the server's, as a proxy records it)
        record.error = {
            "category": "jsonrpc_error",
            "code": code,
            "message": message[:ERROR_MESSAGE_CHARS] if isinstance(message, str) else None,
        }
    else:
        record.error = {"category": "cancelled" if record.status == "cancelled" else "client_error", "type": type(exc).__name__}


def _is_cancellation(exc: BaseException) -> bool:
    import asyncio

    return isinstance(exc, asyncio.CancelledError) or type(exc).__name__ == "Cancelled"


async def _deliver(session: Any, record: Any) -> None:
    """Hand a finished record to the capture: a spool frame, or the store on a worker thread."""
    from ..spool.frame import KIND_TOOL_CALL

    spool_sink = getattr(session.sink, "put_event", None)
    if session.spool is not None and spool_sink is not None:
        if not spool_sink(KIND_TOOL_CALL, record.to_dict()):
            session.failure("record_write_failed", "mcp")
        return
    import anyio.to_thread

    from ..store.tool_calls import RolloutToolCallSink

    sink = RolloutToolCallSink(session.store_root, default_rollout_id=session.default_rollout_id)
    await anyio.to_thread.run_sync(sink.write, [record])


def _make_send_request(original: Any) -> Any:
    async def send_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        method, params = _request_fields(request)
        if method is None or params is None:
            return await original(self, request, *args, **kwargs)
        # An intervention replay may answer this tool call itself ("what if the tool had returned X").
        replaced = replaced_tool_result(params.get("name")) if method == "tools/call" else None
        session = record = None
        try:
            session, record = _new_record(self, method, params)
        except Exception as exc:
            _count_failure(exc)
        if record is None:
            return replaced if replaced is not None else await original(self, request, *args, **kwargs)
        if replaced is not None:
            record.protocol["replay"] = "replaced"  # the server was not asked: the intervention answered
        started = time.monotonic()
        try:
            result = replaced if replaced is not None else await original(self, request, *args, **kwargs)
        except BaseException as exc:
            await _finish(session, record, started, None, exc)
            raise
        await _finish(session, record, started, result, None)
        return result

    return send_request


async def _finish(session: Any, record: Any, started: float, result: Any, exc: BaseException | None) -> None:
    """Complete and deliver one record; never raises (a cancellation in flight is not waited on)."""
    try:
        record.completed_at = time.time()
        record.duration_ms = round((time.monotonic() - started) * 1000.0, 3)
        if exc is not None:
            _describe_exception(record, exc)
        else:
            _describe_result(record, result)
        if exc is not None and _is_cancellation(exc):
            _deliver_now(session, record)  # awaiting in a cancelled scope would be cancelled again
        else:
            await _deliver(session, record)
    except Exception as failure:
        try:
            session.failure("hook_failed", "mcp", failure)
        except Exception:
            pass


def _deliver_now(session: Any, record: Any) -> None:
    from ..spool.frame import KIND_TOOL_CALL

    if session.spool is not None and hasattr(session.sink, "put_event"):
        session.sink.put_event(KIND_TOOL_CALL, record.to_dict())
        return
    from ..store.tool_calls import RolloutToolCallSink

    RolloutToolCallSink(session.store_root, default_rollout_id=session.default_rollout_id).write([record])


def _count_failure(exc: BaseException) -> None:
    from .session import active_session

    session = active_session()
    if session is not None:
        session.failure("hook_failed", "mcp", exc)


class McpClientHook(Hook):
    """Patches `mcp.client.session.ClientSession.send_request`: one record per recorded request."""

    name = "mcp"
    module_name = "mcp.client.session"

    def _make_patches(self, module: Any) -> list[Patch]:
        owner = module.ClientSession
        if "send_request" not in owner.__dict__:
            raise AttributeError("ClientSession.send_request")  # a layout this hook does not know
        return [Patch(owner, "send_request", _make_send_request)]
