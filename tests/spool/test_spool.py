"""Spool frames: round trips, torn and damaged tails, concurrent writers, and the collector."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtap.capsule.finalise import CaptureOutcome, finalise_capsule
from llmtap.capsule.manifest import start_manifest
from llmtap.capsule.writer import CapsulePaths, create_capsule
from llmtap.dialects import get_dialect
from llmtap.exchange import SECRET_HEADERS, Exchange
from llmtap.records import raw_line_from_exchange
from llmtap.spool.collector import SpoolCollector, drain_spool
from llmtap.spool.frame import (
    KIND_CALL,
    KIND_HEALTH,
    credential_free,
    decode_call,
    encode_call,
    encode_frame,
    encode_meta,
    scan_frames,
)
from llmtap.spool.writer import SpoolWriter, spool_directory
from llmtap.store import CaptureStore
from tests.fixtures import RecordedExchange, all_fixtures
from tests.test_records import exchange_from

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
_FRAMES = st.lists(
    st.tuples(st.sampled_from([1, 2, 3]), st.dictionaries(st.text(max_size=8), _JSON, max_size=5), st.binary(max_size=300), st.binary(max_size=300)),
    min_size=1,
    max_size=6,
)


def _frame_bytes(kind: int, meta: dict[str, Any], request: bytes = b"", response: bytes = b"") -> bytes:
    return b"".join(encode_frame(kind, encode_meta(meta), request, response))


def _exchange(recorded: RecordedExchange, pieces: int = 3, secret: str = "sk-live-secret") -> tuple[Exchange, list[tuple[bytes, bytes]]]:
    """A finished in-process call of a recorded exchange, its body arriving in `pieces` chunks,
    and the response headers its hook saw (a credential among them)."""
    exchange = exchange_from(recorded, pieces=pieces)
    exchange.model_call_id = None  # a hook's call has none until its record is built
    exchange.response_headers = {}  # a hook hands its headers to `encode_call` apart
    exchange.provider = "openai"
    exchange.extra["operation"] = "chat"
    exchange.extra["capture"] = {"point": "in-process", "hook": "httpx", "pid": 1}
    response_headers = [(b"content-type", recorded.content_type.encode()), (b"set-cookie", secret.encode())]
    return exchange, response_headers


@settings(max_examples=200, deadline=None)
@given(frames=_FRAMES)
def test_frames_round_trip_whatever_their_metadata_and_bytes(frames: list[tuple[int, dict[str, Any], bytes, bytes]]) -> None:
    data = b"".join(_frame_bytes(*frame) for frame in frames)
    result = scan_frames(data, final=True)
    assert [(f.kind, f.meta, f.request, f.response) for f in result.frames] == frames
    assert result.damaged == [] and result.consumed == len(data)


@settings(max_examples=200, deadline=None)
@given(frames=_FRAMES, data=st.data())
def test_a_torn_last_frame_waits_while_live_and_is_counted_at_the_end(frames: list[Any], data: st.DataObject) -> None:
    whole = [_frame_bytes(*frame) for frame in frames]
    cut = data.draw(st.integers(1, len(whole[-1]) - 1))
    spooled = b"".join(whole[:-1]) + whole[-1][:cut]

    live = scan_frames(spooled, final=False)
    final = scan_frames(spooled, final=True)

    assert len(live.frames) == len(frames) - 1 and live.damaged == []
    assert live.consumed == len(spooled) - cut  # the torn frame is left for a later pass
    assert len(final.frames) == len(frames) - 1
    assert len(final.damaged) == 1 and final.consumed == len(spooled)


@settings(max_examples=300, deadline=None)
@given(frames=_FRAMES, data=st.data())
def test_a_damaged_byte_costs_only_its_own_frame_and_never_raises(frames: list[Any], data: st.DataObject) -> None:
    whole = [_frame_bytes(*frame) for frame in frames]
    victim = data.draw(st.integers(0, len(whole) - 1))
    position = data.draw(st.integers(0, len(whole[victim]) - 1))
    flip = data.draw(st.integers(1, 255))
    damaged = bytearray(whole[victim])
    damaged[position] ^= flip
    spooled = b"".join(whole[:victim]) + bytes(damaged) + b"".join(whole[victim + 1 :])

    result = scan_frames(spooled, final=True)

    expected = [frame for index, frame in enumerate(frames) if index != victim]
    assert [(f.kind, f.meta, f.request, f.response) for f in result.frames] == expected
    assert len(result.damaged) == 1


@settings(max_examples=300, deadline=None)
@given(frames=_FRAMES, data=st.data())
def test_reading_as_the_bytes_arrive_finds_what_reading_them_at_the_end_finds(frames: list[Any], data: st.DataObject) -> None:
    spooled = bytearray(b"".join(_frame_bytes(*frame) for frame in frames))
    if data.draw(st.booleans()):  # sometimes with a damaged byte, sometimes with a torn end
        spooled[data.draw(st.integers(0, len(spooled) - 1))] ^= data.draw(st.integers(1, 255))
    if data.draw(st.booleans()):
        del spooled[data.draw(st.integers(1, len(spooled))) :]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(spooled)), max_size=8)))

    buffer, found, damaged, start = bytearray(), [], 0, 0
    for cut in [*cuts, len(spooled)]:
        buffer += spooled[start:cut]
        start = max(start, cut)
        live = scan_frames(buffer, final=False)
        found += live.frames
        damaged += len(live.damaged)
        del buffer[: live.consumed]
    last = scan_frames(buffer, final=True)
    whole = scan_frames(bytes(spooled), final=True)

    assert found + last.frames == whole.frames
    assert damaged + len(last.damaged) == len(whole.damaged)


@settings(max_examples=100, deadline=None)
@given(garbage=st.binary(max_size=2000), final=st.booleans())
def test_garbage_never_raises(garbage: bytes, final: bool) -> None:
    result = scan_frames(garbage, final=final)
    assert 0 <= result.consumed <= len(garbage)


_WIRE_NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=20)


@settings(max_examples=200, deadline=None)
@given(
    secret_name=st.sampled_from(sorted(SECRET_HEADERS)).map(lambda name: name.title()) | _WIRE_NAMES.map(lambda name: name + "-token"),
    others=st.lists(st.tuples(_WIRE_NAMES, st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 /.", max_size=20))),
    as_bytes=st.booleans(),
)
def test_credential_headers_never_reach_the_frame(secret_name: str, others: list[tuple[str, str]], as_bytes: bool) -> None:
    secret = "SECRET-VALUE-0123456789"
    pairs: list[Any] = [*others, (secret_name, secret)]
    if as_bytes:
        pairs = [(name.encode(), value.encode()) for name, value in pairs]
    exchange = Exchange(method="POST", path="/v1/chat/completions", request_body=b"{}")
    exchange.finish()

    frame = b"".join(encode_call(exchange, dialect="chat", request_headers=pairs, response_headers=pairs, body_decoded=False))

    assert secret.encode() not in frame
    kept = credential_free(pairs)
    assert kept is not None and all(value != secret for _, value in kept)


_RECORDED = [recorded for recorded in all_fixtures() if recorded.dialect in ("chat", "responses", "messages")]


@settings(max_examples=120, deadline=None)
@given(recorded=st.sampled_from(_RECORDED), pieces=st.integers(1, 30), decoded=st.booleans())
def test_a_call_rebuilt_from_its_frame_gives_the_same_record_as_built_in_process(
    recorded: RecordedExchange, pieces: int, decoded: bool
) -> None:
    exchange, response_headers = _exchange(recorded, pieces)
    request_headers = [(b"content-type", b"application/json"), (b"authorization", b"Bearer sk-live-secret")]
    frame = b"".join(
        encode_call(exchange, dialect=recorded.dialect, request_headers=request_headers, response_headers=response_headers, body_decoded=decoded)
    )
    (read,) = scan_frames(frame, final=True).frames
    rebuilt, dialect = decode_call(read)

    from llmtap.exchange import safe_headers

    exchange.request_headers = safe_headers(request_headers)
    exchange.response_headers = safe_headers(response_headers)
    exchange.model_call_id = rebuilt.model_call_id = "fixed"
    direct = raw_line_from_exchange(exchange, dialect=get_dialect(recorded.dialect))
    via_spool = raw_line_from_exchange(rebuilt, dialect=get_dialect(dialect) if dialect else None)
    assert via_spool == direct
    assert b"sk-live-secret" not in frame


class _HTTPStatusError(Exception):
    def __init__(self) -> None:
        super().__init__("the prompt must never be stored")
        self.status_code = 429


@pytest.mark.parametrize(
    "error",
    [TimeoutError("slow"), ConnectionResetError("gone"), _HTTPStatusError(), ValueError("odd")],
    ids=["timeout", "connection", "status", "other"],
)
def test_an_exception_is_rebuilt_with_its_category_status_and_type_but_no_message(error: Exception) -> None:
    exchange = Exchange(method="POST", path="/v1/chat/completions", request_body=b"{}")
    try:
        raise error from KeyError("cause")
    except Exception as raised:
        exchange.exception = raised
    exchange.finish()
    frame = b"".join(encode_call(exchange, dialect="chat", request_headers=None, response_headers=None, body_decoded=False))
    (read,) = scan_frames(frame, final=True).frames
    rebuilt, _ = decode_call(read)

    exchange.model_call_id = rebuilt.model_call_id = "fixed"
    assert raw_line_from_exchange(rebuilt) == raw_line_from_exchange(exchange)
    assert b"must never be stored" not in frame and b"slow" not in frame


# --- writers ------------------------------------------------------------------------------------


def _write_numbered(directory: str, writer_id: int, threads: int, count: int) -> None:
    spool = SpoolWriter(directory)

    def write(thread_id: int) -> None:
        for sequence in range(count):
            spool.write(encode_frame(KIND_HEALTH, encode_meta({"w": writer_id, "t": thread_id, "n": sequence}), os.urandom(sequence % 700)))

    workers = [threading.Thread(target=write, args=(index,)) for index in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def test_concurrent_processes_and_threads_never_mix_frames(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_write_numbered, args=(str(tmp_path), index, 3, 300)) for index in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0

    files = sorted(tmp_path.glob("*.spool"))
    assert len(files) == 4  # one file per process, whatever its threads
    for path in files:
        result = scan_frames(path.read_bytes(), final=True)
        assert result.damaged == []
        numbered = [frame.meta for frame in result.frames if frame.kind == KIND_HEALTH]
        assert len(numbered) == 3 * 300 and len({meta["w"] for meta in numbered}) == 1
        for thread_id in range(3):
            assert [meta["n"] for meta in numbered if meta["t"] == thread_id] == list(range(300))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_writes_a_spool_file_of_its_own(tmp_path: Path) -> None:
    spool = SpoolWriter(tmp_path)
    spool.write(encode_frame(KIND_HEALTH, encode_meta({"who": "parent"})))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            spool.after_fork()
            spool.write(encode_frame(KIND_HEALTH, encode_meta({"who": "child"})))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    spool.write(encode_frame(KIND_HEALTH, encode_meta({"who": "parent"})))
    whose = {
        path.name.split("-")[0]: [f.meta.get("who") for f in scan_frames(path.read_bytes(), final=True).frames if f.kind == KIND_HEALTH]
        for path in tmp_path.glob("*.spool")
    }
    assert whose == {str(os.getpid()): ["parent", "parent"], str(pid): ["child"]}


# --- the collector ------------------------------------------------------------------------------


def _capsule(tmp_path: Path) -> tuple[CapsulePaths, dict[str, Any]]:
    paths = create_capsule(tmp_path / "runs", with_outputs=False)
    manifest = start_manifest(paths, capture_mode="run", command=["agent"], cwd=str(tmp_path), started_at=0.0, registry_source=None)
    return paths, manifest


def _spool_calls(paths: CapsulePaths, count: int, *, first: int = 0, writer: SpoolWriter | None = None) -> SpoolWriter:
    writer = writer or SpoolWriter(spool_directory(paths.root))
    recorded = next(f for f in _RECORDED if f.id == "chat/text-basic-gpt4o")
    for index in range(first, first + count):
        exchange, response_headers = _exchange(recorded)
        exchange.extra["sequence"] = index
        writer.write(encode_call(exchange, dialect="chat", request_headers=[], response_headers=response_headers, body_decoded=False))
    return writer


def _sequences(paths: CapsulePaths, rollout_id: str = "r-1") -> list[int]:
    with CaptureStore(paths.calls, create=False) as store:
        return [line["sequence"] for _, line in store.read(rollout_id).entries]


def test_finalisation_turns_every_frame_into_one_record_in_order_when_no_collector_ran(tmp_path: Path) -> None:
    paths, manifest = _capsule(tmp_path)
    _spool_calls(paths, 25)

    final = finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))

    assert _sequences(paths) == list(range(25))
    assert final["counts"]["model_calls"] == 25 and final["counts"]["records_dropped"] == 0
    health = json.loads(paths.capture_health.read_text())
    assert health["ok"] is True and health["records"]["captured_calls"] == 25 and health["records"]["written"] == 25
    assert list(spool_directory(paths.root).iterdir()) == []  # every frame is a record now


def test_a_live_collector_and_finalisation_together_record_each_call_once(tmp_path: Path) -> None:
    paths, manifest = _capsule(tmp_path)
    collector = SpoolCollector(paths, interval=0.01).start()
    writer = _spool_calls(paths, 10)
    for _ in range(500):  # the live thread picks them up while the workload runs
        if (paths.calls / "r-1.capture.jsonl").exists() and len(_sequences(paths)) == 10:
            break
        threading.Event().wait(0.01)
    assert _sequences(paths) == list(range(10))
    _spool_calls(paths, 5, first=10, writer=writer)

    finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))

    assert _sequences(paths) == list(range(15))
    collector.finish()  # idempotent, and finalisation already finished it
    assert _sequences(paths) == list(range(15))


def test_a_workload_that_never_pauses_still_gets_its_records_while_it_runs(tmp_path: Path) -> None:
    paths, manifest = _capsule(tmp_path)
    collector = SpoolCollector(paths, interval=0.01, max_delay=0.2).start()
    writer = _spool_calls(paths, 1)
    seen_live: list[int] = []
    stop = threading.Event()

    def busy_workload() -> None:  # a frame every few milliseconds: the files never stop growing
        sequence = 1
        while not stop.wait(0.003):
            _spool_calls(paths, 1, first=sequence, writer=writer)
            sequence += 1

    workload = threading.Thread(target=busy_workload)
    workload.start()
    try:
        for _ in range(1000):
            if (paths.calls / "r-1.capture.jsonl").exists():
                seen_live = _sequences(paths)
                if seen_live:
                    break
            threading.Event().wait(0.01)
    finally:
        stop.set()
        workload.join()
    finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))
    collector.finish()

    assert seen_live  # recorded while the workload was still busy
    everything = _sequences(paths)
    assert everything == list(range(len(everything))) and len(everything) > len(seen_live)


def test_a_torn_last_frame_is_counted_as_a_dropped_record(tmp_path: Path) -> None:
    paths, manifest = _capsule(tmp_path)
    writer = _spool_calls(paths, 3)
    with open(writer.path, "ab") as spool:  # a process killed in the middle of its fourth write
        spool.write(b"".join(encode_frame(KIND_CALL, encode_meta({"method": "POST"}), b"x" * 100, b"y" * 100))[:-50])

    final = finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))

    assert _sequences(paths) == [0, 1, 2]
    health = json.loads(paths.capture_health.read_text())
    assert health["ok"] is False and health["dropped"] == {"record_write_failed": 1}
    assert health["records"]["captured_calls"] == 4 and health["records"]["written"] == 3
    assert final["counts"]["records_dropped"] == 1
    assert [path.name.endswith(".spool.kept") for path in spool_directory(paths.root).iterdir()] == [True]


def test_a_frame_the_recorder_cannot_build_is_counted_and_its_file_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    paths, manifest = _capsule(tmp_path)
    writer = _spool_calls(paths, 1)
    writer.write(encode_frame(KIND_CALL, encode_meta({"method": "POST", "path": "/v1/chat/completions", "started_at": "not a time"})))
    _spool_calls(paths, 1, first=1, writer=writer)

    finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))

    assert _sequences(paths) == [0, 1]
    health = json.loads(paths.capture_health.read_text())
    assert health["dropped"] == {"record_build_failed": 1}
    assert "record_build_failed" in caplog.text and "ValueError" in caplog.text
    assert len(list(spool_directory(paths.root).glob("*.spool.kept"))) == 1


def test_counts_reported_in_a_spool_file_reach_capture_health(tmp_path: Path) -> None:
    paths, manifest = _capsule(tmp_path)
    writer = _spool_calls(paths, 2)
    writer.write(encode_frame(KIND_HEALTH, encode_meta({"counts": {"hook_failed": 1, "calls_captured": 1}})))

    finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))

    health = json.loads(paths.capture_health.read_text())
    assert health["dropped"] == {"hook_failed": 1}
    assert health["records"]["captured_calls"] == 3 and health["records"]["written"] == 2
    (process,) = health["processes"]
    assert process["pid"] == os.getpid()


def test_links_and_special_files_in_the_spool_directory_are_never_read(tmp_path: Path) -> None:
    paths, _ = _capsule(tmp_path)
    directory = spool_directory(paths.root)
    directory.mkdir(parents=True)
    outside = tmp_path / "outside.spool"
    outside.write_bytes(_frame_bytes(KIND_HEALTH, {"counts": {"hook_failed": 5}}))
    (directory / "1-link.spool").symlink_to(outside)
    os.mkfifo(directory / "2-fifo.spool")

    drain_spool(paths)

    assert not list(paths.process_health.iterdir())
    assert outside.exists()


def test_finalising_a_capsule_twice_never_records_a_call_twice(tmp_path: Path) -> None:
    paths, manifest = _capsule(tmp_path)
    writer = _spool_calls(paths, 2)
    with open(writer.path, "ab") as spool:
        spool.write(b"garbage that keeps the file for inspection")
    finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))
    drain_spool(paths)
    assert _sequences(paths) == [0, 1]


def test_a_spool_bigger_than_what_the_collector_holds_at_once_is_drained_whole_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import llmtap.spool.collector as spool_module

    monkeypatch.setattr(spool_module, "_READ_CHUNK", 1000)
    monkeypatch.setattr(spool_module, "_READ_LIMIT", 3000)  # smaller than one frame, and than the file
    paths, manifest = _capsule(tmp_path)
    _spool_calls(paths, 12)

    finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))

    assert _sequences(paths) == list(range(12))
    assert json.loads(paths.capture_health.read_text())["ok"] is True


# A process under `llmtap run` that opens calls and is killed with them in flight.
_KILLED_WITH_CALLS_OPEN = """
import os, signal, sys
from llmtap.spool.writer import SpoolWriter
writer = SpoolWriter(sys.argv[1])
writer.set_in_flight(1)
writer.set_in_flight(2)
writer.set_in_flight(1)
writer.set_in_flight(2)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_calls_in_flight_when_a_process_is_killed_are_counted_at_finalisation(tmp_path: Path) -> None:
    import subprocess
    import sys

    paths = create_capsule(tmp_path / "runs")
    manifest = start_manifest(paths, capture_mode="run", command=["x"], cwd=str(tmp_path), started_at=0.0, registry_source=None)
    _spool_calls(paths, 1)  # a process that finished its one call ...
    spool = spool_directory(paths.root)
    finished = subprocess.run([sys.executable, "-c", _KILLED_WITH_CALLS_OPEN, str(spool)], check=False, timeout=60)
    assert finished.returncode == -9  # ... and one killed with two calls open, before any frame
    (in_flight,) = spool.glob("*.inflight")
    assert in_flight.read_bytes() == (2).to_bytes(8, "little")
    final = finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))
    health = json.loads(paths.capture_health.read_bytes())
    assert health["records"]["in_flight_at_exit"] == 2 and health["dropped"] == {"calls_in_flight_at_exit": 2}
    assert health["ok"] is False and final["counts"]["records_dropped"] == 2
    assert list(spool.iterdir()) == []  # the counts are in capture health now


def test_a_process_that_ends_its_calls_leaves_nothing_in_flight(tmp_path: Path) -> None:
    writer = SpoolWriter(tmp_path)
    writer.set_in_flight(1)
    writer.set_in_flight(0)
    (in_flight,) = tmp_path.glob("*.inflight")
    assert in_flight.read_bytes() == bytes(8)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            writer.after_fork()
            writer.set_in_flight(5)  # the child's own file, never the parent's mapping
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert in_flight.read_bytes() == bytes(8)
    assert sorted(int.from_bytes(path.read_bytes(), "little") for path in tmp_path.glob("*.inflight")) == [0, 5]
