"""The registry `llmtap run` hands to its workload: checked once, then reused only for the very same file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

from llmtap.capsule.run_registry import registry_for_run, registry_source
from llmtap.errors import ConfigError
from llmtap.hooks.registry import load_registry, vendored_registry_path

REGISTRY = {
    "schema_version": 1,
    "providers": [{"provider": "local", "hosts": ["127.0.0.1:8000"], "endpoints": [{"path": "/v1/chat/completions", "operation": "chat"}]}],
}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("LLMTAP_CACHE_DIR", str(directory))
    monkeypatch.delenv("LLMTAP_URL_REGISTRY", raising=False)
    return directory


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("run-registry-*.bin"))


def test_the_hand_off_is_the_registry_as_the_hooks_load_it(cache: Path) -> None:
    handoff = json.loads(registry_for_run())
    expected = load_registry(vendored_registry_path())
    assert handoff == {"source": expected.source, "registry": expected.data}
    assert registry_source(registry_for_run()) == expected.source


def test_a_second_run_reuses_the_checked_registry_byte_for_byte(cache: Path) -> None:
    first = registry_for_run()
    assert len(_entries(cache)) == 1
    assert registry_for_run() == first


def test_a_second_run_does_not_load_the_registry_code(cache: Path, tmp_path: Path) -> None:
    registry_for_run()
    code = (
        "import sys; from llmtap.capsule.run_registry import registry_for_run; registry_for_run(); "
        "print(sorted(m for m in ('llmtap.hooks.registry', 'yaml', 'typing', 'pathlib', 'json') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=dict(os.environ))
    assert out.stdout.strip() == "[]"


def test_an_override_that_changes_is_checked_again(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    override = tmp_path / "registry.yaml"
    override.write_text(yaml.safe_dump(REGISTRY))
    monkeypatch.setenv("LLMTAP_URL_REGISTRY", str(override))
    assert json.loads(registry_for_run())["source"] == str(override)
    override.write_text(yaml.safe_dump({"schema_version": 1, "providers": [{"provider": "x"}]}))
    with pytest.raises(ConfigError, match="needs 'hosts'"):
        registry_for_run()


def test_a_malformed_registry_raises_and_is_never_remembered(cache: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("providers: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        registry_for_run(broken)
    assert _entries(cache) == []


def test_an_explicit_registry_path_wins_and_a_missing_one_is_a_config_error(cache: Path, tmp_path: Path) -> None:
    chosen = tmp_path / "chosen.yaml"
    chosen.write_text(yaml.safe_dump(REGISTRY))
    assert json.loads(registry_for_run(chosen))["registry"] == REGISTRY
    with pytest.raises(ConfigError, match="Cannot read the URL registry"):
        registry_for_run(tmp_path / "missing.yaml")


def test_a_damaged_or_foreign_entry_is_not_trusted(cache: Path, tmp_path: Path) -> None:
    chosen = tmp_path / "chosen.yaml"
    chosen.write_text(yaml.safe_dump(REGISTRY))
    expected = registry_for_run(chosen)
    [entry] = _entries(cache)
    entry.write_bytes(entry.read_bytes()[:40])
    assert registry_for_run(chosen) == expected
    entry.write_bytes(b"llmtap-run-registry 1 something else entirely")
    assert registry_for_run(chosen) == expected


def test_without_a_usable_cache_directory_every_run_checks_the_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("LLMTAP_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.delenv("LLMTAP_URL_REGISTRY", raising=False)
    expected = load_registry(vendored_registry_path())
    first = registry_for_run()
    assert json.loads(first) == {"source": expected.source, "registry": expected.data}
    assert registry_for_run() == first
    assert blocker.is_file() and blocker.read_text() == ""  # nothing was written in its place
    chosen = tmp_path / "chosen.yaml"
    chosen.write_text(yaml.safe_dump(REGISTRY))
    assert json.loads(registry_for_run(chosen))["registry"] == REGISTRY
    chosen.write_text("providers: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        registry_for_run(chosen)


def test_entries_for_many_registry_files_do_not_pile_up(cache: Path, tmp_path: Path) -> None:
    from llmtap.capsule import run_registry

    for index in range(run_registry._KEPT_ENTRIES + 5):
        chosen = tmp_path / f"registry-{index}.yaml"
        chosen.write_text(yaml.safe_dump(REGISTRY))
        registry_for_run(chosen)
    assert len(_entries(cache)) == run_registry._KEPT_ENTRIES
