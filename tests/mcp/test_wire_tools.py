"""Tool attempts filled from MCP records on the wire: only where the agent reported nothing, each record once."""

from __future__ import annotations

from typing import Any

from llmtap.mcp.records import ToolCallRecord, new_call_id
from llmtap.rollouts.wire_tools import fill_from_wire


def wire(name: str, arguments: Any, started_at: float, status: str = "completed") -> ToolCallRecord:
    return ToolCallRecord(
        call_id=new_call_id(), session_id="s", transport="stdio", direction="client_to_server", method="tools/call",
        jsonrpc_id=1, started_at=started_at, status=status, completed_at=started_at + 0.25, duration_ms=250.0,
        name=name, arguments=arguments, arguments_bytes=13, result={"result_bytes": 40, "content_items": 1},
        is_error=status == "failed",
    )  # fmt: skip


def attempt(name: str, arguments: str, asked_by: str, **reported: Any) -> dict[str, Any]:
    entry = {"tool_name": name, "arguments": arguments, "requested_by_model_call_id": asked_by, "hosted": False}
    entry.update({"status": "unknown", "started_at": None, "completed_at": None, "duration_ms": None, "timing_source": None})
    entry.update(reported)
    return entry


def test_an_unreported_attempt_takes_the_wire_records_status_and_timing() -> None:
    first, second = wire("add", {"a": 1, "b": 2}, 10.0), wire("add", {"a": 3, "b": 4}, 20.0, status="failed")
    entries = [attempt("add", '{"a": 3, "b": 4}', "m1"), attempt("add", '{"a": 1, "b": 2}', "m0")]
    assert fill_from_wire(entries, [second, first], {"m0": 9.5, "m1": 19.0}) == 2
    late, early = entries
    assert early["started_at"] == 10.0 and early["duration_ms"] == 250.0 and early["status"] == "completed"
    assert early["timing_source"] == "mcp_wire" and early["tool_execution"]["mcp_call_id"] == first.call_id
    assert early["tool_execution"]["result_bytes"] == 40
    assert late["status"] == "failed" and late["tool_execution"]["is_error"] is True  # matched by its arguments


def test_what_the_agent_reported_wins() -> None:
    reported = attempt("add", '{"a": 1}', "m0", status="completed", started_at=5.0, duration_ms=1.0, timing_source="agent")
    before = dict(reported)
    assert fill_from_wire([reported], [wire("add", {"a": 1}, 10.0)], {"m0": 4.0}) == 0
    assert reported == before


def test_a_record_joins_one_attempt_and_never_one_asked_after_it_started() -> None:
    record = wire("add", {"a": 1}, 10.0)
    twice = [attempt("add", '{"a": 1}', "m0"), attempt("add", '{"a": 1}', "m0")]
    assert fill_from_wire(twice, [record], {"m0": 9.0}) == 1
    assert twice[1]["timing_source"] is None
    asked_later = [attempt("add", '{"a": 1}', "m1")]
    assert fill_from_wire(asked_later, [wire("add", {"a": 1}, 10.0)], {"m1": 15.0}) == 0  # the call ran before it was asked
    other_tool = [attempt("mul", '{"a": 1}', "m0")]
    assert fill_from_wire(other_tool, [wire("add", {"a": 1}, 10.0)], {"m0": 9.0}) == 0
    cut_short = [attempt("add", {"_raw": '{"a": 1'}, "m0")]  # type: ignore[arg-type]
    assert fill_from_wire(cut_short, [wire("add", {}, 10.0, status="failed")], {"m0": 9.0}) == 1
