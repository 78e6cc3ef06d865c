"""The per-directory index: one listing, summaries parsed once and extended from appended lines only."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmtap import CaptureStore, read_model_call_records
from llmtap.store.readers import aggregate_model_call_metrics
from llmtap.view import index as index_module
from llmtap.view import query as query_module
from llmtap.view.index import CaptureIndex
from llmtap.view.query import Query, run_query
from tests.fixtures import fixture
from tests.view.stores import T0, capture_line


def test_listing_orders_ids_naturally_and_flags_markers_and_links(
    capture_dir: tuple[Path, dict[str, list[str]]],
) -> None:
    root, _ = capture_dir
    (root / "7-0.capture.incomplete").write_text("write failed\n")
    (root / "8-0.capture.jsonl").symlink_to(root / "0-0.capture.jsonl")
    (root / "not valid!.capture.jsonl").write_text("")
    index = CaptureIndex(str(root))
    index.refresh()
    assert index.order == ["0-0", "1-0", "2-0", "3-0", "4-0", "7-0", "8-0", "10-0", "xss-0"]
    assert index.files["7-0"].incomplete and index.files["7-0"].state is None
    summary = index.summary("8-0")  # the one lstat of a shown row finds the link, and never reads through it
    assert summary is not None and summary.calls == 0
    assert index.files["8-0"].refused and index.files["8-0"].state is None


def test_summaries_agree_with_the_public_metrics(capture_dir: tuple[Path, dict[str, list[str]]]) -> None:
    root, _ = capture_dir
    index = CaptureIndex(str(root))
    index.refresh()
    store = CaptureStore(root, create=False)
    for rollout_id in store.rollouts():
        summary = index.summary(rollout_id)
        metrics = aggregate_model_call_metrics(store, rollout_id)
        assert summary is not None
        assert (summary.calls, summary.num_errors, summary.errors) == (
            metrics["num_calls"],
            metrics["num_errors"],
            metrics["errors_by_category"],
        )
        assert (summary.tokens_in, summary.tokens_out, summary.tokens_reasoning, summary.cached_tokens) == (
            metrics["tokens_in"], metrics["tokens_out"], metrics["tokens_reasoning"], metrics["cached_tokens"]
        )  # fmt: skip
        assert summary.ttft_p50 == metrics["latency_ttft_ms_p50"]
        assert summary.wall_ms == (None if metrics["wall_clock_ms"] is None else round(metrics["wall_clock_ms"], 1))


def test_a_grown_file_is_read_from_where_its_summary_stopped(
    capture_dir: tuple[Path, dict[str, list[str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = capture_dir
    index = CaptureIndex(str(root))
    index.refresh()
    before = index.summary("0-0")
    assert before is not None and before.calls == 2
    offsets: list[int] = []
    real = index_module.read_calls

    def spy(path: str, **kwargs: Any) -> Any:
        offsets.append(kwargs["offset"])
        return real(path, **kwargs)

    monkeypatch.setattr(index_module, "read_calls", spy)
    size = (root / "0-0.capture.jsonl").stat().st_size
    with CaptureStore(root) as store:
        store.append("0-0", capture_line(fixture("chat/text-basic-gpt4o"), started_at=T0 + 10, latency_ms=100.0))
    version = index.version
    index.refresh()
    after = index.summary("0-0")
    assert after is not None and after.calls == 3 and offsets == [size] and index.version > version
    assert [r.call_index for r in read_model_call_records(CaptureStore(root, create=False), "0-0")] == [0, 1, 2]


def test_a_replaced_or_cleared_file_is_summarised_again_from_the_start(
    capture_dir: tuple[Path, dict[str, list[str]]],
) -> None:
    root, _ = capture_dir
    index = CaptureIndex(str(root))
    index.refresh()
    assert index.summary("2-0").num_errors == 1  # type: ignore[union-attr]
    with CaptureStore(root) as store:
        store.clear("2-0")
        store.append(
            "2-0", capture_line(fixture("chat/text-basic-gpt4o"), started_at=time.time() + 1, latency_ms=100.0)
        )
    index.refresh()
    summary = index.summary("2-0")
    assert summary is not None and (summary.calls, summary.num_errors) == (1, 0)


def _many(root: Path, count: int) -> None:
    root.mkdir(parents=True)
    ok = orjson.dumps(capture_line(fixture("chat/text-basic-gpt4o"), started_at=T0, latency_ms=100.0)) + b"\n"
    bad = (
        orjson.dumps(capture_line(fixture("chat/error-401-invalid-api-key"), started_at=T0 + 1, latency_ms=50.0))
        + b"\n"
    )
    for number in range(count):
        (root / f"{number}-0.capture.jsonl").write_bytes(ok * (number % 4 + 1) + (bad if number % 10 == 3 else b""))


def test_queries_sort_filter_and_page_on_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(query_module, "SUMMARISE_FIRST", 0)  # as in a directory too big to summarise per request
    root = tmp_path / "calls"
    _many(root, 120)
    index = CaptureIndex(str(root))
    index.refresh()
    first = run_query(index, Query.from_params({"per_page": "25"}))
    assert first.ids[:3] == ["0-0", "1-0", "2-0"] and (first.total, first.pages, len(first.ids)) == (120, 5, 25)
    assert set(first.summaries) == set(first.ids) and index.summarised == 25  # only the shown rows were read
    last = run_query(index, Query.from_params({"per_page": "25", "page": "5"}))
    assert last.ids[-1] == "119-0" and len(last.ids) == 20
    assert run_query(index, Query.from_params({"page": "999"})).ids[-1] == "119-0"  # past the end: the last page
    errors = run_query(index, Query.from_params({"status": "error"}))
    assert errors.unjudged == 120 - index.summarised and errors.total < 12  # honest about what was not summarised
    while index.summarise_some(50):
        pass
    errors = run_query(index, Query.from_params({"status": "error", "per_page": "100"}))
    assert errors.ids == [f"{n}-0" for n in range(3, 120, 10)] and errors.unjudged == 0
    assert run_query(index, Query.from_params({"category": "auth", "per_page": "100"})).ids == errors.ids
    by_calls = run_query(index, Query.from_params({"sort": "calls", "order": "desc", "per_page": "100"}))
    calls = [index.summaries[rid].calls for rid in by_calls.ids]
    assert calls == sorted(calls, reverse=True) and calls[0] == 5
    assert run_query(index, Query.from_params({"q": "11"})).ids == [
        "11-0",
        "110-0",
        "111-0",
        "112-0",
        "113-0",
        "114-0",
        "115-0",
        "116-0",
        "117-0",
        "118-0",
        "119-0",
    ]
    assert run_query(index, Query.from_params({"model": "nope"})).total == 0


def test_a_small_directory_is_filtered_exactly_without_the_background(tmp_path: Path) -> None:
    root = tmp_path / "calls"
    _many(root, 40)
    index = CaptureIndex(str(root))
    index.refresh()
    page = run_query(index, Query.from_params({"status": "error"}))
    assert page.ids == ["3-0", "13-0", "23-0", "33-0"] and page.unjudged == 0


def test_unexpected_query_values_fall_back_to_defaults() -> None:
    query = Query.from_params(
        {"sort": "__class__", "page": "-3", "per_page": "1000000", "status": "<x>", "q": "a" * 5000}
    )
    assert (query.sort, query.page, query.per_page, query.status, len(query.text)) == ("id", 1, 50, "", 200)


def test_a_file_seen_only_by_its_live_page_joins_the_listing(capture_dir: tuple[Path, dict[str, list[str]]]) -> None:
    root, _ = capture_dir
    index = CaptureIndex(str(root))
    index.refresh()
    with CaptureStore(root) as store:
        store.append("5-0", capture_line(fixture("chat/text-basic-gpt4o"), started_at=T0, latency_ms=100.0))
    summary = index.summary_now("5-0")
    assert summary is not None and summary.calls == 1 and index.order.index("5-0") == index.order.index("4-0") + 1
    os.unlink(root / "5-0.capture.jsonl")
    index.refresh()
    assert "5-0" not in index.order


@given(st.text(alphabet="0123456789-a_.", min_size=1, max_size=24))
def test_the_fast_natural_key_is_the_general_one(rollout_id: str) -> None:
    assert index_module.natural_key(rollout_id) == index_module._DIGITS.sub(index_module._length_prefixed, rollout_id)


def test_ids_sort_with_numbers_as_numbers() -> None:
    ids = ["10-0", "2-0-a10", "2-0", "x-1", "2-0-a2", "1-0", "2-0-a1"]
    assert sorted(ids, key=index_module.natural_key) == ["1-0", "2-0", "2-0-a1", "2-0-a2", "2-0-a10", "10-0", "x-1"]


def test_an_order_is_reused_until_the_directory_changes(tmp_path: Path) -> None:
    root = tmp_path / "calls"
    _many(root, 30)
    index = CaptureIndex(str(root))
    index.refresh()
    query = Query.from_params({"sort": "calls", "order": "desc"})
    first = run_query(index, query)
    assert run_query(index, query).ids is not first.ids and index.query_cache  # the page is new, the order cached
    cached = next(iter(index.query_cache.values()))[1][0]
    assert run_query(index, query).ids == cached[:50]
    with CaptureStore(root) as store:
        for _ in range(9):
            store.append("29-0", capture_line(fixture("chat/text-basic-gpt4o"), started_at=T0 + 50, latency_ms=10.0))
    index.refresh()
    index.summary("29-0")
    assert run_query(index, query).ids[0] == "29-0"


@given(st.text(alphabet="aZ09._-/ \n\x00é%2E", min_size=0, max_size=220) | st.text(min_size=0, max_size=8))
def test_the_listings_id_check_is_the_stores(name: str) -> None:
    from llmtap.correlation.ids import rollout_id_from_file_stem

    assert bool(index_module._VALID_ID.fullmatch(name)) == (rollout_id_from_file_stem(name) == name)
    assert bool(index_module._VALID_ID.fullmatch("a" * 212)) and not index_module._VALID_ID.fullmatch("a" * 213)
