"""`llmtap serve` refuses a capture directory it cannot write, at start, in one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import llmtap.server.run  # noqa: F401  (imported before a child drops its privileges)
from llmtap.cli import main
from llmtap.errors import ConfigError
from llmtap.server.capture_dir import check_capture_dir

NOBODY = 65534


def _as_nobody(capture_dir: Path) -> tuple[int, str]:
    """Run `llmtap serve --capture-dir DIR` in a forked child that has dropped to user nobody;
    return its exit code and output. A real permission check: root would write anywhere."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            result = CliRunner().invoke(
                main, ["serve", "--capture-dir", str(capture_dir), "--upstream", "http://127.0.0.1:9"]
            )
            os.write(write_end, f"{result.exit_code}\n{result.output}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    received = b""
    while piece := os.read(read_end, 65536):
        received += piece
    os.close(read_end)
    os.waitpid(pid, 0)
    code, _, output = received.decode().partition("\n")
    return int(code), output


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another user needs root")
def test_serve_refuses_a_read_only_capture_dir_at_start_in_one_line(tmp_path: Path) -> None:
    capture_dir = tmp_path / "calls"
    capture_dir.mkdir()
    capture_dir.chmod(0o555)
    tmp_path.chmod(0o755)
    code, output = _as_nobody(capture_dir)
    assert code == 1
    assert output.count("\n") == 1 and output.startswith("Error: The capture directory")
    assert f"'{capture_dir}'" in output and "Permission denied" in output and "--capture-dir" in output
    assert "llmtap serve on" not in output  # nothing was started
    assert list(capture_dir.iterdir()) == []  # the probe left nothing behind


def test_a_file_where_the_capture_dir_should_be_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "calls"
    target.write_text("not a directory")
    with pytest.raises(ConfigError, match="cannot be written|is not a directory") as refused:
        check_capture_dir(target)
    assert str(target) in str(refused.value)


def test_a_symlink_in_place_of_the_capture_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "calls").symlink_to(tmp_path / "real")
    with pytest.raises(ConfigError, match="is not a directory"):
        check_capture_dir(tmp_path / "calls")


def test_a_writable_dir_is_created_and_left_empty(tmp_path: Path) -> None:
    target = tmp_path / "new" / "calls"
    assert check_capture_dir(target) == target
    assert target.is_dir() and list(target.iterdir()) == []
