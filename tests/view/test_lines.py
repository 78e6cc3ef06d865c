"""Reading capture files for the viewer: the store's numbering, appended lines only, links and bounds refused."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtap import CaptureStore
from llmtap.store.readers import read_rollout_calls
from llmtap.view import lines as lines_module
from llmtap.view.files import UnsafeFileError, read_bounded
from llmtap.view.lines import read_calls
from tests.fixtures import fixture
from tests.view.stores import T0, capture_line


def test_call_indexes_and_damaged_lines_match_the_stores_reader(capture_dir: tuple[Path, dict[str, list[str]]]) -> None:
    root, _ = capture_dir
    store = CaptureStore(root, create=False)
    for rollout_id in store.rollouts():
        expected = read_rollout_calls(store, rollout_id)
        batch = read_calls(str(root / f"{rollout_id}.capture.jsonl"))
        assert [line.call_index for line in batch.lines if line.record] == [r.call_index for r in expected.records]
        assert [line.record.model_call_id for line in batch.lines if line.record] == [
            r.model_call_id for r in expected.records
        ]
        assert [line.call_index for line in batch.lines if line.record is None] == expected.unreadable_lines
    assert [line.call_index for line in read_calls(str(root / "4-0.capture.jsonl")).lines] == [0, 1, 2]


def test_reading_from_an_offset_gives_only_the_lines_appended_and_leaves_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "r.capture.jsonl"
    one = orjson.dumps(capture_line(fixture("chat/text-basic-gpt4o"), started_at=T0, latency_ms=100.0))
    path.write_bytes(one + b"\n")
    first = read_calls(str(path))
    assert [line.call_index for line in first.lines] == [0] and first.next_offset == len(one) + 1
    with path.open("ab") as handle:
        handle.write(b"\n" + one + b"\n" + one[:40])  # a blank line, a whole line, and half of one
    second = read_calls(str(path), offset=first.next_offset, first_index=first.next_index)
    assert [line.call_index for line in second.lines] == [1] and second.torn_tail
    with path.open("ab") as handle:
        handle.write(one[40:] + b"\n")
    third = read_calls(str(path), offset=second.next_offset, first_index=second.next_index)
    assert [line.call_index for line in third.lines] == [2] and not third.torn_tail
    assert (
        third.lines[0].record is not None and third.lines[0].record.model_call_id == first.lines[0].record.model_call_id
    )  # type: ignore[union-attr]


def test_a_link_or_a_fifo_in_place_of_a_capture_file_is_refused_without_blocking(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the viewer\n")
    link = tmp_path / "a.capture.jsonl"
    link.symlink_to(secret)
    with pytest.raises(UnsafeFileError):
        read_calls(str(link))
    fifo = tmp_path / "b.capture.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeFileError):
        read_bounded(str(fifo), limit=10)


def test_a_line_longer_than_the_bound_counts_as_one_damaged_line_and_the_next_keeps_its_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = orjson.dumps(capture_line(fixture("chat/text-basic-gpt4o"), started_at=T0, latency_ms=100.0))
    monkeypatch.setattr(lines_module, "READ_STEP_BYTES", 64)
    monkeypatch.setattr(lines_module, "MAX_LINE_BYTES", len(good) + 100)
    path = tmp_path / "r.capture.jsonl"
    path.write_bytes(good + b"\n" + b"x" * (3 * len(good)) + b"\n" + good + b"\n")
    batch = read_calls(str(path))
    assert [(line.call_index, line.record is not None) for line in batch.lines] == [(0, True), (1, False), (2, True)]
    assert batch.next_offset == path.stat().st_size and not batch.torn_tail


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=4000), min_size=1, max_size=8), st.data())
def test_reading_appended_pieces_one_by_one_gives_the_same_calls_as_one_read(
    cuts: list[int], data: st.DataObject
) -> None:
    import tempfile

    line = orjson.dumps(capture_line(fixture("chat/text-basic-gpt4o"), started_at=T0, latency_ms=100.0))
    content = b"\n".join([line, b"", b"{bad", line, b"[1]", line]) + b"\n"
    positions = sorted({min(cut, len(content)) for cut in cuts} | {len(content)})
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "r.capture.jsonl"
        path.write_bytes(b"")
        offset = index = 0
        seen: list[tuple[int, bool]] = []
        written = 0
        for position in positions:
            with path.open("ab") as handle:
                handle.write(content[written:position])
            written = position
            batch = read_calls(str(path), offset=offset, first_index=index, keep_lines=data.draw(st.booleans()))
            seen.extend((item.call_index, item.record is not None) for item in batch.lines)
            offset, index = batch.next_offset, batch.next_index
    assert seen == [(0, True), (1, False), (2, True), (3, False), (4, True)]
