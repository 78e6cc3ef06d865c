"""llmtap: record every model call an AI agent or RL rollout makes, as evidence you can trust.

The public names below are loaded on first use, so `import llmtap` stays cheap: the start-up
hooks of `llmtap run` import this package inside every Python process of a workload.

Usage::

    from llmtap import CaptureStore, read_model_call_records, aggregate_model_call_metrics

    store = CaptureStore("/abs/model-calls")
    calls = read_model_call_records(store, "0-0")
    totals = aggregate_model_call_metrics(store, "0-0")
"""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` is not imported at run time: this package loads in every captured process
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

# Public name -> module that defines it.
_EXPORTS: dict[str, str] = {
    "AgentObservations": "llmtap.rollouts.observations",
    "AppendResult": "llmtap.store",
    "AttachOptions": "llmtap.rollouts.attach",
    "Capture": "llmtap.capture",
    "CaptureMiddleware": "llmtap.server.middleware",
    "CaptureRecordError": "llmtap.errors",
    "CaptureStore": "llmtap.store",
    "CollectError": "llmtap.errors",
    "ConfigError": "llmtap.errors",
    "Exchange": "llmtap.exchange",
    "InvalidRolloutIdError": "llmtap.errors",
    "LlmtapError": "llmtap.errors",
    "MODEL_SAMPLING_HEADER": "llmtap.correlation.sampling",
    "MODEL_SAMPLING_NULL": "llmtap.correlation.sampling",
    "ModelCallRecord": "llmtap.records",
    "ModelCallSampling": "llmtap.correlation.sampling",
    "ModelCallSamplingConfig": "llmtap.correlation.sampling",
    "ObservationRecorder": "llmtap.rollouts.observations",
    "ROLLOUT_ID_PATTERN": "llmtap.correlation.ids",
    "ReadResult": "llmtap.store",
    "StoreError": "llmtap.errors",
    "TerminalAttribution": "llmtap.rollouts.terminal",
    "aggregate_model_call_metrics": "llmtap.store.readers",
    "attach_file": "llmtap.rollouts.attach",
    "attach_rollout": "llmtap.rollouts.attach",
    "base_url_for_run": "llmtap.correlation",
    "capture": "llmtap.capture",
    "collect_rollouts": "llmtap.rollouts.collect",
    "current_model_sampling_segment": "llmtap.correlation.sampling",
    "current_rollout_id": "llmtap.correlation",
    "decode_model_sampling": "llmtap.correlation.sampling",
    "encode_model_sampling": "llmtap.correlation.sampling",
    "join_model_call_observations": "llmtap.rollouts.observations",
    "model_call_sampling_config": "llmtap.correlation.sampling",
    "model_sampling_context": "llmtap.correlation.sampling",
    "model_sampling_from_run_body": "llmtap.correlation.sampling",
    "model_sampling_path_segment": "llmtap.correlation.sampling",
    "project_trajectory": "llmtap.rollouts.trajectory",
    "read_model_call_records": "llmtap.store.readers",
    "read_rollout_calls": "llmtap.store.readers",
    "resolve_model_base_url": "llmtap.correlation",
    "resolve_terminal": "llmtap.rollouts.terminal",
    "rollout": "llmtap.capture",
    "rollout_context": "llmtap.correlation",
    "rollout_id_from_run": "llmtap.correlation",
    "rollout_id_from_run_body": "llmtap.correlation",
    "url_path_for_request": "llmtap.correlation",
    "url_path_for_run": "llmtap.correlation",
    "validate_rollout_id": "llmtap.correlation.ids",
    "with_model_sampling_segment": "llmtap.correlation.sampling",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'llmtap' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module_name), name)
    if isinstance(value, type) or callable(value) and hasattr(value, "__code__"):
        # Reprs, tracebacks and docs show the public path (`llmtap.CaptureStore`), as httpx does.
        value.__module__ = "llmtap"
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .capture import Capture, capture, rollout
    from .correlation import (
        base_url_for_run,
        current_rollout_id,
        resolve_model_base_url,
        rollout_context,
        rollout_id_from_run,
        rollout_id_from_run_body,
        url_path_for_request,
        url_path_for_run,
    )
    from .correlation.ids import ROLLOUT_ID_PATTERN, validate_rollout_id
    from .correlation.sampling import (
        MODEL_SAMPLING_HEADER,
        MODEL_SAMPLING_NULL,
        ModelCallSampling,
        ModelCallSamplingConfig,
        current_model_sampling_segment,
        decode_model_sampling,
        encode_model_sampling,
        model_call_sampling_config,
        model_sampling_context,
        model_sampling_from_run_body,
        model_sampling_path_segment,
        with_model_sampling_segment,
    )
    from .errors import CaptureRecordError, CollectError, ConfigError, InvalidRolloutIdError, LlmtapError, StoreError
    from .exchange import Exchange
    from .records import ModelCallRecord
    from .rollouts.attach import AttachOptions, attach_file, attach_rollout
    from .rollouts.collect import collect_rollouts
    from .rollouts.observations import AgentObservations, ObservationRecorder, join_model_call_observations
    from .rollouts.terminal import TerminalAttribution, resolve_terminal
    from .rollouts.trajectory import project_trajectory
    from .server.middleware import CaptureMiddleware
    from .store import AppendResult, CaptureStore, ReadResult
    from .store.readers import aggregate_model_call_metrics, read_model_call_records, read_rollout_calls
