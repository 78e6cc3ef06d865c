"""Printing a run comparison: a readable rich view, JSON (`DIFF_SCHEMA`), and GitHub Actions annotations."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .comparison import RunComparison, SideTotals
from .gate import GateResult

__all__ = ["DIFF_SCHEMA", "render_github", "render_text", "to_json"]

DIFF_SCHEMA = "llmtap.diff/1"
# How many differing rollouts the text view prints in full.
MAX_TEXT_ROLLOUTS = 50
MAX_TEXT_CALLS = 30


def _growth(before: float | None, after: float | None) -> dict[str, Any]:
    change = None if before is None or after is None or before == 0 else round((after - before) / before, 4)
    return {"before": before, "after": after, "change": change}


def _summary(comparison: RunComparison) -> dict[str, Any]:
    a, b = comparison.totals_a.to_dict(), comparison.totals_b.to_dict()
    return {
        "rollouts": comparison.rollout_counts,
        "calls": comparison.call_counts,
        "a": a,
        "b": b,
        "tokens_in": _growth(a["tokens"]["in"], b["tokens"]["in"]),
        "tokens_out": _growth(a["tokens"]["out"], b["tokens"]["out"]),
        "latency_p50_ms": _growth(a["latency_ms"]["p50"], b["latency_ms"]["p50"]),
        "latency_p95_ms": _growth(a["latency_ms"]["p95"], b["latency_ms"]["p95"]),
        "ttft_p95_ms": _growth(a["ttft_ms"]["p95"], b["ttft_ms"]["p95"]),
    }


def to_json(comparison: RunComparison, gate: GateResult | None) -> dict[str, Any]:
    """Return the comparison as JSON data: `schema`, `a`, `b`, `payloads`, `notes`, `summary`, `rollouts`, `gate`."""
    return {
        "schema": DIFF_SCHEMA,
        "a": comparison.a,
        "b": comparison.b,
        "payloads": comparison.payloads,
        "notes": comparison.notes,
        "summary": _summary(comparison),
        "rollouts": [rollout.to_dict() for rollout in comparison.rollouts],
        "gate": None if gate is None else gate.to_dict(),
    }


def _number(value: Any, unit: str = "") -> str:
    if value is None:
        return "?"
    if isinstance(value, float):
        return f"{value:,.1f}{unit}"
    return f"{value:,}{unit}"


def _totals_table(a: SideTotals, b: SideTotals) -> Table:
    table = Table(title="Runs", title_justify="left", show_edge=False)
    for column in ("", "A", "B"):
        table.add_column(column, justify="right" if column else "left")
    da, db = a.to_dict(), b.to_dict()
    rows = [
        ("rollouts", da["rollouts"], db["rollouts"]),
        ("calls", da["calls"], db["calls"]),
        ("errors", da["errors"], db["errors"]),
        ("tokens in", da["tokens"]["in"], db["tokens"]["in"]),
        ("tokens out", da["tokens"]["out"], db["tokens"]["out"]),
        ("tokens reasoning", da["tokens"]["reasoning"], db["tokens"]["reasoning"]),
        ("tokens cached", da["tokens"]["cached"], db["tokens"]["cached"]),
        ("latency p50 ms", da["latency_ms"]["p50"], db["latency_ms"]["p50"]),
        ("latency p95 ms", da["latency_ms"]["p95"], db["latency_ms"]["p95"]),
        ("TTFT p95 ms", da["ttft_ms"]["p95"], db["ttft_ms"]["p95"]),
        ("reward mean", da["reward_mean"], db["reward_mean"]),
    ]
    for name, before, after in rows:
        table.add_row(name, _number(before), _number(after))
    return table


_STYLE = {"changed": "yellow", "added": "green", "removed": "red", "unchanged": "dim"}


def _call_lines(call: dict[str, Any]) -> list[str]:
    status = call["status"]
    style = _STYLE[status]
    if status != "changed":
        index = call["call_index"]
        tools = ", ".join(call["tool_calls"]) or "-"
        return [
            f"  [{style}]{status}[/] call {index} ({call['endpoint']}, {escape(str(call['model']))}; tools: {escape(tools)})"
        ]
    lines = [f"  [{style}]changed[/] call {call['a_call_index']} → {call['b_call_index']} ({call['endpoint']})"]
    model = call["model"]
    if model["before"] != model["after"]:
        lines.append(f"    model: {escape(str(model['before']))} → {escape(str(model['after']))}")
    for difference in call["request"]["differences"]:
        where = (
            f"message {difference['message_index']}"
            if difference.get("message_index") is not None
            else difference["part"]
        )
        before, after = difference["before"] or "(absent)", difference["after"] or "(absent)"
        lines.append(f"    request {where} {escape(difference['pointer'])}: {escape(before)} → {escape(after)}")
    if call["request"]["more_differences"]:
        lines.append(f"    … {call['request']['more_differences']} more request differences")
    for line in call["response_text_diff"][2:]:  # the ---/+++ header says nothing here
        colour = "green" if line.startswith("+") else "red" if line.startswith("-") else "dim"
        lines.append(f"    [{colour}]{escape(line)}[/]")
    if call["tool_calls"] is not None:
        before = ", ".join(f"{c['name']}({c['arguments']})" for c in call["tool_calls"]["before"]) or "-"
        after = ", ".join(f"{c['name']}({c['arguments']})" for c in call["tool_calls"]["after"]) or "-"
        lines.append(f"    tool calls: {escape(before)} → {escape(after)}")
    if call["finish_reason"] is not None:
        lines.append(f"    finish reason: {call['finish_reason']['before']} → {call['finish_reason']['after']}")
    for name, change in call["tokens"].items():
        lines.append(f"    tokens {name}: {_number(change['before'])} → {_number(change['after'])}")
    if call["error"] is not None:
        error = call["error"]
        lines.append(
            f"    error: {error['before'] or 'none'} ({error['status_before']}) → {error['after'] or 'none'} ({error['status_after']})"
        )
    latency, ttft = call["latency_ms"], call["ttft_ms"]
    lines.append(
        f"    latency {_number(latency['before'], ' ms')} → {_number(latency['after'], ' ms')}, "
        f"TTFT {_number(ttft['before'], ' ms')} → {_number(ttft['after'], ' ms')}"
    )
    return lines


def render_text(comparison: RunComparison, gate: GateResult | None, console: Console) -> None:
    """Print the comparison for a person: counts, the rollouts that differ with their calls, run totals, the gate."""
    a, b = comparison.a, comparison.b
    console.print(f"[bold]A[/] {escape(a['path'])} ({a['kind']}, {a['rollouts']} rollouts)")
    console.print(f"[bold]B[/] {escape(b['path'])} ({b['kind']}, {b['rollouts']} rollouts)")
    for note in comparison.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    rc, cc = comparison.rollout_counts, comparison.call_counts
    console.print(
        f"rollouts: {rc['unchanged']} unchanged, {rc['changed']} changed, {rc['added']} added, {rc['removed']} removed; "
        f"calls: {cc['unchanged']} unchanged, {cc['changed']} changed, {cc['added']} added, {cc['removed']} removed"
    )
    for rollout in comparison.rollouts[:MAX_TEXT_ROLLOUTS]:
        style = _STYLE[rollout.status]
        counts = rollout.call_count
        head = f"[bold]rollout {escape(rollout.key)}[/] [{style}]{rollout.status}[/] (calls {_number(counts['before'])} → {_number(counts['after'])}"
        if rollout.reward["before"] is not None or rollout.reward["after"] is not None:
            head += f", reward {_number(rollout.reward['before'])} → {_number(rollout.reward['after'])}"
        console.print(head + ")")
        if rollout.tool_sequence is not None:
            before = " → ".join(rollout.tool_sequence["before"]) or "-"
            after = " → ".join(rollout.tool_sequence["after"]) or "-"
            console.print(f"  tools: {escape(before)}  ⇒  {escape(after)}")
        for call in rollout.calls[:MAX_TEXT_CALLS]:
            for line in _call_lines(call):
                console.print(line, highlight=False)
        if len(rollout.calls) > MAX_TEXT_CALLS:
            console.print(f"  … {len(rollout.calls) - MAX_TEXT_CALLS} more calls (use --json for all).")
    if len(comparison.rollouts) > MAX_TEXT_ROLLOUTS:
        console.print(f"… {len(comparison.rollouts) - MAX_TEXT_ROLLOUTS} more differing rollouts (use --json for all).")
    console.print(_totals_table(comparison.totals_a, comparison.totals_b))
    if gate is not None:
        _render_gate(gate, console)


def _render_gate(gate: GateResult, console: Console) -> None:
    for item in gate.unchecked:
        console.print(f"[yellow]gate: not checked:[/] {escape(item)}")
    if gate.passed:
        console.print("[green]gate: no regressions[/]")
        return
    console.print("[red bold]gate: regressions[/]")
    for reason in gate.reasons:
        console.print(f"  [red]{reason.code}[/] {escape(reason.message)}")
    for code, count in gate.unlisted.items():
        console.print(f"  [red]{code}[/] … and {count} more")


def _annotation_value(text: str) -> str:
    """Escape a value for a workflow command (GitHub's rules: %, CR, LF; and , : in properties)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _annotation_value(text).replace(":", "%3A").replace(",", "%2C")


def render_github(comparison: RunComparison, gate: GateResult | None) -> list[str]:
    """Return GitHub Actions annotation lines: `::error` per gate reason, `::warning` per changed rollout, a `::notice` summary."""
    lines: list[str] = []
    failing = {reason.rollout for reason in gate.reasons} if gate is not None else set()
    if gate is not None:
        for reason in gate.reasons:
            where = ""
            if reason.file is not None:
                where = (
                    f" file={_property(reason.file)}"
                    + (f",line={reason.line}" if reason.line is not None else "")
                    + ","
                )
            lines.append(
                f"::error{where or ' '}title={_property('llmtap diff: ' + reason.code)}::{_annotation_value(reason.message)}"
            )
        for code, count in gate.unlisted.items():
            lines.append(
                f"::error title={_property('llmtap diff: ' + code)}::{count} more {code} reasons (see --json)."
            )
        for item in gate.unchecked:
            lines.append(f"::warning title=llmtap diff%3A unchecked::{_annotation_value(item)}")
    for rollout in comparison.rollouts:
        if rollout.key in failing or rollout.status != "changed":
            continue
        file = f" file={_property(rollout.file_b)}," if rollout.file_b else " "
        counts = rollout.counts
        lines.append(
            f"::warning{file}title={_property('llmtap diff: rollout ' + rollout.key)}::"
            f"{counts['changed']} changed, {counts['added']} added, {counts['removed']} removed calls"
        )
    cc = comparison.call_counts
    lines.append(
        f"::notice title=llmtap diff::calls {cc['unchanged']} unchanged, {cc['changed']} changed, "
        f"{cc['added']} added, {cc['removed']} removed"
    )
    return lines
