"""Terminal tables that fit their width: key columns first, the rest while they fit, ids never cut."""

from __future__ import annotations

import io
from pathlib import Path

from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from llmtap import CaptureStore, read_model_call_records
from llmtap.cli import main
from llmtap.cli.display import Column, calls_table, fit_columns, print_table, tokens_per_second
from tests.fixtures import fixture
from tests.view.stores import T0, capture_line


def _store(root: Path) -> None:
    with CaptureStore(root) as store:
        store.append(
            "0-0",
            capture_line(fixture("responses/text-basic-stream-gpt55"), started_at=T0, latency_ms=1500.0, ttft_ms=420.0),
        )
        store.append(
            "0-0", capture_line(fixture("responses/error-401-invalid-api-key"), started_at=T0 + 2, latency_ms=90.0)
        )


def _render(table: object, width: int, *, wide: bool = False) -> str:
    out = io.StringIO()
    print_table(Console(file=out, width=width, force_terminal=False), table, wide=wide)  # type: ignore[arg-type]
    return out.getvalue()


def test_records_show_in_80_columns_keeps_the_key_columns_whole_and_names_the_rest(tmp_path: Path) -> None:
    _store(tmp_path)
    result = CliRunner().invoke(main, ["records", "show", str(tmp_path), "0-0"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("#"))
    assert all(name in header.split() for name in ("#", "model", "status", "error", "out"))
    assert "…" not in result.output and all(len(line) <= 80 for line in lines)
    assert "gpt-5.5-2026-04-23" in result.output and "auth" in result.output  # whole, not cut to `gp…`
    assert "response id (--wide shows them)" in " ".join(result.output.split())


def test_wide_shows_every_column_and_the_whole_response_id(tmp_path: Path) -> None:
    _store(tmp_path)
    [record, _] = read_model_call_records(CaptureStore(tmp_path, create=False), "0-0")
    result = CliRunner().invoke(main, ["records", "show", str(tmp_path), "0-0", "--wide"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert record.response_id is not None and record.response_id in result.output
    assert all(name in result.output for name in ("dialect", "cached", "finish", "tok/s", "response id"))
    assert "not shown" not in result.output


def test_a_stream_shows_its_tokens_per_second_after_the_first_token(tmp_path: Path) -> None:
    _store(tmp_path)
    stream, failed = read_model_call_records(CaptureStore(tmp_path, create=False), "0-0")
    assert stream.stream and stream.tokens_out is not None
    assert tokens_per_second(stream) == round((stream.tokens_out - 1) / ((1500.0 - 420.0) / 1000), 1)
    assert tokens_per_second(failed) is None
    assert "tok/s" in _render(calls_table("t", [stream], width=200), 200)


def test_the_columns_a_user_must_copy_are_shown_whole_or_not_at_all() -> None:
    long_id = "resp_" + "0123456789abcdef" * 4
    columns = [Column("#", 0, numeric=True), Column("id", 3, copyable=True), Column("note", 1)]
    rows = [("1", long_id, "x" * 10)]
    narrow = fit_columns(columns, rows, 40)
    assert narrow == [0, 2]  # the id does not fit whole, so it is left out rather than cut
    assert fit_columns(columns, rows, 200) == [0, 1, 2]


@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(1, 30)), min_size=1, max_size=12),
    st.integers(10, 300),
    st.integers(0, 100),
)
def test_fitting_keeps_every_key_column_stays_within_the_width_and_grows_with_it(
    specs: list[tuple[int, int]], width: int, more: int
) -> None:
    columns = [Column(f"c{n}", priority) for n, (priority, _) in enumerate(specs)]
    rows = [tuple("x" * size for _, size in specs)]
    chosen = fit_columns(columns, rows, width)
    keys = [n for n, (priority, _) in enumerate(specs) if priority == 0]
    assert set(keys) <= set(chosen) and chosen == sorted(chosen)
    used = sum(max(len(columns[n].header), specs[n][1]) + 3 for n in chosen) - 1
    assert used <= width or set(chosen) == set(keys)
    assert set(fit_columns(columns, rows, width + more)) >= set(chosen) or more == 0


def test_runs_show_lists_a_capsules_calls_in_the_columns_that_fit(tmp_path: Path) -> None:
    import llmtap

    with llmtap.capture(runs_dir=tmp_path / "runs") as run:
        assert run.capsule_dir is not None
        with CaptureStore(run.capsule_dir / "calls") as store:
            store.append("task-7", capture_line(fixture("chat/text-basic-gpt4o"), started_at=T0, latency_ms=120.0))
    command = ["runs", "show", "latest", "--capsule-dir", str(tmp_path / "runs")]
    narrow = CliRunner().invoke(main, command, env={"COLUMNS": "60"})
    assert narrow.exit_code == 0, narrow.output
    table = narrow.output[narrow.output.index("health") :].split("\n", 1)[1]  # the lines after the run's facts
    assert "task-7#0" in table and all(len(line) <= 60 for line in table.splitlines())
    assert "not shown at this width" in table
    wide = CliRunner().invoke(main, [*command, "--wide"], env={"COLUMNS": "60"})
    assert "task-7#0" in wide.output and "gpt-4o-2024-08-06" in wide.output and "not shown" not in wide.output
