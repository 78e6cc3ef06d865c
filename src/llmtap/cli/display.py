"""Rich renderings of captured calls and metrics, shared by the CLI and the demo."""

from __future__ import annotations

from typing import Any, Sequence

from rich.table import Table

from ..records import ModelCallRecord

__all__ = ["calls_table", "format_value", "metrics_line"]

_NUMERIC = frozenset({"#", "in", "out", "reas", "cached", "ms", "ttft"})


def format_value(value: Any) -> str:
    """Show a value for people: `-` for unknown (None), thousands separators for numbers."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def calls_table(title: str, calls: Sequence[ModelCallRecord]) -> Table:
    """One row per call: identity, outcome, tokens, timing and tool calls."""
    table = Table(title=title, title_justify="left")
    for column in ("#", "dialect", "model", "status", "error", "finish", "in", "out", "reas", "cached", "ms", "ttft", "tools", "response id"):
        table.add_column(column, justify="right" if column in _NUMERIC else "left")
    for call in calls:
        error = call.error_category or ""
        if call.stream_truncated and error != "stream_truncated":
            error = f"{error} (truncated)".strip()
        table.add_row(
            str(call.call_index),
            call.dialect or "-",
            call.model or "-",
            format_value(call.status_code),
            error,
            call.finish_reason_normalized or "-",
            format_value(call.tokens_in),
            format_value(call.tokens_out),
            format_value(call.tokens_reasoning),
            format_value(call.cached_tokens),
            format_value(call.latency_total_ms),
            format_value(call.latency_ttft_ms),
            ", ".join(str(tool.get("name")) for tool in call.tool_calls),
            call.response_id or "-",
        )
    return table


def metrics_line(metrics: dict[str, Any]) -> str:
    """The attachment metrics on one line; `-` marks what no provider reported."""
    return (
        f"calls {metrics['num_calls']}  errors {metrics['num_errors']}  "
        f"tokens in {format_value(metrics['tokens_in'])} out {format_value(metrics['tokens_out'])} "
        f"reasoning {format_value(metrics['tokens_reasoning'])} cached {format_value(metrics['cached_tokens'])}  "
        f"latency sum {format_value(metrics['latency_total_ms'])} ms, wall {format_value(metrics['wall_clock_ms'])} ms, "
        f"ttft p50 {format_value(metrics['latency_ttft_ms_p50'])} ms"
    )
