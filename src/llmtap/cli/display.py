"""Rich renderings of captured calls and metrics, shared by the CLI and the demo."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from ..records import ModelCallRecord

__all__ = [
    "Column",
    "calls_table",
    "columns_table",
    "fit_columns",
    "format_value",
    "metrics_line",
    "model_calls_table",
    "print_table",
    "tokens_per_second",
]


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


def tokens_per_second(call: ModelCallRecord) -> float | None:
    """Output tokens per second of a stream after its first token; None when not a stream or unknown."""
    if not call.stream or call.tokens_out is None or call.latency_total_ms is None or call.latency_ttft_ms is None:
        return None
    generating_ms = call.latency_total_ms - call.latency_ttft_ms
    if generating_ms <= 0 or call.tokens_out <= 1:
        return None
    return round((call.tokens_out - 1) / (generating_ms / 1000.0), 1)


@dataclass(frozen=True)
class Column:
    """One table column: its header, how it is aligned, and how much it matters when space is short.

    `priority` 0 is shown at any width; higher numbers go first when the terminal is narrow.
    A `copyable` column (an id) is shown whole, folded onto more lines if need be, or not at all.
    """

    header: str
    priority: int = 0
    numeric: bool = False
    copyable: bool = False


_CELL_COST = 3  # a cell's padding (one space either side) and the column separator of box.SIMPLE_HEAD


def fit_columns(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int, *, wide: bool = False
) -> list[int]:
    """The positions of the columns to show in `width` characters: every priority-0 column, then the
    others in priority order until one does not fit whole; all of them with `wide`. Keeps the
    columns' order."""
    if wide:
        return list(range(len(columns)))
    needed = [
        max([len(column.header), *(len(row[position]) for row in rows)]) + _CELL_COST
        for position, column in enumerate(columns)
    ]
    chosen = {position for position, column in enumerate(columns) if column.priority == 0}
    used = sum(needed[position] for position in chosen) - 1  # no separator after the last column
    for position in sorted(set(range(len(columns))) - chosen, key=lambda p: (columns[p].priority, p)):
        if used + needed[position] > width:
            break  # never a less important column while a more important one is left out
        chosen.add(position)
        used += needed[position]
    return sorted(chosen)


def columns_table(
    title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]], *, width: int, wide: bool = False
) -> Table:
    """A table of the columns that fit `width` (all with `wide`); a caption names the ones left out."""
    shown = fit_columns(columns, rows, width, wide=wide)
    left_out = [columns[position].header for position in range(len(columns)) if position not in shown]
    caption = f"not shown at this width: {', '.join(left_out)} (--wide shows them)" if left_out else None
    table = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, caption=caption, caption_justify="left"
    )
    for position in shown:
        column = columns[position]
        # Folded onto more lines, never cut: an id or a model name is only useful whole. The
        # columns chosen fit the width, so only `wide` on a narrow terminal folds anything.
        table.add_column(column.header, justify="right" if column.numeric else "left", overflow="fold")
    for row in rows:
        table.add_row(*(row[position] for position in shown))
    return table


def print_table(console: Console, table: Table, *, wide: bool = False) -> None:
    """Print `table`; with `wide`, at its natural width even past the terminal's (lines run long
    rather than every cell folding into a narrow column)."""
    if wide:
        natural = Measurement.get(console, console.options.update_width(1 << 16), table).maximum
        if natural > console.width:
            Console(width=natural, file=console.file, force_terminal=console.is_terminal).print(table)
            return
    console.print(table)


_CALL_COLUMNS = (
    Column("#", 0, numeric=True),
    Column("model", 1),
    Column("status", 0, numeric=True),
    Column("error", 0),
    Column("in", 2, numeric=True),
    Column("out", 0, numeric=True),
    Column("ms", 3, numeric=True),
    Column("ttft", 4, numeric=True),
    Column("tok/s", 5, numeric=True),
    Column("finish", 6),
    Column("tools", 7),
    Column("reas", 8, numeric=True),
    Column("cached", 9, numeric=True),
    Column("dialect", 10),
    Column("response id", 11, copyable=True),
)


def calls_table(title: str, calls: Sequence[ModelCallRecord], *, width: int | None = None, wide: bool = False) -> Table:
    """One row per call: identity, outcome, tokens, timing and tool calls, in the columns that fit.

    `width` defaults to the terminal's; the key columns come first and the rest as space allows
    (all of them with `wide`). Streams show their output tokens per second after the first token.
    """
    rows = []
    for call in calls:
        error = call.error_category or ""
        if call.stream_truncated and error != "stream_truncated":
            error = f"{error} (truncated)".strip()
        rows.append((
            str(call.call_index),
            call.model or "-",
            format_value(call.status_code),
            error,
            format_value(call.tokens_in),
            format_value(call.tokens_out),
            format_value(call.latency_total_ms),
            format_value(call.latency_ttft_ms),
            format_value(tokens_per_second(call)),
            call.finish_reason_normalized or "-",
            ", ".join(str(tool.get("name")) for tool in call.tool_calls),
            format_value(call.tokens_reasoning),
            format_value(call.cached_tokens),
            call.dialect or "-",
            call.response_id or "-",
        ))  # fmt: skip
    return columns_table(title, _CALL_COLUMNS, rows, width=width or Console().width, wide=wide)


_MODEL_CALL_COLUMNS = (
    Column("call", 0, copyable=True),
    Column("status", 0),
    Column("in", 1, numeric=True),
    Column("out", 0, numeric=True),
    Column("ms", 2, numeric=True),
    Column("model", 3),
    Column("provider", 4),
    Column("operation", 5),
)


def model_calls_table(model_calls: Sequence[dict[str, Any]], *, width: int, wide: bool = False) -> Table:
    """A run capsule's `model-calls.jsonl` records (OTel GenAI attributes), in the columns that fit."""
    rows = []
    for call in model_calls:
        found = call.get("attributes")
        attributes: dict[str, Any] = found if isinstance(found, dict) else {}
        rows.append((
            f"{call.get('rollout_id')}#{call.get('call_index')}",
            str(call.get("status") or "-"),
            format_value(attributes.get("gen_ai.usage.input_tokens")),
            format_value(attributes.get("gen_ai.usage.output_tokens")),
            format_value(call.get("duration_ms")),
            str(attributes.get("gen_ai.response.model") or attributes.get("gen_ai.request.model") or "-"),
            str(attributes.get("gen_ai.provider.name") or "-"),
            str(call.get("name") or "-"),
        ))  # fmt: skip
    return columns_table("calls", _MODEL_CALL_COLUMNS, rows, width=width, wide=wide)


def metrics_line(metrics: dict[str, Any]) -> str:
    """The attachment metrics on one line; `-` marks what no provider reported."""
    return (
        f"calls {metrics['num_calls']}  errors {metrics['num_errors']}  "
        f"tokens in {format_value(metrics['tokens_in'])} out {format_value(metrics['tokens_out'])} "
        f"reasoning {format_value(metrics['tokens_reasoning'])} cached {format_value(metrics['cached_tokens'])}  "
        f"latency sum {format_value(metrics['latency_total_ms'])} ms, wall {format_value(metrics['wall_clock_ms'])} ms, "
        f"ttft p50 {format_value(metrics['latency_ttft_ms_p50'])} ms"
    )
