"""`run_query` and `llmtap query`: the README's questions, answered over every fixture, against the records."""

from __future__ import annotations

import copy
import csv
import io
import json
import math
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmtap import CaptureStore, aggregate_model_call_metrics, read_model_call_records
from llmtap.cli import main
from llmtap.export.examples import QUESTIONS
from llmtap.export.query import run_query
from llmtap.export.sources import ExportError
from llmtap.export.tables import delivered_tool_results
from llmtap.records import ModelCallRecord
from tests.export.support import BASE_TIME, line_for
from tests.fixtures import RecordedExchange, fixture

Store = tuple[Path, dict[str, list[str]]]
README = Path(__file__).resolve().parents[2] / "README.md"

ERROR_RATE_BY_MODEL = QUESTIONS["error rate by model"]
P95_TTFT_BY_HOUR = QUESTIONS["p95 TTFT by hour"]
TOKENS_PER_ROLLOUT = QUESTIONS["tokens per rollout"]
TOOL_FAILURES = QUESTIONS["which tool fails most"]
ERRORS_BY_CATEGORY = QUESTIONS["errors by dialect and category"]


def _records(root: Path) -> list[tuple[str, ModelCallRecord]]:
    store = CaptureStore(root, create=False)
    return [(r, record) for r in store.rollouts() for record in read_model_call_records(store, r)]


def _quantile_cont(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def test_every_readme_query_is_in_the_readme() -> None:
    text = README.read_text()
    for sql in QUESTIONS.values():
        assert sql in text, sql.splitlines()[0]


def test_error_rate_by_model(fixture_store: Store, tmp_path: Path) -> None:
    root, _ = fixture_store
    result = run_query(ERROR_RATE_BY_MODEL, root, cache_dir=tmp_path / "cache")
    counts: dict[str | None, list[int]] = defaultdict(lambda: [0, 0])
    for _, record in _records(root):
        counts[record.model][0] += 1
        counts[record.model][1] += record.error_category is not None
    expected = sorted(
        ((model, calls, round(errors / calls, 3)) for model, (calls, errors) in counts.items()),
        key=lambda row: (-row[2], -row[1], row[0] or ""),
    )
    assert result.columns == ["model", "calls", "error_rate"]
    assert result.rows == expected
    assert any(rate > 0 for _, _, rate in result.rows)


def test_p95_ttft_by_hour(fixture_store: Store, tmp_path: Path) -> None:
    root, _ = fixture_store
    result = run_query(P95_TTFT_BY_HOUR, root, cache_dir=tmp_path / "cache")
    by_hour: dict[int, list[float]] = defaultdict(list)
    hours: set[int] = set()
    for _, record in _records(root):
        if record.stream:
            hour = int(record.started_at // 3600)
            hours.add(hour)
            if record.latency_ttft_ms is not None:
                by_hour[hour].append(record.latency_ttft_ms)
    assert [int(row[0].timestamp() // 3600) for row in result.rows] == sorted(hours)
    for hour_start, calls, p95 in result.rows:
        values = by_hour[int(hour_start.timestamp() // 3600)]
        assert calls == len(values)
        assert p95 == pytest.approx(_quantile_cont(values, 0.95)) if values else p95 is None
    assert len(result.rows) > 10


def test_tokens_per_rollout(fixture_store: Store, tmp_path: Path) -> None:
    root, rollouts = fixture_store
    result = run_query(TOKENS_PER_ROLLOUT, root, cache_dir=tmp_path / "cache")
    store = CaptureStore(root, create=False)
    expected = []
    for rollout_id in rollouts:
        metrics = aggregate_model_call_metrics(store, rollout_id)
        expected.append(
            (rollout_id, metrics["num_calls"], metrics["tokens_in"], metrics["tokens_out"], metrics["tokens_total"], None)
        )
    expected.sort(key=lambda row: (row[4] is None, -(row[4] or 0), row[0]))
    assert result.rows == expected[:20]


def _with_failed_tool_result(recorded: RecordedExchange) -> RecordedExchange:
    """The recorded Messages follow-up, its tool result marked as failed (`is_error`), as an agent sends it."""
    data = copy.deepcopy(recorded.data)
    for message in data["request"]["json"]["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else []:
            if block.get("type") == "tool_result":
                block["is_error"] = True
    return RecordedExchange(recorded.dialect, recorded.name + "-failed", data)


def test_which_tool_fails_most(tmp_path: Path) -> None:
    root = tmp_path / "model-calls"
    failed = _with_failed_tool_result(fixture("messages/tool-result-followup-sonnet4"))
    succeeded = fixture("messages/tool-result-followup-sonnet4")
    chat = fixture("chat/tool-result-followup-gpt4o")
    with CaptureStore(root) as store:
        for number, recorded in enumerate([failed, failed, succeeded, chat]):
            store.append("r-0", line_for(recorded, call_id=f"c{number}", rollout_id="r-0", started_at=BASE_TIME + number))
    result = run_query(TOOL_FAILURES, root, cache_dir=tmp_path / "cache")
    assert result.columns == ["tool", "results", "failures"]
    # Three Messages results for `weather`, two flagged failed; the chat result counts as a result (that API flags none).
    delivered = Counter(name for _, record in _records(root) for name in delivered_tool_results(record)[0])
    assert delivered["weather"] >= 3
    assert set(result.rows) == {(tool, count, 2 if tool == "weather" else 0) for tool, count in delivered.items()}
    assert result.rows[0][0] == "weather"


def test_errors_by_category(fixture_store: Store, tmp_path: Path) -> None:
    root, _ = fixture_store
    result = run_query(ERRORS_BY_CATEGORY, root, cache_dir=tmp_path / "cache")
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for _, record in _records(root):
        if record.error_category is not None:
            counts[(record.dialect or "", record.error_category)] += 1
    expected = sorted(((d, c, n) for (d, c), n in counts.items()), key=lambda row: (-row[2], row[0], row[1]))
    assert result.rows == expected


def test_rollouts_view_shows_the_newest_version(fixture_store: Store, tmp_path: Path) -> None:
    root = tmp_path / "model-calls"
    with CaptureStore(root) as store:
        store.append("r-1", line_for(fixture("chat/text-basic-gpt4o"), call_id="a", rollout_id="r-1", started_at=BASE_TIME))
    run_query("SELECT 1", root, cache_dir=tmp_path / "cache")
    with CaptureStore(root) as store:
        store.append("r-1", line_for(fixture("chat/text-basic-gpt4o"), call_id="b", rollout_id="r-1", started_at=BASE_TIME))
    result = run_query("SELECT rollout_id, num_calls, export_run FROM rollouts", root, cache_dir=tmp_path / "cache")
    assert result.rows == [("r-1", 2, 2)]
    assert run_query("SELECT count(*) FROM calls", tmp_path / "cache").rows == [(2,)]


def test_an_empty_store_gives_empty_tables(tmp_path: Path) -> None:
    root = tmp_path / "empty"
    root.mkdir()
    result = run_query("SELECT count(*) AS n FROM calls, rollouts", root, cache_dir=tmp_path / "cache")
    assert result.rows == [(0,)]


def test_bad_sql_is_a_one_line_error(fixture_store: Store, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="The query failed"):
        run_query("SELECT no_such_column FROM calls", fixture_store[0], cache_dir=tmp_path / "cache")


def test_cli_prints_a_table_csv_and_json(fixture_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = fixture_store
    monkeypatch.setenv("LLMTAP_CACHE_DIR", str(tmp_path / "cache"))
    runner = CliRunner()
    sql = "SELECT dialect, count(*) AS n, min(started_at) AS first FROM calls GROUP BY dialect ORDER BY dialect"
    table = runner.invoke(main, ["query", sql, str(root)])
    assert table.exit_code == 0, table.output
    assert "dialect" in table.output and "messages" in table.output and "3 rows" in table.output
    as_csv = runner.invoke(main, ["query", sql, str(root), "--csv"])
    rows = list(csv.reader(io.StringIO(as_csv.output)))
    assert rows[0] == ["dialect", "n", "first"] and [row[0] for row in rows[1:]] == ["chat", "messages", "responses"]
    as_json = runner.invoke(main, ["query", sql, str(root), "--json"])
    objects = [json.loads(line) for line in as_json.output.splitlines()]
    assert objects[0]["dialect"] == "chat" and objects[0]["first"].startswith("2026-01-01T")
    assert sum(item["n"] for item in objects) == 84
    bad = runner.invoke(main, ["query", "SELECT nope FROM calls", str(root)])
    assert bad.exit_code == 1 and "The query failed" in bad.output and "Traceback" not in bad.output
