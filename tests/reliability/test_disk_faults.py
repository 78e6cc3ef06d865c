"""A capture directory that fills up or turns read-only while `llmtap serve` runs.

The calls must go on unchanged (capture never changes the workload), every failed write must be
counted (serve logs `llmtap capture failure: event=record_write_failed` once per kind), and the
records that did land stay readable. Both cases use a small tmpfs mounted for the test: as root,
permission bits do not stop writes, so a read-only mount is the honest way to refuse them. Without
permission to mount, they skip and say why.
"""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from llmtap.store import CaptureStore
from llmtap.store.readers import read_rollout_calls
from tests.support.faults import FAULT_HEADER, FaultUpstream
from tests.support.serve_process import ServeProcess

CHAT = {"model": "gpt-4", "messages": [{"role": "user", "content": "Say this is a test"}]}
WRITE_FAILED = "llmtap capture failure: event=record_write_failed"


@contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of `size` at `where` for the block; skip the test when mounting is not permitted."""
    where.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
                       check=True, capture_output=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("no mount command here: the disk-fault cases need to mount a small tmpfs")
    except subprocess.CalledProcessError as failed:
        pytest.skip(f"mounting a tmpfs is not permitted here ({failed.stderr.decode().strip()}): "
                    "the disk-fault cases need root in a namespace that may mount")
    try:
        yield where
    finally:
        unmounted = subprocess.run(["umount", str(where)], check=False, capture_output=True, timeout=30)
        if unmounted.returncode != 0:  # something still holds a file there: detach it anyway
            subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True, timeout=30)


def remount(where: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(where)], check=True, capture_output=True, timeout=30)


def fill(directory: Path) -> Path:
    """Write a file until the filesystem has no block left; return it (delete it to free the space)."""
    filler = directory / "filler"
    with filler.open("wb", buffering=0) as sink:
        try:
            while True:
                sink.write(b"\0" * 4096)
        except OSError as full:
            assert full.errno == errno.ENOSPC
    return filler


def chat_calls(base: str, rollout_id: str, count: int) -> list[bytes]:
    """`count` chat calls, streamed and not by turns; returns each response body as the client got it."""
    bodies = []
    with httpx.Client(trust_env=False, timeout=30) as http:
        for index in range(count):
            answer = http.post(f"{base}/ng-rollout/{rollout_id}/v1/chat/completions",
                               json={**CHAT, "stream": index % 2 == 1}, headers={FAULT_HEADER: "ok"})
            assert answer.status_code == 200
            bodies.append(answer.content)
    return bodies


def direct_bodies(fault_upstream: FaultUpstream, count: int) -> list[bytes]:
    with httpx.Client(trust_env=False, timeout=30) as http:
        return [http.post(fault_upstream.url("ok") + "/v1/chat/completions", json={**CHAT, "stream": index % 2 == 1}).content
                for index in range(count)]


def test_a_full_disk_leaves_the_calls_unchanged_and_counts_every_failed_record(
    fault_upstream: FaultUpstream, tmp_path: Path
) -> None:
    expected = direct_bodies(fault_upstream, 6)
    with small_tmpfs(tmp_path / "mnt", "1m") as mount:
        capture = mount / "capture"
        capture.mkdir()
        with ServeProcess(fault_upstream.base_url, capture, log=tmp_path / "serve.log").start() as serve:
            before = chat_calls(serve.base_url, "filling", 2)
            filler = fill(mount)
            during = chat_calls(serve.base_url, "filling", 6) + chat_calls(serve.base_url, "fresh", 2)
            filler.unlink()
            after = chat_calls(serve.base_url, "filling", 2)
            log = serve.log_text()
        with CaptureStore(capture, create=False) as store:
            filling = read_rollout_calls(store, "filling")
            fresh = read_rollout_calls(store, "fresh")

    assert before + during + after == expected[:2] + expected + expected[:2] + expected[:2]  # zero altered bytes
    assert log.count(WRITE_FAILED) >= 1  # counted, and logged once per kind
    assert filling.incomplete  # the rollout that lost records says so
    landed = [record.call_index for record in filling.records]
    assert len(landed) >= 4  # the calls before and after the full disk
    # A write cut short by the full disk is truncated back: the file stays whole lines, no damaged
    # line for ever after, and the calls that landed keep consecutive indexes.
    assert filling.unreadable_lines == [] and landed == list(range(len(landed)))
    assert filling.records[-1].error_category is None and not filling.torn_tail
    assert len(fresh.records) == 0 or fresh.incomplete


def test_a_capture_dir_that_turns_read_only_leaves_the_calls_unchanged_and_counts_the_failures(
    fault_upstream: FaultUpstream, tmp_path: Path
) -> None:
    """Linux refuses to remount a filesystem read-only while a file on it is open for writing, so
    the mount turns read-only after serve started but before its first call opened a rollout."""
    expected = direct_bodies(fault_upstream, 4)
    with small_tmpfs(tmp_path / "mnt", "4m") as mount:
        capture = mount / "capture"
        capture.mkdir()
        with ServeProcess(fault_upstream.base_url, capture, log=tmp_path / "serve.log").start() as serve:
            remount(mount, "ro")
            try:
                with pytest.raises(OSError) as refused:
                    (capture / "probe").write_bytes(b"x")  # root, and still refused: the mount is read-only
                assert refused.value.errno == errno.EROFS
                during = chat_calls(serve.base_url, "ro", 4)
            finally:
                remount(mount, "rw")
            after = chat_calls(serve.base_url, "ro", 2)
            log = serve.log_text()
        with CaptureStore(capture, create=False) as store:
            ro = read_rollout_calls(store, "ro", strict=True)

    assert during + after == expected + expected[:2]  # zero altered bytes
    assert log.count(WRITE_FAILED) >= 1  # counted (logged once per kind)
    assert len(ro.records) == 2  # the calls after; the four before are counted failures
    assert all(record.error_category is None for record in ro.records)
