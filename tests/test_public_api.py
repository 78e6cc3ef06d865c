"""The package's public face: every exported name resolves, and the spec's names are all there."""

from __future__ import annotations

import subprocess
import sys

import llmtap

SPEC_NAMES = {
    "CaptureStore", "read_model_call_records", "aggregate_model_call_metrics", "ModelCallRecord",
    "ModelCallSampling", "ModelCallSamplingConfig", "encode_model_sampling", "decode_model_sampling",
    "url_path_for_run", "url_path_for_request", "base_url_for_run", "rollout_id_from_run",
    "resolve_model_base_url", "rollout_context", "with_model_sampling_segment", "model_sampling_path_segment",
    "model_sampling_context", "current_model_sampling_segment", "model_sampling_from_run_body",
    "MODEL_SAMPLING_HEADER", "MODEL_SAMPLING_NULL", "resolve_terminal", "TerminalAttribution",
}


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert llmtap.__all__ == sorted(llmtap.__all__)
    for name in llmtap.__all__:
        assert getattr(llmtap, name) is not None


def test_spec_names_are_importable_from_llmtap() -> None:
    assert SPEC_NAMES <= set(llmtap.__all__)
    namespace: dict[str, object] = {}
    exec(f"from llmtap import {', '.join(sorted(SPEC_NAMES))}", namespace)


def test_unknown_names_raise_attribute_error() -> None:
    try:
        llmtap.no_such_name  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_importing_the_package_loads_no_heavy_dependency() -> None:
    heavy = "('pydantic', 'starlette', 'httpx', 'orjson', 'rich', 'click', 'typing', 'pathlib')"
    code = f"import sys, llmtap; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


_WITHOUT_TEST_EXTRAS = """
import importlib.abc, sys

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {"aiohttp", "brotli", "zstandard", "openai", "anthropic", "pytest", "hypothesis"}:
            raise ImportError(f"{name} is only in the test extra")
        return None

sys.meta_path.insert(0, Absent())
import llmtap, llmtap.cli, llmtap.demo, llmtap.server.run, llmtap.server.proxy, llmtap.capture, llmtap.records
from llmtap.hooks.install import acquire_hooks
print("ok")
"""


def test_llmtap_and_its_server_import_without_the_test_extras() -> None:
    """aiohttp, brotli and the SDKs are test-only dependencies: llmtap itself must not need them."""
    done = subprocess.run([sys.executable, "-c", _WITHOUT_TEST_EXTRAS], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
