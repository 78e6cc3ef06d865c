"""CaptureStore: ids, round-trips, concurrent writers, crash repair, group commit, markers, fences."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import multiprocessing
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtap.correlation.ids import ROLLOUT_ID_PATTERN, validate_rollout_id
from llmtap.errors import CaptureRecordError, InvalidRolloutIdError, StoreError
from llmtap.store import AppendResult, CaptureStore

SHARED_ROLLOUT = "shared-0"
PROCESSES = 8
APPENDS_PER_PROCESS = 500
THREADS_PER_PROCESS = 10
WAIT = 30.0  # generous bound on waits that only fail by hanging


def make_record(index: int = 0, **fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "model_call_id": uuid.uuid4().hex,
        "index": index,
        "started_at": time.time(),
        "dialect": "chat",
        "request": {"model": "m", "messages": [{"role": "user", "content": f"question {index}"}]},
        "response": {"id": f"resp_{index}", "choices": [{"message": {"content": "answer"}}]},
    }
    record.update(fields)
    return record


def fd_path(fd: int) -> str:
    """The file a descriptor refers to, so patched syscalls can act on one file only."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def hold_fdatasync(monkeypatch: pytest.MonkeyPatch, path_suffix: str = "") -> tuple[threading.Event, threading.Event]:
    """Patch os.fdatasync so a sync of a file ending in `path_suffix` sets `entered` and waits for `release`."""
    real = os.fdatasync
    entered, release = threading.Event(), threading.Event()

    def held(fd: int) -> None:
        if fd_path(fd).endswith(path_suffix):
            entered.set()
            release.wait(WAIT)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", held)
    return entered, release


@pytest.fixture
def store(tmp_path: Path) -> Iterator[CaptureStore]:
    with CaptureStore(tmp_path / "captures") as capture_store:
        yield capture_store


@pytest.fixture
def threaded_store(tmp_path: Path) -> Iterator[CaptureStore]:
    """A store whose awaited appends sync on its own threads, where a patched os.fdatasync sees them."""
    with CaptureStore(tmp_path / "captures", sync_process=False) as capture_store:
        yield capture_store


@pytest.fixture
def no_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skip real fsyncs where durability is not what the test is about."""
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)
    monkeypatch.setattr(os, "fsync", lambda fd: None)


# Rollout ids ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "a/b", "../a", "a b", "röllout", ".", "..", "a\n", "a%2Eb", 7, None, b"a"])
def test_invalid_rollout_ids_are_rejected_with_a_value_error(bad: object) -> None:
    with pytest.raises(InvalidRolloutIdError) as caught:
        validate_rollout_id(bad)
    assert isinstance(caught.value, ValueError)
    assert repr(bad) in str(caught.value)


def test_rollout_ids_longer_than_212_characters_are_rejected() -> None:
    assert validate_rollout_id("a" * 212) == "a" * 212
    with pytest.raises(InvalidRolloutIdError, match="213 characters"):
        validate_rollout_id("a" * 213)


def test_rollout_id_pattern_is_ascii_only() -> None:
    assert ROLLOUT_ID_PATTERN.fullmatch("task-1_a.2")
    assert not ROLLOUT_ID_PATTERN.fullmatch("a\u0661")  # Arabic-Indic digit: a digit, but not ASCII


def test_dotted_rollout_id_maps_to_its_capture_file(store: CaptureStore) -> None:
    assert store.path_for("task-1_a.2") == store.root / "task-1_a.2.capture.jsonl"
    assert store.marker_path_for("task-1_a.2") == store.root / "task-1_a.2.capture.incomplete"


@pytest.mark.parametrize("method", ["path_for", "marker_path_for", "read", "clear"])
def test_store_methods_refuse_path_traversal(store: CaptureStore, method: str) -> None:
    with pytest.raises(InvalidRolloutIdError):
        getattr(store, method)("../escape")


def test_append_refuses_an_invalid_id_without_writing(store: CaptureStore) -> None:
    with pytest.raises(InvalidRolloutIdError):
        store.append("a/b", make_record())
    assert list(store.root.iterdir()) == []


# Round trips and reading ------------------------------------------------------------------------


def test_relative_root_is_resolved_and_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with CaptureStore("relative/captures") as relative:
        assert relative.root == tmp_path / "relative" / "captures"
        assert relative.root.is_dir()


def test_records_round_trip_unicode_exactly(store: CaptureStore) -> None:
    record = make_record(
        content="röllout ☃ 𝄞 日本語 \u2028 line\nbreak \x00 \"quoted\"", nested={"é": ["ß", 1.5, None]}
    )
    result = store.append("unicode", record)
    assert result == AppendResult(store.path_for("unicode"), late=False)
    read = store.read("unicode")
    assert read.entries == [(0, record)]
    assert store.path_for("unicode").read_bytes().count(b"\n") == 1


def test_records_keep_call_index_in_append_order(store: CaptureStore) -> None:
    records = [make_record(i) for i in range(5)]
    for record in records:
        store.append("ordered", record)
    read = store.read("ordered")
    assert read.exists and not read.torn_tail and not read.incomplete
    assert read.entries == list(enumerate(records))


def test_reading_a_missing_rollout_gives_an_empty_result(store: CaptureStore) -> None:
    read = store.read("never-written")
    assert (read.exists, read.entries, read.invalid_count, read.torn_tail, read.late_writes) == (False, [], 0, False, 0)


def test_store_without_create_reads_nothing_and_refuses_appends(tmp_path: Path) -> None:
    with CaptureStore(tmp_path / "absent", create=False) as absent:
        assert not absent.root.exists()
        assert absent.rollouts() == []
        assert not absent.read("r").exists
        with pytest.raises(StoreError):
            absent.append("r", make_record())


def write_raw(store: CaptureStore, rollout_id: str, content: bytes) -> None:
    store.path_for(rollout_id).write_bytes(content)


def test_damaged_lines_are_counted_and_keep_their_call_index(store: CaptureStore) -> None:
    good = [make_record(i) for i in range(3)]
    lines = [orjson.dumps(good[0]), b"{broken", orjson.dumps(good[1]), b"[1, 2]", orjson.dumps(good[2])]
    write_raw(store, "damaged", b"\n".join(lines) + b"\n")
    read = store.read("damaged")
    assert read.entries == [(0, good[0]), (2, good[1]), (4, good[2])]
    assert read.invalid_lines == [1, 3]
    assert read.invalid_count == 2


def test_strict_read_raises_at_the_first_damaged_line_number(store: CaptureStore) -> None:
    content = orjson.dumps(make_record()) + b"\n\n" + b"not json\n" + orjson.dumps(make_record()) + b"\n"
    write_raw(store, "strict", content)
    with pytest.raises(CaptureRecordError) as caught:
        store.read("strict", strict=True)
    assert caught.value.line_number == 3  # the blank line 2 is skipped but still numbered
    assert caught.value.path == store.path_for("strict")
    assert "not valid JSON" in caught.value.reason


def test_strict_read_names_a_non_object_line(store: CaptureStore) -> None:
    write_raw(store, "array", b"[1]\n")
    with pytest.raises(CaptureRecordError, match="JSON array, not an object"):
        store.read("array", strict=True)


def test_blank_lines_take_no_call_index(store: CaptureStore) -> None:
    first, second = make_record(0), make_record(1)
    write_raw(store, "blank", b"\n" + orjson.dumps(first) + b"\n \t\r\n\n" + orjson.dumps(second) + b"\n")
    read = store.read("blank", strict=True)
    assert read.entries == [(0, first), (1, second)]
    assert read.invalid_lines == []


def test_unterminated_tail_is_reported_but_not_counted(store: CaptureStore) -> None:
    record = make_record()
    write_raw(store, "torn", orjson.dumps(record) + b"\n" + orjson.dumps(make_record())[:17])
    for strict in (False, True):
        read = store.read("torn", strict=strict)
        assert read.torn_tail
        assert read.entries == [(0, record)]
        assert read.invalid_lines == []


@pytest.mark.parametrize("existing", [b"", b"  ", b"\n"])
def test_append_to_an_empty_or_blank_file_creates_no_phantom_line(store: CaptureStore, existing: bytes) -> None:
    write_raw(store, "phantom", existing)
    record = make_record()
    store.append("phantom", record)
    read = store.read("phantom", strict=True)
    assert read.entries == [(0, record)]
    assert read.invalid_lines == []


def test_appends_after_every_possible_crash_offset_keep_complete_records(store: CaptureStore, no_sync: None) -> None:
    records = [make_record(i, text="ü" * i) for i in range(4)]
    lines = [orjson.dumps(record) + b"\n" for record in records]
    original = b"".join(lines)
    for offset in range(len(original)):
        rollout_id = f"crash-{offset}"
        prefix = original[:offset]
        complete = prefix.count(b"\n")
        partial = prefix[prefix.rfind(b"\n") + 1 :]
        write_raw(store, rollout_id, prefix)

        whole = bool(partial) and partial + b"\n" == lines[complete]  # only the newline was lost

        before = store.read(rollout_id)
        assert before.entries == list(enumerate(records[: complete + whole]))
        assert before.torn_tail == (bool(partial) and not whole)

        fresh = [make_record(100), make_record(101)]
        for record in fresh:
            store.append(rollout_id, record)
        after = store.read(rollout_id)
        expected = list(enumerate(records[:complete]))
        next_index = complete
        if partial:
            if partial + b"\n" == lines[complete]:  # only the newline was lost: the record survives
                expected.append((next_index, records[complete]))
            else:
                assert after.invalid_lines == [next_index]
            next_index += 1
        else:
            assert after.invalid_lines == []
        expected += [(next_index, fresh[0]), (next_index + 1, fresh[1])]
        assert after.entries == expected
        assert not after.torn_tail


DAMAGED_LINES = st.one_of(
    st.binary(max_size=30).map(lambda raw: b"#" + raw.replace(b"\n", b"")),
    st.sampled_from([b"[1]", b"3", b'"s"', b"null", b"true", b"{"]),
)
BLANK_LINES = st.sampled_from([b"", b" ", b"\t", b"\r", b"  \t "])
VALID_LINES = st.dictionaries(st.text(max_size=5), st.text(max_size=10), max_size=3).map(orjson.dumps)
TAILS = st.one_of(st.just(b""), BLANK_LINES.filter(bool), DAMAGED_LINES.filter(bool), st.just(b'{"cut": "he'))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.one_of(VALID_LINES, DAMAGED_LINES, BLANK_LINES), max_size=12), tail=TAILS)
def test_reader_indices_never_shift_when_a_record_is_appended(
    store: CaptureStore, no_sync: None, lines: list[bytes], tail: bytes
) -> None:
    write_raw(store, "prop", b"".join(line + b"\n" for line in lines) + tail)
    counted = [line for line in lines if line.strip()]

    before = store.read("prop")
    assert before.torn_tail == bool(tail)
    assert sorted([index for index, _ in before.entries] + before.invalid_lines) == list(range(len(counted)))
    valid = [orjson.loads(line) for line in counted if line.startswith(b"{") and line != b"{"]
    assert [record for _, record in before.entries] == valid

    record = make_record()
    store.append("prop", record)
    after = store.read("prop")
    tail_counts = bool(tail.strip())
    assert after.entries == before.entries + [(len(counted) + tail_counts, record)]
    assert after.invalid_lines == before.invalid_lines + ([len(counted)] if tail_counts else [])
    assert not after.torn_tail


# Concurrency -----------------------------------------------------------------------------------


def append_from_process(root: str, writer: int) -> None:
    """One spawned process: several threads appending to the shared rollout (group commit in play)."""
    with CaptureStore(root) as process_store:

        def run(thread: int) -> None:
            for seq in range(thread, APPENDS_PER_PROCESS, THREADS_PER_PROCESS):
                size = 70_000 if seq % 97 == 0 else seq % 13 * 100  # some lines span several pages
                process_store.append(
                    SHARED_ROLLOUT,
                    {"writer": writer, "thread": thread, "seq": seq, "started_at": time.time(), "pad": "é" * size},
                )

        threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS_PER_PROCESS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def test_processes_and_threads_appending_concurrently_never_interleave_or_lose_lines(store: CaptureStore) -> None:
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=append_from_process, args=(str(store.root), w)) for w in range(PROCESSES)]
    for process in processes:
        process.start()

    def local_writer(k: int) -> None:
        for seq in range(100):
            store.append(f"local-{k}", make_record(seq, writer=k))

    local = [threading.Thread(target=local_writer, args=(k,)) for k in range(8)]
    for thread in local:
        thread.start()
    for thread in local:
        thread.join()
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0

    shared = store.read(SHARED_ROLLOUT, strict=True)
    assert not shared.torn_tail and shared.invalid_count == 0
    assert [index for index, _ in shared.entries] == list(range(PROCESSES * APPENDS_PER_PROCESS))
    seen = [(r["writer"], r["seq"]) for _, r in shared.entries]
    assert sorted(seen) == [(w, s) for w in range(PROCESSES) for s in range(APPENDS_PER_PROCESS)]
    for _, record in shared.entries:
        assert record["pad"] == "é" * (70_000 if record["seq"] % 97 == 0 else record["seq"] % 13 * 100)
    for writer in range(PROCESSES):  # each thread's appends land in the order it made them
        for thread_index in range(THREADS_PER_PROCESS):
            mine = [r["seq"] for _, r in shared.entries if r["writer"] == writer and r["thread"] == thread_index]
            assert mine == sorted(mine)
    for k in range(8):
        assert [r["index"] for _, r in store.read(f"local-{k}", strict=True).entries] == list(range(100))


def test_reads_during_concurrent_appends_see_a_stable_prefix(store: CaptureStore) -> None:
    def writer(k: int) -> None:
        for seq in range(100):
            store.append("busy", make_record(seq, writer=k, pad="x" * (seq * 97 % 5000)))

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    snapshots = []
    while any(thread.is_alive() for thread in threads):
        snapshots.append(store.read("busy", strict=True).entries)  # a half-written line is a torn tail
    final = store.read("busy", strict=True).entries
    assert len(final) == 300
    for entries in snapshots:
        assert entries == final[: len(entries)]


class SyncSpy:
    """Stands in for os.fdatasync on capture files: counts calls and notes which ids became durable."""

    def __init__(self, real: Callable[[int], None]) -> None:
        self.real = real
        self.calls = 0
        self.durable: set[str] = set()
        self.lock = threading.Lock()
        self.before_sync: Callable[[str], None] = lambda path: None

    def __call__(self, fd: int) -> None:
        path = fd_path(fd)
        if path.endswith(".capture.jsonl"):
            self.before_sync(path)
        self.real(fd)
        if path.endswith(".capture.jsonl"):
            ids = {orjson.loads(line)["model_call_id"] for line in Path(path).read_bytes().splitlines()}
            with self.lock:
                self.calls += 1
                self.durable |= ids


def test_concurrent_appends_share_fsyncs_and_each_is_durable_on_return(
    store: CaptureStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = SyncSpy(os.fdatasync)
    monkeypatch.setattr(os, "fdatasync", spy)
    writers = 50
    entered = threading.Semaphore(0)

    def hold_first_sync(path: str) -> None:  # let every writer queue up behind the first commit
        deadline = time.monotonic() + WAIT
        if spy.calls == 0:
            for _ in range(writers):
                entered.acquire(timeout=max(0.0, deadline - time.monotonic()))

    spy.before_sync = hold_first_sync
    durable_on_return: list[bool] = []

    def writer(index: int) -> None:
        record = make_record(index)
        entered.release()
        store.append("grouped", record)
        durable_on_return.append(record["model_call_id"] in spy.durable)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert durable_on_return == [True] * writers
    assert spy.calls < writers
    assert len(store.read("grouped", strict=True).entries) == writers


def test_slow_fsync_on_one_rollout_does_not_block_another(store: CaptureStore, monkeypatch: pytest.MonkeyPatch) -> None:
    entered, release = hold_fdatasync(monkeypatch, "slow.capture.jsonl")
    slow_done = threading.Event()

    def slow_writer() -> None:
        store.append("slow", make_record())
        slow_done.set()

    slow = threading.Thread(target=slow_writer)
    slow.start()
    assert entered.wait(WAIT)

    store.append("fast", make_record())
    asyncio.run(store.append_async("fast-async", make_record()))
    assert not slow_done.is_set()

    release.set()
    slow.join()
    assert [len(store.read(r).entries) for r in ("slow", "fast", "fast-async")] == [1, 1, 1]


def test_async_appends_need_no_free_default_executor_thread(
    threaded_store: CaptureStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = hold_fdatasync(monkeypatch, "slow.capture.jsonl")
    executor_busy = threading.Event()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=1)
        loop.set_default_executor(executor)
        occupied = loop.run_in_executor(None, executor_busy.wait, WAIT)  # the only default thread is taken
        try:
            slow = asyncio.create_task(threaded_store.append_async("slow", make_record()))
            while not entered.is_set():
                await asyncio.sleep(0.005)
            fast = await threaded_store.append_async("fast", make_record())
            assert fast.path == threaded_store.path_for("fast")
            assert not slow.done()
        finally:
            release.set()
            executor_busy.set()
        await slow
        await occupied

    asyncio.run(main())


def test_append_async_leaves_the_event_loop_running_during_fsync(
    threaded_store: CaptureStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.fdatasync
    in_sync, loop_ran = threading.Event(), threading.Event()
    loop_ran_in_time: list[bool] = []

    def wait_for_loop(fd: int) -> None:
        in_sync.set()
        loop_ran_in_time.append(loop_ran.wait(WAIT))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", wait_for_loop)

    async def main() -> None:
        task = asyncio.create_task(threaded_store.append_async("loop", make_record()))
        while not in_sync.is_set():
            await asyncio.sleep(0.005)
        loop_ran.set()  # only reachable if the fsync runs off the loop
        await task

    asyncio.run(main())
    assert loop_ran_in_time == [True]


def test_append_async_from_many_tasks_writes_every_record(store: CaptureStore) -> None:
    records = {f"async-{k}": [make_record(i) for i in range(100)] for k in range(3)}

    async def main() -> list[AppendResult]:
        return await asyncio.gather(
            *(store.append_async(rollout_id, record) for rollout_id, batch in records.items() for record in batch)
        )

    results = asyncio.run(main())
    assert len(results) == 300 and not any(result.late for result in results)
    for rollout_id, batch in records.items():
        read = store.read(rollout_id, strict=True)
        assert sorted(r["model_call_id"] for _, r in read.entries) == sorted(r["model_call_id"] for r in batch)


def test_cancelled_append_async_still_commits_its_record(threaded_store: CaptureStore, monkeypatch: pytest.MonkeyPatch) -> None:
    entered, release = hold_fdatasync(monkeypatch)
    record = make_record()

    async def main() -> None:
        task = asyncio.create_task(threaded_store.append_async("cancelled", record))
        while not entered.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    release.set()
    threaded_store.close()  # waits for the in-flight commit
    assert threaded_store.read("cancelled").entries == [(0, record)]


class LoopSyncSpy:
    """Records which files were fdatasynced and from which threads; `gate` runs before each sync."""

    def __init__(self, real: Callable[[int], None]) -> None:
        self.real = real
        self.lock = threading.Lock()
        self.paths: list[str] = []
        self.threads: set[int] = set()
        self.gate: Callable[[], None] = lambda: None

    def __call__(self, fd: int) -> None:
        self.gate()
        with self.lock:
            self.paths.append(fd_path(fd))
            self.threads.add(threading.get_ident())
        self.real(fd)


def test_awaited_appends_to_many_rollouts_share_syncs_off_the_loop(
    threaded_store: CaptureStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = LoopSyncSpy(os.fdatasync)
    monkeypatch.setattr(os, "fdatasync", spy)
    rollouts = [f"loop-{k}" for k in range(20)]
    appends = 5 * len(rollouts)

    def lines_written() -> int:
        return sum(threaded_store.path_for(r).read_bytes().count(b"\n") for r in rollouts if threaded_store.path_for(r).exists())

    def until_all_written() -> None:  # hold every sync until the loop has written every line
        deadline = time.monotonic() + WAIT
        while lines_written() < appends and time.monotonic() < deadline:
            time.sleep(0.005)

    spy.gate = until_all_written

    async def main() -> tuple[list[AppendResult], int]:
        results = await asyncio.gather(*(threaded_store.append_async(r, make_record(i)) for i in range(5) for r in rollouts))
        return results, threading.get_ident()

    results, loop_thread = asyncio.run(main())
    assert {result.path for result in results} == {threaded_store.path_for(r) for r in rollouts}
    assert loop_thread not in spy.threads  # the loop only writes; fsyncs run on helper threads
    data_syncs = [path for path in spy.paths if path.endswith(".capture.jsonl")]
    assert len(data_syncs) < appends  # lines queued while a sync ran share the next one, per file
    for rollout_id in rollouts:
        assert len(threaded_store.read(rollout_id, strict=True).entries) == 5


def test_awaited_append_after_another_store_cleared_the_rollout_starts_a_new_file(tmp_path: Path) -> None:
    """A writer keeps its data file open between appends; a clear() elsewhere unlinks that file,
    and the next append must land in the new file and obey the new fence."""
    with CaptureStore(tmp_path) as writer, CaptureStore(tmp_path) as clearer:
        asyncio.run(writer.append_async("r", make_record(0)))
        before_clear = make_record(1, started_at=time.time())
        clearer.clear("r")
        late = asyncio.run(writer.append_async("r", before_clear))
        current = asyncio.run(writer.append_async("r", make_record(2)))
        assert late.late and not current.late
        read = clearer.read("r", strict=True)
        assert [record["index"] for _, record in read.entries] == [2]
        assert read.late_writes == 1


def test_awaited_append_repairs_a_torn_tail_left_by_another_writer(store: CaptureStore) -> None:
    asyncio.run(store.append_async("r", make_record(0)))
    with open(store.path_for("r"), "ab") as other_process:
        other_process.write(b'{"model_call_id": "crashed mid-wri')
    asyncio.run(store.append_async("r", make_record(1)))
    read = store.read("r")
    assert [record["index"] for _, record in read.entries] == [0, 1]
    assert read.invalid_lines == [1] and not read.torn_tail


def test_append_after_another_tool_rewrote_the_file_to_the_same_size_keeps_records_whole(store: CaptureStore) -> None:
    """The store keeps the data file open; a size equal to what it last wrote proves nothing."""
    store.append("r", make_record(0))
    path = store.path_for("r")
    size = path.stat().st_size
    with open(path, "r+b") as rewriter:  # same inode, same length, but now ends mid-line
        rewriter.write(b"x" * (size - 1) + b"y")
    store.append("r", make_record(1))
    read = store.read("r")
    assert [record["index"] for _, record in read.entries] == [1]
    assert read.invalid_lines == [0] and not read.torn_tail


def test_awaited_append_waits_for_a_rollout_another_process_holds(store: CaptureStore) -> None:
    holder = os.open(store.root / "held.capture.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # a separate open file: as another process's commit

    async def main() -> AppendResult:
        task = asyncio.create_task(store.append_async("held", make_record()))
        await asyncio.sleep(0.2)
        assert not task.done()
        fcntl.flock(holder, fcntl.LOCK_UN)
        return await task

    try:
        assert asyncio.run(main()) == AppendResult(store.path_for("held"), late=False)
    finally:
        os.close(holder)
    assert len(store.read("held").entries) == 1


def test_rollouts_past_the_open_file_limit_are_closed_and_reopened(tmp_path: Path, no_sync: None) -> None:
    from llmtap.store.rollout_files import RolloutFileCache, SyncDescriptors

    with CaptureStore(tmp_path) as store:
        store._files = RolloutFileCache(store._dir_fd, lambda r: r + ".capture.lock", limit=3)
        store._sync_fds = SyncDescriptors(store._dir_fd, limit=3)
        open_before = len(os.listdir("/proc/self/fd"))
        for round_index in range(3):
            for k in range(10):
                store.append(f"r{k}", make_record(round_index))
                asyncio.run(store.append_async(f"r{k}", make_record(round_index)))
        assert len(os.listdir("/proc/self/fd")) - open_before <= 2 * 3 + 3  # lock + data, and the syncs' own
        for k in range(10):
            assert len(store.read(f"r{k}", strict=True).entries) == 6


# Failures and markers --------------------------------------------------------------------------


@pytest.mark.parametrize("failing", ["write", "fdatasync"])
def test_failed_write_raises_store_error_and_marks_the_rollout_incomplete(
    threaded_store: CaptureStore, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    real = getattr(os, failing)

    def no_space_for_capture_files(fd: int, *args: Any) -> Any:
        if fd_path(fd).endswith(".capture.jsonl"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, *args)

    monkeypatch.setattr(os, failing, no_space_for_capture_files)
    with pytest.raises(StoreError) as caught:
        threaded_store.append("full", make_record())
    assert isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == errno.ENOSPC
    assert "marked incomplete" in str(caught.value)
    assert threaded_store.read("full").incomplete
    assert b"No space left on device" in threaded_store.marker_path_for("full").read_bytes()

    with pytest.raises(StoreError):
        asyncio.run(threaded_store.append_async("full-async", make_record()))
    assert threaded_store.read("full-async").incomplete

    monkeypatch.setattr(os, failing, real)
    record = make_record()
    threaded_store.append("full", record)
    assert record in [r for _, r in threaded_store.read("full").entries]


def test_unencodable_record_raises_store_error_and_marks_incomplete(store: CaptureStore) -> None:
    with pytest.raises(StoreError, match="as JSON"):
        store.append("bad-record", make_record(payload={1, 2}))
    with pytest.raises(StoreError):
        store.append("bad-record", make_record(text="\ud800"))  # a lone surrogate has no UTF-8 form
    with pytest.raises(StoreError):
        store.append("bad-record", [1, 2])  # type: ignore[arg-type]
    assert store.read("bad-record").incomplete
    assert not store.read("bad-record").exists


def test_mark_incomplete_never_raises_and_logs_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with CaptureStore(tmp_path / "missing", create=False) as missing:
        with caplog.at_level(logging.ERROR, logger="llmtap.store"):
            missing.mark_incomplete("r", "first")
            missing.mark_incomplete("r", "second")
            missing.mark_incomplete("../bad", "third")
    assert len(caplog.records) == 1
    assert "'r'" in caplog.records[0].getMessage()


def test_mark_incomplete_records_its_reason(store: CaptureStore) -> None:
    store.mark_incomplete("r", "stream cut")
    assert orjson.loads(store.marker_path_for("r").read_bytes())["reason"] == "stream cut"
    assert store.read("r").incomplete and not store.read("r").exists


# Clearing and the late-writer fence ------------------------------------------------------------


def test_clear_removes_the_capture_and_its_marker(store: CaptureStore) -> None:
    store.append("attempt", make_record())
    store.mark_incomplete("attempt", "test")
    store.clear("attempt")
    read = store.read("attempt")
    assert (read.exists, read.incomplete, read.entries) == (False, False, [])
    assert store.rollouts() == []
    store.clear("never-written")  # clearing nothing is fine


def test_clear_diverts_a_late_writer_from_a_killed_attempt(store: CaptureStore) -> None:
    killed_attempt_call = make_record(0, started_at=time.time())
    store.clear("attempt")
    new_attempt_call = make_record(1)

    late = store.append("attempt", killed_attempt_call)
    current = store.append("attempt", new_attempt_call)

    assert late == AppendResult(store.root / "attempt.capture.late.jsonl", late=True)
    assert current == AppendResult(store.path_for("attempt"), late=False)
    read = store.read("attempt")
    assert read.entries == [(0, new_attempt_call)]
    assert read.late_writes == 1

    store.clear("attempt")
    assert store.read("attempt").late_writes == 0


def test_clear_waits_for_a_commit_in_flight(store: CaptureStore, monkeypatch: pytest.MonkeyPatch) -> None:
    entered, release = hold_fdatasync(monkeypatch)
    results: list[AppendResult] = []
    appender = threading.Thread(target=lambda: results.append(store.append("racing", make_record())))
    appender.start()
    assert entered.wait(WAIT)
    clearer = threading.Thread(target=store.clear, args=("racing",))
    clearer.start()
    clearer.join(timeout=0.2)
    still_waiting = clearer.is_alive()
    release.set()
    appender.join()
    clearer.join()
    assert still_waiting  # clear() queued behind the commit's lock instead of racing it
    assert results == [AppendResult(store.path_for("racing"), late=False)]
    assert not store.read("racing").exists  # the clear came after, and removed it


def test_unreadable_tombstone_still_fences_at_its_file_time(store: CaptureStore) -> None:
    store.clear("attempt")
    tombstone = store.root / "attempt.capture.cleared"
    tombstone.write_bytes(b"garbage")
    now = time.time()
    os.utime(tombstone, (now, now))
    assert store.append("attempt", make_record(started_at=now - 100)).late
    assert not store.append("attempt", make_record(started_at=now + 1)).late


def test_records_without_started_at_are_never_diverted(store: CaptureStore) -> None:
    store.clear("attempt")
    record = {"model_call_id": "x"}
    assert not store.append("attempt", record).late
    assert store.read("attempt").entries == [(0, record)]


def test_rollouts_lists_ids_with_a_data_file_or_a_marker(store: CaptureStore) -> None:
    store.append("b-data", make_record())
    store.mark_incomplete("a-marker", "test")
    store.clear("c-cleared")
    store.clear("d-late")
    store.append("d-late", make_record(started_at=0.0))
    (store.root / "notes.txt").write_text("not a capture")
    (store.root / "bad id.capture.jsonl").write_text("")
    assert store.rollouts() == ["a-marker", "b-data"]


# Lifecycle ----------------------------------------------------------------------------------------


def test_closed_store_refuses_appends_and_marks_the_rollout(tmp_path: Path) -> None:
    with CaptureStore(tmp_path) as closing:
        closing.append("r", make_record())
    closing.close()  # idempotent
    with pytest.raises(StoreError, match="is closed"):
        closing.append("r", make_record())
    with pytest.raises(StoreError, match="is closed"):
        asyncio.run(closing.append_async("r", make_record()))
    assert closing.read("r").incomplete
    assert len(closing.read("r").entries) == 1


def test_root_that_is_a_file_raises_store_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreError, match="Could not create the capture directory"):
        CaptureStore(tmp_path / "file")


@pytest.mark.parametrize("holder", ["clear", "cached writer"])
def test_forked_child_never_inherits_a_held_rollout_lock(tmp_path: Path, holder: str) -> None:
    """A fork during a commit used to give the child a copy of the lock descriptor, so the lock
    outlived the parent's commit and the child blocked forever on its own copy. The descriptors
    a store keeps open between appends are closed in the child for the same reason."""
    from llmtap.store.rollout_files import DESCRIPTORS

    store = CaptureStore(tmp_path)
    if holder == "clear":
        fd = store._lock("r")  # a clear() in flight holds the rollout's flock
    else:
        store.append("r", {"model_call_id": "parent", "started_at": time.time()})
        files = store._files.acquire("r", blocking=True)
        assert files is not None
        fd = files.lock_fd
        fcntl.flock(fd, fcntl.LOCK_EX)  # a commit in flight through the cached descriptor
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            store.append("r", {"model_call_id": "child", "started_at": time.time()})
        finally:
            os._exit(0)
    if holder == "clear":
        DESCRIPTORS.close(fd)  # the parent's clear ends
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        files.mutex.release()
    deadline, status = time.monotonic() + 20, (0, 0)
    while time.monotonic() < deadline and (status := os.waitpid(pid, os.WNOHANG)) == (0, 0):
        time.sleep(0.02)
    if status == (0, 0):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child blocked on the inherited lock")
    assert os.waitstatus_to_exitcode(status[1]) == 0
    expected = ["child"] if holder == "clear" else ["parent", "child"]
    assert [line["model_call_id"] for _, line in store.read("r").entries] == expected


def test_check_writable_passes_on_a_writable_directory_and_leaves_nothing(tmp_path: Path) -> None:
    with CaptureStore(tmp_path / "calls") as store:
        store.check_writable()
    assert list((tmp_path / "calls").iterdir()) == []


def test_check_writable_refuses_a_missing_directory(tmp_path: Path) -> None:
    from llmtap.errors import CaptureDirectoryError

    store = CaptureStore(tmp_path / "missing", create=False)
    with pytest.raises(CaptureDirectoryError, match="does not exist"):
        store.check_writable()
    with pytest.raises(CaptureDirectoryError):
        store.append("r", make_record())
    assert store.failure_counts() == {"directory_missing": 1}
    assert store.rollouts() == [] and not store.read("r").exists


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
def test_check_writable_refuses_a_read_only_directory(tmp_path: Path) -> None:
    from llmtap.errors import CaptureDirectoryError

    (tmp_path / "calls").mkdir(mode=0o500)
    with CaptureStore(tmp_path / "calls", create=False) as store:
        with pytest.raises(CaptureDirectoryError, match="make it writable"):
            store.check_writable()


def test_a_capture_directory_that_is_a_file_is_refused_at_construction(tmp_path: Path) -> None:
    from llmtap.errors import CaptureDirectoryError

    (tmp_path / "calls").write_bytes(b"")
    with pytest.raises(CaptureDirectoryError):
        CaptureStore(tmp_path / "calls")
    with pytest.raises(CaptureDirectoryError):
        CaptureStore(tmp_path / "calls", create=False)


def _fail_one_append(root: str) -> None:
    """In a separate process: one append that fails (its lock file is a FIFO)."""
    with CaptureStore(root) as store:
        try:
            store.append("r", make_record())
        except StoreError:
            pass


def test_the_incomplete_marker_adds_up_failures_across_processes(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "r.capture.lock")
    context = multiprocessing.get_context("spawn")
    for _ in range(3):
        worker = context.Process(target=_fail_one_append, args=(str(tmp_path),))
        worker.start()
        worker.join(60)
        assert worker.exitcode == 0
    with CaptureStore(tmp_path, create=False) as store:
        result = store.read("r")
    assert result.incomplete and result.capture_failures == 3
    assert orjson.loads((tmp_path / "r.capture.incomplete").read_bytes())["failures"] == 3
