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


# The exact public API: adding or removing a name is a decision, made here as well as in _EXPORTS.
PUBLIC_API = [
    "AgentObservations", "AppendResult", "AttachOptions", "Capture", "CaptureMiddleware", "CaptureRecordError",
    "CaptureStore", "CollectError", "ConfigError", "Exchange", "InvalidRolloutIdError", "LlmtapError",
    "MODEL_SAMPLING_HEADER", "MODEL_SAMPLING_NULL", "ModelCallRecord", "ModelCallSampling", "ModelCallSamplingConfig",
    "ObservationRecorder", "ROLLOUT_ID_PATTERN", "ReadResult", "StoreError", "TerminalAttribution", "__version__",
    "aggregate_model_call_metrics", "attach_file", "attach_rollout", "base_url_for_run", "capture", "collect_rollouts",
    "current_model_sampling_segment", "current_rollout_id", "decode_model_sampling", "encode_model_sampling",
    "join_model_call_observations", "model_call_sampling_config", "model_sampling_context",
    "model_sampling_from_run_body", "model_sampling_path_segment", "project_trajectory", "read_model_call_records",
    "read_rollout_calls", "resolve_model_base_url", "resolve_terminal", "rollout", "rollout_context",
    "rollout_id_from_run", "rollout_id_from_run_body", "url_path_for_request", "url_path_for_run",
    "validate_rollout_id", "with_model_sampling_segment",
]


def test_the_public_api_is_exactly_this_list() -> None:
    assert llmtap.__all__ == PUBLIC_API
    assert dir(llmtap) == PUBLIC_API


def test_every_public_name_imports_from_llmtap() -> None:
    namespace: dict[str, object] = {}
    exec(f"from llmtap import {', '.join(PUBLIC_API)}", namespace)
    assert set(PUBLIC_API) <= set(namespace)


_PUBLIC_MODULES = """
import inspect, llmtap
shown = {}
for name in llmtap.__all__:
    value = getattr(llmtap, name)
    if inspect.isclass(value) or inspect.isfunction(value):
        shown[name] = value.__module__
print(sorted(set(shown.values())), len(shown))
print(repr(llmtap.CaptureStore), llmtap.ConfigError("x").__class__.__module__)
"""


def test_public_classes_and_functions_show_the_llmtap_path() -> None:
    """Reprs and tracebacks name `llmtap.CaptureStore`, not the private module that defines it."""
    done = subprocess.run([sys.executable, "-c", _PUBLIC_MODULES], capture_output=True, text=True, timeout=60, check=True)
    modules, rest = done.stdout.splitlines()
    assert modules.startswith("['llmtap'] ")
    assert int(modules.split()[-1]) >= 40
    assert rest == "<class 'llmtap.CaptureStore'> llmtap"


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
import llmtap, llmtap.cli, llmtap.demo.run, llmtap.server.run, llmtap.server.proxy, llmtap.capture, llmtap.records
from llmtap.hooks.install import acquire_hooks
print("ok")
"""


def test_llmtap_and_its_server_import_without_the_test_extras() -> None:
    """aiohttp, brotli and the SDKs are test-only dependencies: llmtap itself must not need them."""
    done = subprocess.run([sys.executable, "-c", _WITHOUT_TEST_EXTRAS], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
