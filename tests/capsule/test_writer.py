"""`read_regular_file`: reads a workload-writable file only as a regular file, never through a link, within a bound."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmtap.capsule.writer import FileTooLargeError, NotRegularFileError, read_regular_file


def test_a_regular_file_is_read_whole_and_within_its_limit(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * (3 << 20))
    assert read_regular_file(path) == b"x" * (3 << 20)
    assert read_regular_file(path, limit=3 << 20) == b"x" * (3 << 20)


def test_a_file_over_its_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 11)
    with pytest.raises(FileTooLargeError) as raised:
        read_regular_file(path, limit=10)
    assert (raised.value.size, raised.value.limit) == (11, 10)


def test_a_link_a_fifo_and_a_directory_are_refused(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"secret")
    os.symlink(target, tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError):
        read_regular_file(tmp_path / "link")
    for path in (tmp_path / "fifo", tmp_path):
        with pytest.raises(NotRegularFileError):
            read_regular_file(path)  # a FIFO never blocks the reader
