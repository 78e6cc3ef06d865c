"""The spool writer: concurrent processes and threads, and forked children."""

from __future__ import annotations

import multiprocessing
import os
import threading
from pathlib import Path

import pytest

from llmtap.spool.frame import KIND_HEALTH, encode_frame, encode_meta, scan_frames
from llmtap.spool.writer import SpoolWriter

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
