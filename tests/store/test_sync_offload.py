"""The sync helper process: its protocol, and the store's awaited appends through it and without it."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import llmtap.store.sync_offload as sync_offload
import llmtap.store.sync_worker as sync_worker
from llmtap.errors import StoreError
from llmtap.store import AppendResult, CaptureStore
from llmtap.store.sync_worker import ACK, NEW_FILE, REQUEST, serve
from tests.store.test_capture_store import fd_path, make_record

WAIT = 30.0


# The worker's protocol, in-process ---------------------------------------------------------------


class Worker:
    """`serve` on a thread, fed through real pipes; `fdatasync` calls are recorded by path; `on_sync` may hold or fail one.

    Batches are synced file by file unless `syncfs` is true; then `filesystem_syncs` counts the
    syncfs calls, and `on_syncfs` may fail one with an errno.
    """

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        on_sync: Callable[[str], int] = lambda path: 0,
        *,
        syncfs: bool = False,
        on_syncfs: Callable[[], int] = lambda: 0,
    ) -> None:
        self.synced: list[str] = []
        self.filesystem_syncs = 0
        real = os.fdatasync
        real_syncfs = sync_worker.FilesystemSync.sync

        def counting_syncfs(filesystem: sync_worker.FilesystemSync, directory_fd: int, slower_than: float) -> int:
            self.filesystem_syncs += 1
            return on_syncfs() or real_syncfs(filesystem, directory_fd, slower_than)

        if not syncfs:
            monkeypatch.setattr(sync_worker, "SYNCFS_MIN_FILES", 1 << 30)
        monkeypatch.setattr(sync_worker.FilesystemSync, "sync", counting_syncfs)

        def recording_fdatasync(fd: int) -> None:
            path = fd_path(fd)
            if code := on_sync(path):  # a non-zero errno fails the sync
                raise OSError(code, os.strerror(code))
            self.synced.append(path)
            real(fd)

        monkeypatch.setattr(os, "fdatasync", recording_fdatasync)
        self.requests_read, self.requests_write = os.pipe()
        self.acks_read, self.acks_write = os.pipe()
        self.thread = threading.Thread(target=serve, args=(self.requests_read, self.acks_write), daemon=True)
        self.thread.start()

    def ask(self, *requests: tuple[int, Path, bool]) -> dict[int, int]:
        """Send requests as one batch; return job id -> status."""
        payload = b""
        for job_id, path, new_file in requests:
            found = os.stat(path) if path.exists() else None
            inode = (found.st_dev, found.st_ino) if found else (0, 0)
            encoded = os.fsencode(path)
            payload += REQUEST.pack(job_id, *inode, len(encoded), NEW_FILE if new_file else 0) + encoded
        os.write(self.requests_write, payload)
        answers: dict[int, int] = {}
        buffer = b""
        while len(answers) < len(requests):
            buffer += os.read(self.acks_read, 4096)
            whole = len(buffer) - len(buffer) % ACK.size
            answers.update(ACK.iter_unpack(buffer[:whole]))
            buffer = buffer[whole:]
        return answers

    def stop(self) -> None:
        os.close(self.requests_write)
        self.thread.join(WAIT)
        for fd in (self.requests_read, self.acks_read, self.acks_write):
            os.close(fd)


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[Worker]:
    running = Worker(monkeypatch)
    yield running
    running.stop()


def test_worker_syncs_every_requested_file_and_acknowledges_every_request(worker: Worker, tmp_path: Path) -> None:
    first, second = tmp_path / "a.capture.jsonl", tmp_path / "b.capture.jsonl"
    first.write_bytes(b"{}\n")
    second.write_bytes(b"{}\n")
    answers = worker.ask((1, first, False), (2, second, False), (3, first, False))
    assert answers == {1: 0, 2: 0, 3: 0}
    assert set(worker.synced) == {str(first), str(second)} and len(worker.synced) <= 3


def write_files(directory: Path, count: int) -> list[Path]:
    paths = [directory / f"f{index}.capture.jsonl" for index in range(count)]
    for path in paths:
        path.write_bytes(b"{}\n")
    return paths


def test_worker_makes_a_batch_of_several_files_durable_with_one_filesystem_sync(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    libc = sync_worker._load_libc()
    if libc is None or libc.filesystem_type(os.fsencode(tmp_path)) not in sync_worker.SYNCFS_FILESYSTEMS:
        pytest.skip("the temporary directory is not on a filesystem syncfs is used for")
    worker = Worker(monkeypatch, syncfs=True)
    try:
        files = write_files(tmp_path, 5)
        assert worker.ask(*[(index, path, index == 0) for index, path in enumerate(files)]) == dict.fromkeys(range(5), 0)
        assert worker.filesystem_syncs == 1 and worker.synced == []
        assert worker.ask((9, files[0], False)) == {9: 0}  # one file alone: its own fdatasync is cheaper
        assert worker.filesystem_syncs == 1 and worker.synced == [str(files[0])]
    finally:
        worker.stop()


def test_a_failed_filesystem_sync_falls_back_to_per_file_syncs_which_name_the_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    files = write_files(tmp_path, 3)
    worker = Worker(
        monkeypatch,
        on_sync=lambda path: errno.EIO if path == str(files[1]) else 0,
        syncfs=True,
        on_syncfs=lambda: errno.EIO,
    )
    try:
        assert worker.ask(*[(index, path, False) for index, path in enumerate(files)]) == {0: 0, 1: errno.EIO, 2: 0}
        assert sorted(worker.synced) == [str(files[0]), str(files[2])]
    finally:
        worker.stop()


def test_a_slow_filesystem_sync_gives_way_to_per_file_syncs_until_its_retry_time(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """syncfs also flushes other programs' writes: when it is slower than per-file syncs, stop using it for a while."""
    monkeypatch.setattr(sync_worker, "SYNCFS_SLOW_SECONDS", 0.0)  # every syncfs counts as slow
    monkeypatch.setattr(sync_worker, "SYNCFS_RETRY_SECONDS", 3600.0)
    monkeypatch.setattr(sync_worker._Libc, "filesystem_type", lambda libc, directory: 0xEF53)  # whatever tmp is
    files = write_files(tmp_path, 3)
    worker = Worker(monkeypatch, syncfs=True)
    try:
        worker.ask(*[(index, path, False) for index, path in enumerate(files)])
        assert worker.filesystem_syncs == 1 and worker.synced == []
        worker.ask(*[(10 + index, path, False) for index, path in enumerate(files)])
        assert worker.filesystem_syncs == 1 and sorted(worker.synced) == sorted(map(str, files))
    finally:
        worker.stop()


def test_syncfs_is_trusted_only_from_linux_5_8_which_reports_writeback_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    def uname(release: str) -> os.uname_result:
        return os.uname_result(("Linux", "host", release, "#1", "x86_64"))

    monkeypatch.setattr(os, "uname", lambda: uname("5.4.0-150-generic"))
    assert sync_worker._load_libc() is None
    monkeypatch.setattr(os, "uname", lambda: uname("6.18.44-fc"))
    assert sync_worker._kernel_at_least(5, 8)


def test_a_filesystem_that_stays_slow_is_tried_again_less_and_less_often() -> None:
    clock = [1000.0]
    took = [1.0]  # seconds each syncfs takes

    class FakeLibc:
        def syncfs(self, fd: int) -> int:
            clock[0] += took[0]
            return 0

        def get_errno(self) -> int:
            return 0

    filesystem = sync_worker.FilesystemSync(clock=lambda: clock[0])
    filesystem._libc = FakeLibc()  # type: ignore[assignment]

    def sync_then_wait() -> float:
        """Sync once; return how long syncfs stays refused afterwards."""
        assert filesystem.allowed()
        began = clock[0]
        filesystem.sync(0, slower_than=0.0)
        while not filesystem.allowed():
            clock[0] += 0.5
        return clock[0] - began

    assert [sync_then_wait() for _ in range(4)] == [5.0, 10.0, 20.0, 40.0]
    took[0] = 0.0
    while filesystem.average_seconds >= sync_worker.SYNCFS_SLOW_SECONDS:  # fast again: the average falls
        sync_then_wait()
    took[0] = 1.0
    assert sync_then_wait() == 5.0  # and the next slow one waits the shortest time again


def test_filesystems_outside_the_list_are_synced_file_by_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sync_worker, "SYNCFS_FILESYSTEMS", frozenset())  # as for NFS or FUSE
    files = write_files(tmp_path, 3)
    worker = Worker(monkeypatch, syncfs=True)
    try:
        assert worker.ask(*[(index, path, False) for index, path in enumerate(files)]) == dict.fromkeys(range(3), 0)
        assert worker.filesystem_syncs == 0 and sorted(worker.synced) == sorted(map(str, files))
    finally:
        worker.stop()


def test_worker_needs_no_sync_for_a_file_a_clear_has_replaced_or_removed(worker: Worker, tmp_path: Path) -> None:
    replaced, removed = tmp_path / "replaced.capture.jsonl", tmp_path / "removed.capture.jsonl"
    replaced.write_bytes(b"{}\n")
    stale = os.stat(replaced)
    replaced.rename(tmp_path / "kept")  # kept alive under another name, so its inode is not reused
    replaced.write_bytes(b"{}\n")  # same name, new file: the one written is no longer there
    encoded = os.fsencode(replaced)
    os.write(worker.requests_write, REQUEST.pack(7, stale.st_dev, stale.st_ino, len(encoded), 0) + encoded)
    assert struct.unpack("<QI", os.read(worker.acks_read, ACK.size)) == (7, 0)
    assert worker.ask((8, removed, False)) == {8: 0}
    assert worker.synced == []


def test_worker_reports_a_failed_sync_by_its_errno(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    full = tmp_path / "full.capture.jsonl"
    full.write_bytes(b"{}\n")
    failing = Worker(monkeypatch, on_sync=lambda path: errno.ENOSPC if path.endswith("full.capture.jsonl") else 0)
    try:
        assert failing.ask((1, full, True)) == {1: errno.ENOSPC}
    finally:
        failing.stop()


@pytest.mark.parametrize("already_slow", [True, False], ids=["syncs-known-slow", "slow-sync-detected"])
def test_worker_answers_a_fast_file_while_a_slow_one_is_still_syncing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, already_slow: bool
) -> None:
    """Fast syncs run one after another on the reading thread; once a sync is seen to be slow,
    files go to threads, so a stalled file no longer holds the others."""
    if already_slow:
        monkeypatch.setattr(sync_worker, "FAST_SYNC_SECONDS", 0.0)
    slow, fast, first = (tmp_path / f"{name}.capture.jsonl" for name in ("slow", "fast", "first"))
    for path in (slow, fast, first):
        path.write_bytes(b"{}\n")
    release = threading.Event()

    def hold_the_slow_file(path: str) -> int:
        if path.endswith("first.capture.jsonl"):
            time.sleep(0.05)  # slower than FAST_SYNC_SECONDS: later batches go to threads
        if path.endswith("slow.capture.jsonl"):
            release.wait(WAIT)
        return 0

    worker = Worker(monkeypatch, on_sync=hold_the_slow_file)
    try:
        assert worker.ask((0, first, False)) == {0: 0}
        encoded = os.fsencode(slow)
        found = os.stat(slow)
        os.write(worker.requests_write, REQUEST.pack(1, found.st_dev, found.st_ino, len(encoded), 0) + encoded)
        time.sleep(0.05)  # the slow request is taken before the fast one arrives
        assert worker.ask((2, fast, False)) == {2: 0}  # answered while the slow sync is held
        release.set()
        assert struct.unpack("<QI", os.read(worker.acks_read, ACK.size)) == (1, 0)
    finally:
        release.set()
        worker.stop()


def test_requests_arriving_during_a_files_sync_share_its_next_sync(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sync_worker, "FAST_SYNC_SECONDS", 0.0)  # on threads, where a sync can overlap requests
    busy = tmp_path / "busy.capture.jsonl"
    busy.write_bytes(b"{}\n")
    entered, release = threading.Event(), threading.Event()

    def hold_first_sync(path: str) -> int:
        if not entered.is_set():
            entered.set()
            release.wait(WAIT)
        return 0

    worker = Worker(monkeypatch, on_sync=hold_first_sync)
    try:
        found = os.stat(busy)
        encoded = os.fsencode(busy)

        def request(job_id: int) -> bytes:
            return REQUEST.pack(job_id, found.st_dev, found.st_ino, len(encoded), 0) + encoded

        os.write(worker.requests_write, request(1))
        assert entered.wait(WAIT)
        os.write(worker.requests_write, request(2) + request(3))  # written after the first sync began
        time.sleep(0.05)
        release.set()
        answers = b""
        while len(answers) < 3 * ACK.size:
            answers += os.read(worker.acks_read, 4096)
        assert sorted(ACK.iter_unpack(answers)) == [(1, 0), (2, 0), (3, 0)]
        assert worker.synced == [str(busy), str(busy)]  # one sync for the first, one for the two after
    finally:
        release.set()
        worker.stop()


# The store through the helper ---------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[CaptureStore]:
    with CaptureStore(tmp_path / "captures") as capture_store:
        yield capture_store


def spy_on_data_syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Data-file fdatasyncs made in this process (the helper's are in its own)."""
    synced: list[str] = []
    real = os.fdatasync

    def spy(fd: int) -> None:
        if fd_path(fd).endswith(".capture.jsonl"):
            synced.append(fd_path(fd))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", spy)
    return synced


async def append_many(store: CaptureStore, rollouts: list[str], per_rollout: int) -> list[AppendResult]:
    return await asyncio.gather(*(store.append_async(r, make_record(i)) for i in range(per_rollout) for r in rollouts))


def test_awaited_appends_are_synced_by_the_helper_not_in_this_process(
    store: CaptureStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced_here = spy_on_data_syncs(monkeypatch)
    rollouts = [f"r{k}" for k in range(8)]
    results = asyncio.run(append_many(store, rollouts, 5))
    assert len(results) == 40 and not any(result.late for result in results)
    assert synced_here == []
    helper = store._offload._process
    assert helper is not None and helper.poll() is None
    for rollout_id in rollouts:
        assert len(store.read(rollout_id, strict=True).entries) == 5
    store.close()
    assert helper.poll() == 0  # closing the store ends its helper


def test_appends_keep_working_on_helper_threads_when_the_helper_dies(
    store: CaptureStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    asyncio.run(append_many(store, ["before"], 3))
    helper = store._offload._process
    assert helper is not None
    synced_here = spy_on_data_syncs(monkeypatch)
    os.kill(helper.pid, signal.SIGKILL)
    helper.wait()
    with caplog.at_level(logging.WARNING, logger="llmtap.store"):
        results = asyncio.run(append_many(store, ["after-a", "after-b"], 10))
    assert len(results) == 20
    assert synced_here  # the thread path took over
    assert [len(store.read(r, strict=True).entries) for r in ("before", "after-a", "after-b")] == [3, 10, 10]
    warnings = [record for record in caplog.records if "sync helper" in record.getMessage()]
    assert len(warnings) == 1


def test_requests_beyond_a_full_pipe_wait_for_the_helper_and_all_complete(store: CaptureStore) -> None:
    asyncio.run(append_many(store, ["warm-up"], 1))  # the helper is running
    helper = store._offload._process
    assert helper is not None
    os.kill(helper.pid, signal.SIGSTOP)  # it reads nothing while thousands of requests queue up

    async def main() -> list[AppendResult]:
        appends = asyncio.gather(*(store.append_async(f"r{k % 50}", {"model_call_id": str(k)}) for k in range(3000)))
        await asyncio.sleep(0.3)
        os.kill(helper.pid, signal.SIGCONT)
        return await appends

    try:
        results = asyncio.run(main())
    finally:
        os.kill(helper.pid, signal.SIGCONT)
    assert len(results) == 3000
    assert sum(len(store.read(f"r{k}", strict=True).entries) for k in range(50)) == 3000
    assert helper.poll() is None  # the helper did the syncs; nothing fell back


def test_a_sync_the_helper_reports_failed_fails_the_append_and_marks_the_rollout(
    store: CaptureStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    no_space = tmp_path / "no_space_worker.py"
    no_space.write_text(
        "import os, struct\n"
        "buffer = b''\n"
        "while data := os.read(0, 65536):\n"
        "    buffer += data\n"
        "    while len(buffer) >= 27:\n"
        "        job, _, _, length, _ = struct.unpack_from('<QQQHB', buffer)\n"
        "        buffer = buffer[27 + length:]\n"
        f"        os.write(1, struct.pack('<QI', job, {errno.ENOSPC}))\n"
    )
    monkeypatch.setattr(sync_offload, "_WORKER", str(no_space))
    with pytest.raises(StoreError) as caught:
        asyncio.run(store.append_async("full", make_record()))
    assert isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == errno.ENOSPC
    assert store.read("full").incomplete


def test_one_store_serves_event_loops_one_after_another_and_side_by_side(store: CaptureStore) -> None:
    asyncio.run(append_many(store, ["first-loop"], 5))
    asyncio.run(append_many(store, ["second-loop"], 5))  # the helper moves to the new loop

    def in_own_loop(rollout_id: str) -> None:
        asyncio.run(append_many(store, [rollout_id], 50))

    threads = [threading.Thread(target=in_own_loop, args=(f"thread-{k}",)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    counts = [len(store.read(r, strict=True).entries) for r in ("first-loop", "second-loop", "thread-0", "thread-1", "thread-2")]
    assert counts == [5, 5, 50, 50, 50]


def test_closing_the_store_from_another_thread_waits_for_the_helper_and_settles_every_append(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    results: list[AppendResult] = []
    ready = threading.Event()

    async def appender() -> None:
        tasks = [asyncio.ensure_future(store.append_async(f"r{k % 4}", make_record(k))) for k in range(40)]
        await asyncio.sleep(0)  # each append writes its line and hands it to the helper
        ready.set()
        results.extend(await asyncio.gather(*tasks))

    loop_thread = threading.Thread(target=asyncio.run, args=(appender(),))
    loop_thread.start()
    assert ready.wait(WAIT)
    store.close()  # the loop is still running in its own thread
    loop_thread.join(WAIT)
    assert not loop_thread.is_alive() and len(results) == 40
    assert sum(len(store.read(f"r{k}", strict=True).entries) for k in range(4)) == 40


def test_closing_the_store_on_its_own_loop_writes_the_appends_of_the_current_turn(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)

    async def main() -> list[AppendResult]:
        tasks = [asyncio.ensure_future(store.append_async("r", make_record(k))) for k in range(10)]
        await asyncio.sleep(0)  # every append is accepted; the turn's write has not run yet
        store.close()  # on the loop's own thread: writes them, syncs them, settles them
        return await asyncio.gather(*tasks)

    results = asyncio.run(main())
    assert len(results) == 10 and all(result.path == store.path_for("r") for result in results)
    assert len(store.read("r", strict=True).entries) == 10


def test_a_store_dropped_without_closing_still_lets_its_helper_finish_and_exit(tmp_path: Path) -> None:
    import gc

    store = CaptureStore(tmp_path)
    asyncio.run(append_many(store, ["r"], 3))
    helper = store._offload._process
    assert helper is not None
    del store
    gc.collect()
    assert helper.returncode == 0  # reaped by the store's finalizer, no "still running" warning
    assert len(CaptureStore(tmp_path, sync_process=False).read("r", strict=True).entries) == 3


def test_a_store_left_open_at_exit_is_closed_once_without_errors(tmp_path: Path) -> None:
    """At exit the store's close() runs, not the helper's finalizer too: a second close of the
    same descriptor numbers raised EBADF, and could have closed a file that reused one."""
    import subprocess
    import sys

    program = (
        "import asyncio, sys\n"
        "from llmtap.store import CaptureStore\n"
        "async def once(store):\n"
        "    await store.append_async('r', {'started_at': 1.0})\n"
        "store = CaptureStore(sys.argv[1])\n"
        "asyncio.run(once(store))\n"
        "asyncio.run(once(store))\n"
    )
    done = subprocess.run([sys.executable, "-c", program, str(tmp_path)], capture_output=True, text=True, timeout=WAIT)
    assert (done.returncode, done.stderr) == (0, "")
    assert len(CaptureStore(tmp_path, sync_process=False).read("r", strict=True).entries) == 2


def test_the_helpers_finalizer_then_close_close_each_descriptor_once(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    asyncio.run(append_many(store, ["r"], 2))
    finalizer = store._offload._finalizer
    assert finalizer is not None and finalizer.atexit is False
    finalizer()  # what a garbage collection of the helper's owner does
    store.close()  # must not close the numbers again
    assert store._offload._pipe == [-1, -1]


def test_a_forked_child_leaves_its_parents_helper_alone(store: CaptureStore) -> None:
    asyncio.run(append_many(store, ["parent"], 1))
    helper = store._offload._process
    assert helper is not None
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            asyncio.run(store.append_async("child", make_record()))  # its own helper
            code = 0 if store._offload._process is not helper else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert helper.poll() is None  # the parent's helper still serves the parent
    asyncio.run(append_many(store, ["parent"], 1))
    assert [len(store.read(r).entries) for r in ("parent", "child")] == [2, 1]


def test_store_without_the_helper_never_starts_one(tmp_path: Path) -> None:
    with CaptureStore(tmp_path, sync_process=False) as store:
        asyncio.run(append_many(store, ["r"], 3))
        assert store._offload._process is None
        assert len(store.read("r").entries) == 3


def test_helper_exits_when_its_store_process_is_killed(tmp_path: Path) -> None:
    """The helper reads until its request pipe closes, which the kernel does when the owner dies."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            os.close(read_end)
            store = CaptureStore(tmp_path)
            asyncio.run(store.append_async("r", make_record()))
            helper = store._offload._process
            os.write(write_end, str(helper.pid if helper else 0).encode())
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(write_end)
    helper_pid = int(os.read(read_end, 64) or b"0")
    os.close(read_end)
    assert helper_pid
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and Path(f"/proc/{helper_pid}").exists():
        if Path(f"/proc/{helper_pid}/stat").read_text().split(") ")[1].startswith("Z"):
            break  # exited; its parent is gone, so init reaps it
        time.sleep(0.02)
    alive = Path(f"/proc/{helper_pid}").exists() and not Path(f"/proc/{helper_pid}/stat").read_text().split(") ")[1].startswith("Z")
    assert not alive


# An append alone on its loop -------------------------------------------------------------------


def test_an_append_alone_on_its_loop_syncs_an_existing_file_there_without_the_helper(
    store: CaptureStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(store.append_async("r", make_record(0)))  # creates the file: its name needs the helper's directory sync
    synced_here = spy_on_data_syncs(monkeypatch)
    result = asyncio.run(store.append_async("r", make_record(1), alone=True))
    assert synced_here == [str(store.path_for("r"))] and not result.late
    assert not store._offload._pending
    asyncio.run(store.append_async("r", make_record(2)))  # not alone: the helper again
    assert synced_here == [str(store.path_for("r"))]
    assert len(store.read("r", strict=True).entries) == 3


def test_a_new_file_or_an_append_joining_a_turn_is_never_synced_on_the_loop(
    store: CaptureStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced_here = spy_on_data_syncs(monkeypatch)
    asyncio.run(store.append_async("new", make_record(), alone=True))  # a new name needs the directory synced too

    async def alone_after_another_in_the_same_turn() -> list[AppendResult]:
        return await asyncio.gather(store.append_async("other", make_record(1)),
                                    store.append_async("new", make_record(2), alone=True))

    asyncio.run(alone_after_another_in_the_same_turn())
    assert synced_here == []
    assert [len(store.read(r, strict=True).entries) for r in ("new", "other")] == [2, 1]


def test_a_failed_sync_on_the_loop_fails_the_append_and_marks_the_rollout(
    store: CaptureStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(store.append_async("r", make_record(0)))

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(StoreError):
        asyncio.run(store.append_async("r", make_record(1), alone=True))
    assert store.marker_path_for("r").exists()


def test_syncs_on_the_loop_stop_while_the_disk_is_slow_and_are_tried_again_later(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmtap.store.inline_sync import InlineSyncGate as _InlineSyncGate

    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    gate = _InlineSyncGate()
    for _ in range(20):
        gate.took(0.0001)
    assert gate.allows()
    gate.took(0.05)  # one sync of 50 ms lifts the average past the limit
    assert not gate.allows()
    now[0] += gate.RETRY_SECONDS
    assert gate.allows()  # one more try on the loop
    gate.took(0.0001)
    while not gate.allows():  # the average falls back below the limit as fast syncs come in
        now[0] += gate.RETRY_SECONDS
        gate.took(0.0001)
    assert gate._average < gate.SLOW_SECONDS


def test_a_turns_sync_requests_leave_with_the_turns_write_not_a_loop_turn_later(store: CaptureStore) -> None:
    async def main() -> None:
        appends = [asyncio.ensure_future(store.append_async(f"r{k}", make_record(k))) for k in range(3)]
        await asyncio.sleep(0)  # the appends run; the first schedules the turn's writer
        await asyncio.sleep(0)  # the writer has run: lines written, sync requests sent with it
        assert store._offload._outbox == [] and not store._offload._flush_scheduled
        await asyncio.gather(*appends)

    asyncio.run(main())
    assert [len(store.read(f"r{k}", strict=True).entries) for k in range(3)] == [1, 1, 1]
