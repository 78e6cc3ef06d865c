"""Capsule files: env.lock safety, per-process health sums, tamper-proof finalisation, run lookup, ids,
times, and the order in which a capsule's files reach the disk."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmtap.capsule.envlock import env_lock, interpreter_lines, parse_interpreter_lines, safe_environment, scan_packages
from llmtap.capsule.finalise import CaptureOutcome, finalise_capsule
from llmtap.capsule.health import sum_process_health, write_process_health
from llmtap.capsule.manifest import CapsuleError, find_capsule, iso_time, list_capsules, start_manifest
from llmtap.capsule.ulid import is_ulid, new_ulid, ulid_time
from llmtap.capsule.writer import create_capsule, create_capsule_directories, write_json_last, write_new_file


def test_the_safe_environment_keeps_allowlisted_names_and_withholds_secrets() -> None:
    environ = {
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "PATH": "/usr/bin",
        "OPENAI_API_KEY": "sk-proj-abc",
        "AWS_SECRET_ACCESS_KEY": "x",
        "GITHUB_TOKEN": "ghp_x",
        "HOME": "/root",
        "PIP_INDEX_URL": "https://user:pass@pypi.internal/simple",
        "LLMTAP_SESSION_TOKEN": "t",
    }
    kept, withheld = safe_environment(environ)
    assert kept == {"LANG": "C.UTF-8", "LC_ALL": "C", "PATH": "/usr/bin"}
    assert withheld == 6
    assert "sk-proj" not in json.dumps(env_lock(None, environ, source="run"))


def test_packages_are_read_from_dist_info_names_and_metadata(tmp_path: Path) -> None:
    (tmp_path / "requests-2.34.2.dist-info").mkdir()
    weird = tmp_path / "odd_pkg-1.0-py3.11.egg-info"
    weird.mkdir()
    (weird / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: odd-pkg\nVersion: 1.0\n\nbody\n")
    shadowed = tmp_path / "later"
    (shadowed / "requests-1.0.dist-info").mkdir(parents=True)
    packages = scan_packages([str(tmp_path), str(shadowed)])
    assert [(p["name"], p["version"]) for p in packages] == [("odd-pkg", "1.0"), ("requests", "2.34.2")]


def test_the_interpreter_notes_round_trip() -> None:
    info = parse_interpreter_lines(interpreter_lines())
    assert info == {
        "executable": sys.executable,
        "version": sys.version.splitlines()[0],
        "implementation": sys.implementation.name,
        "prefix": sys.prefix,
        "base_prefix": sys.base_prefix,
        "platform": sys.platform,
        "path": sys.path,
    }
    written = "executable=/opt/py/bin/python3\nnot a key line\npath=/a\npath=\npath=/b=c\nversion=3.12.1 (main)\n"
    assert parse_interpreter_lines(written) == {
        "executable": "/opt/py/bin/python3",
        "version": "3.12.1 (main)",
        "path": ["/a", "", "/b=c"],
    }


def test_process_health_files_are_summed(tmp_path: Path) -> None:
    write_process_health(tmp_path / "1-a.json", {"records_written": 2, "record_write_failed": 1})
    write_process_health(tmp_path / "2-b.json", {"records_written": 3})
    (tmp_path / "3-c.json").write_text("{not json")
    summed = sum_process_health(tmp_path)
    assert summed["totals"] == {"record_write_failed": 1, "records_written": 5}
    assert summed["unreadable_files"] == 1
    assert len(summed["processes"]) == 2


def _capsule(tmp_path: Path, run_id: str | None = None) -> tuple[Path, dict]:  # type: ignore[type-arg]
    paths = create_capsule(tmp_path / "runs", run_id=run_id)
    manifest = start_manifest(paths, capture_mode="run", command=["python", "x.py"], cwd="/w", started_at=1.0, registry_source=None)
    return paths.root, manifest


def test_finalisation_removes_links_and_fifos_without_following_them(tmp_path: Path) -> None:
    from llmtap.capsule.writer import CapsulePaths

    root, manifest = _capsule(tmp_path)
    paths = CapsulePaths(root)
    outside = tmp_path / "host-file.txt"
    outside.write_text("do not touch")
    os.symlink(outside, paths.model_calls)
    os.mkfifo(paths.env_lock)
    os.symlink(outside, paths.calls / "default.capture.jsonl")
    final = finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))
    assert outside.read_text() == "do not touch"
    assert sorted(entry["kind"] for entry in final["capture_tampered"]) == ["fifo", "symlink", "symlink"]
    assert paths.model_calls.is_file() and not paths.model_calls.is_symlink()
    health = json.loads(paths.capture_health.read_text())
    assert health["ok"] is False and len(health["tampered_entries"]) == 3


def test_a_failed_run_is_finalised_with_its_error_and_a_non_python_env_lock(tmp_path: Path) -> None:
    from llmtap.capsule.writer import CapsulePaths

    root, manifest = _capsule(tmp_path)
    error = {"type": "NonZeroExit", "message": "The command exited with code 3."}
    final = finalise_capsule(CapsulePaths(root), manifest, CaptureOutcome("failure", exit_code=3, error=error))
    assert (final["status"], final["exit_code"], final["error"]) == ("failure", 3, error)
    assert final["counts"]["model_calls"] == 0
    assert json.loads((root / "env.lock").read_text())["python"] is None
    assert json.loads((root / "capsule.json").read_text())["status"] == "failure"


def test_runs_are_found_by_id_prefix_path_and_latest(tmp_path: Path) -> None:
    first, _ = _capsule(tmp_path, new_ulid(now_ms=1_700_000_000_000))
    second, _ = _capsule(tmp_path, new_ulid(now_ms=1_800_000_000_000))
    runs = tmp_path / "runs"
    assert [path for path, _ in list_capsules(runs)] == [first, second]
    assert find_capsule(runs, "latest") == second
    assert find_capsule(runs, second.name[:8].lower()) == second
    assert find_capsule(runs, str(first)) == first
    with pytest.raises(CapsuleError, match="No run"):
        find_capsule(runs, "ZZZZ")


def test_ulids_sort_by_creation_and_carry_their_time() -> None:
    ids = [new_ulid() for _ in range(200)]
    assert ids == sorted(ids) and len(set(ids)) == 200
    assert abs(ulid_time(new_ulid(now_ms=1_700_000_000_000)) - 1_700_000_000.0) < 0.001
    with pytest.raises(ValueError):
        ulid_time("not-a-ulid")


@given(st.one_of(st.floats(min_value=0, max_value=2**33, allow_nan=False), st.integers(0, 2**33).map(float)))
def test_capsule_times_read_as_datetime_writes_them(seconds: float) -> None:
    expected = dt.datetime.fromtimestamp(seconds, tz=dt.UTC).isoformat().replace("+00:00", "Z")
    assert iso_time(seconds) == expected


@pytest.mark.parametrize("seconds", [0.0, 0.9999995, 1.0000005, 1_700_000_000.0000005, 1_700_000_000.5, 1_700_000_000.999_999_6])
def test_capsule_times_round_microseconds_as_datetime_does(seconds: float) -> None:
    assert iso_time(seconds) == dt.datetime.fromtimestamp(seconds, tz=dt.UTC).isoformat().replace("+00:00", "Z")


@given(st.text(alphabet="0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabc-", min_size=24, max_size=28))
def test_a_ulid_is_what_the_crockford_pattern_accepts(text: str) -> None:
    assert is_ulid(text) == bool(re.fullmatch(r"[0-7][0-9A-HJKMNP-TV-Z]{25}", text))


def test_new_capsule_directories_have_the_layout_the_workload_writes_into(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    root = create_capsule_directories("runs//here/", run_id=new_ulid())
    assert root == str((tmp_path / "runs" / "here" / Path(root).name).resolve())
    assert sorted(str(path.relative_to(root)) for path in Path(root).rglob("*")) == [
        "calls", "internal", "internal/health", "outputs",
    ]


def test_a_new_file_is_never_written_over_an_existing_name_or_through_a_link(tmp_path: Path) -> None:
    target = tmp_path / "url_registry.json"
    write_new_file(target, b"{}")
    assert target.read_bytes() == b"{}"
    with pytest.raises(FileExistsError):
        write_new_file(target, b"[]")
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    with pytest.raises(FileExistsError):
        write_new_file(tmp_path / "link", b"[]")
    assert not (tmp_path / "elsewhere").exists()


def test_the_manifest_is_renamed_in_only_after_the_files_it_names_are_synced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    others = [tmp_path / name for name in ("model-calls.jsonl", "capture-health.json", "env.lock")]
    for path in others:
        path.write_text("{}")
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(source: str, target: str) -> None:
        events.append(("replace", str(target)))
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_json_last(tmp_path / "capsule.json", {"status": "success"}, after=others)
    renamed = events.index(("replace", str(tmp_path / "capsule.json")))
    synced_before = {path for kind, path in events[:renamed] if kind == "fsync"}
    assert {str(path) for path in others} | {str(tmp_path)} <= synced_before
    assert any(path.startswith(str(tmp_path / ".capsule.json.")) for path in synced_before)  # the new manifest itself
    assert events[renamed + 1 :] == [("fsync", str(tmp_path))]  # the rename, made durable
    assert json.loads((tmp_path / "capsule.json").read_text()) == {"status": "success"}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["capsule.json", "capture-health.json", "env.lock", "model-calls.jsonl"]
