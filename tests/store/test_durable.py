"""The atomic-write toolkit: a planted link or file next to the target is never written through."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmtap.store.durable import replace_atomically, write_file_atomic, write_file_last


def test_replace_atomically_never_writes_through_a_link_planted_at_the_old_temp_name(tmp_path: Path) -> None:
    target = tmp_path / "rollout.capture.jsonl"
    target.write_bytes(b"old\n")
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"not the workload's to change\n")
    planted = target.with_name(f".{target.name}.rewrite-{os.getpid()}.tmp")  # the name used before
    planted.symlink_to(outside)

    with replace_atomically(target, "rewrite") as writer:
        writer.write(b"new\n")

    assert target.read_bytes() == b"new\n"
    assert not target.is_symlink()
    assert outside.read_bytes() == b"not the workload's to change\n"
    assert planted.is_symlink() and os.readlink(planted) == str(outside)  # left as it was, not followed
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([target.name, outside.name, planted.name])


def test_replace_atomically_leaves_the_target_and_no_temp_file_when_the_writer_fails(tmp_path: Path) -> None:
    target = tmp_path / "data.json"
    target.write_bytes(b"kept")

    with pytest.raises(RuntimeError), replace_atomically(target, "rewrite") as writer:
        writer.write(b"half")
        raise RuntimeError("stop")

    assert target.read_bytes() == b"kept"
    assert [path.name for path in tmp_path.iterdir()] == ["data.json"]


def test_a_file_replaced_atomically_replaces_a_link_as_a_name_and_leaves_its_target_alone(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"outside")
    target = tmp_path / "capsule.json"
    target.symlink_to(outside)

    write_file_atomic(target, b"{}")

    assert not target.is_symlink() and target.read_bytes() == b"{}"
    assert outside.read_bytes() == b"outside"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["capsule.json", "outside.txt"]


def test_a_failed_commit_write_leaves_no_temp_file_and_the_old_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "capsule.json"
    target.write_bytes(b'{"status": "running"}')

    def no_space(fd: int, data: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", no_space)
    with pytest.raises(OSError, match="No space"):
        write_file_last(target, b'{"status": "success"}', after=[])
    monkeypatch.undo()

    assert target.read_bytes() == b'{"status": "running"}'
    assert [path.name for path in tmp_path.iterdir()] == ["capsule.json"]
