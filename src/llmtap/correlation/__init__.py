"""Correlation: which rollout a model call belongs to, and with which sampling values.

    ids.py       the rollout-id pattern and check, the `/ng-rollout/` and `/ng-sampling/` prefixes
    run_body.py  reading one field of an agent's run request or row
    sampling.py  `/ng-sampling/<segment>` values: encode, decode, apply (`llmtap.sampling` is its public name)
    rollout.py   rollout ids from run bodies, prefixed paths and base URLs, the current-rollout context

Each layer imports only those above it in this list. The public names below load on first use,
so `import llmtap.correlation` (what an agent imports) costs nothing until a name is used, and
checking an id loads neither the store nor asyncio.
"""

from __future__ import annotations

from llmtap._lazy import lazy_exports

_EXPORTS = {
    "ATTEMPT_INDEX_KEY": "rollout",
    "CorrelatedPath": "rollout",
    "MAX_ROLLOUT_ID_LENGTH": "ids",
    "MODEL_SAMPLING_PREFIX": "ids",
    "ROLLOUT_ID_KEY": "rollout",
    "ROLLOUT_ID_PATTERN": "ids",
    "ROLLOUT_INDEX_KEY": "rollout",
    "ROLLOUT_PREFIX": "ids",
    "TASK_INDEX_KEY": "rollout",
    "base_url_for_run": "rollout",
    "current_rollout_id": "rollout",
    "resolve_model_base_url": "rollout",
    "rollout_context": "rollout",
    "rollout_id_from_run": "rollout",
    "rollout_id_from_run_body": "rollout",
    "rollout_path_prefix": "rollout",
    "run_body_value": "run_body",
    "split_correlation_path": "rollout",
    "split_rollout_prefix": "rollout",
    "split_token_capture_segment": "rollout",
    "TRAINING_TOKEN_CAPTURE_SEGMENT": "ids",
    "CAPTURED_ROLLOUT_ID_PATTERN": "ids",
    "validate_explicit_rollout_id": "ids",
    "rollout_file_stem": "ids",
    "rollout_id_from_file_stem": "ids",
    "url_path_for_request": "rollout",
    "url_path_for_run": "rollout",
    "validate_rollout_id": "ids",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports("llmtap.correlation", _EXPORTS, globals())
