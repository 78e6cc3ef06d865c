"""MCP tool calls: the stdio and streamable-HTTP proxies and the `ToolCallRecord` lines they write."""

from __future__ import annotations

from .records import (
    RECORD_KIND,
    SCHEMA_VERSION,
    CountingToolCallSink,
    JsonlToolCallSink,
    ToolCallRecord,
    ToolCallRecordError,
    ToolCallSink,
    ToolCallSinkError,
    parse_tool_call_line,
)

__all__ = [
    "RECORD_KIND",
    "SCHEMA_VERSION",
    "CountingToolCallSink",
    "JsonlToolCallSink",
    "ToolCallRecord",
    "ToolCallRecordError",
    "ToolCallSink",
    "ToolCallSinkError",
    "parse_tool_call_line",
]
