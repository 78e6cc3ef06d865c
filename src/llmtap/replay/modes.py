"""The recorded calls of a recording as a report (`forensic` replay), and which of them an `exact` replay can check.

`forensic` executes nothing: it lists each recorded call (rollout, index, endpoint, model,
status, error, latency, the first characters of the answer) as a replay report.

`exact` re-runs (`exact`) are only meaningful where the recording makes the model deterministic:
temperature 0 or a seed on the call; `exact_eligibility` decides it per call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..dialects.projection import response_text
from .matching import MATCH_KEY_VERSION, RecordedCall, RecordingIndex

__all__ = ["exact_eligibility", "forensic_report"]

_EXCERPT = 80


def _row(call: RecordedCall) -> dict[str, Any]:
    record = call.record
    text = response_text(record.dialect, record.response)
    return {
        "rollout_id": call.rollout_id,
        "call_index": call.call_index,
        "endpoint": call.endpoint,
        "model": call.model,
        "status_code": record.status_code,
        "error_category": record.error_category,
        "finish_reason": record.finish_reason,
        "tokens_in": record.tokens_in,
        "tokens_out": record.tokens_out,
        "latency_ms": record.latency_total_ms,
        "tool_calls": [call.get("name") for call in record.tool_calls],
        "answer_excerpt": text[:_EXCERPT] if isinstance(text, str) else None,
        "reproduced": None,
    }


def forensic_report(source: str | Path) -> dict[str, Any]:
    """The recorded calls of a recording in order, as a replay report (nothing is executed)."""
    index = RecordingIndex.from_path(Path(source))
    calls = [_row(call) for call in index]
    return {
        "mode": "forensic",
        "replay_of": str(Path(source).resolve()),
        "match_key_version": MATCH_KEY_VERSION,
        "recorded_calls": len(calls),
        "unreadable_lines": index.unreadable_lines,
        "calls": calls,
        "ok": index.unreadable_lines == 0,
    }


def exact_eligibility(call: RecordedCall) -> str | None:
    """Why a recorded call cannot be re-run deterministically, or None when it can (temperature 0 or a seed)."""
    request = call.projection.get("request")
    if not isinstance(request, dict):
        return "its request is not a JSON object"
    if request.get("seed") is not None:
        return None
    temperature = request.get("temperature")
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature == 0:
        return None
    return "it has neither temperature 0 nor a seed"
