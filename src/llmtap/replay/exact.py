"""Exact replay: re-send each deterministic recorded request to the live endpoint and check the answer reproduced.

A recorded call is eligible only when its request makes the model deterministic: temperature 0
or a seed (`modes.exact_eligibility`). Each eligible request is sent as recorded (its body, with
its sampling values, and the provider's version headers) to the endpoint given on the command
line; the answer is read through its dialect like a captured call and compared with the
recorded one on what the agent would act on: the answer text, the tool calls (names and
arguments) and the finish reason. `reproduced` is True or False only for a call that was sent
and answered; a call not eligible, or whose request failed, keeps `reproduced: None` and says why.

The credential (`api_key_env`) goes only to the endpoint given by the caller, never to an
address read from the recording, which is untrusted input.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from ..dialects.projection import response_text
from ..errors import ConfigError
from .matching import RecordedCall, RecordingIndex, json_differences
from .modes import exact_eligibility, forensic_report

__all__ = ["exact_credentials", "exact_run", "outcome_of"]

_KEPT_HEADERS = ("anthropic-version", "anthropic-beta", "openai-beta")


def outcome_of(record: Any) -> dict[str, Any]:
    """What an exact replay compares for one call: answer text, tool calls (name, arguments), finish reason."""
    return {
        "text": response_text(record.dialect, record.response),
        "tool_calls": [{"name": call.get("name"), "arguments": call.get("arguments")} for call in record.tool_calls],
        "finish_reason": record.finish_reason,
    }


def _recorded_http(call: RecordedCall) -> dict[str, Any]:
    http = (call.line or {}).get("http")
    return http if isinstance(http, dict) else {}


def _headers(call: RecordedCall, api_key: str | None) -> dict[str, str]:
    found = _recorded_http(call).get("request_headers")
    recorded: dict[str, Any] = found if isinstance(found, dict) else {}
    headers = {"content-type": "application/json"}
    headers.update({name: str(recorded[name]) for name in _KEPT_HEADERS if isinstance(recorded.get(name), str)})
    if api_key is not None:
        if call.endpoint == "messages":
            headers["x-api-key"] = api_key
        else:
            headers["authorization"] = f"Bearer {api_key}"
    return headers


def _send(call: RecordedCall, endpoint: str, api_key: str | None, timeout: float) -> tuple[dict[str, Any], Any]:
    """Send the recorded request; return the answer as a captured call: its line and its `ModelCallRecord`."""
    import httpx

    from ..exchange import Exchange
    from ..records import ModelCallRecord, raw_line_from_exchange

    recorded_path = _recorded_http(call).get("path")
    path = recorded_path if isinstance(recorded_path, str) else "/v1/chat/completions"
    base = endpoint.rstrip("/")
    if base.endswith("/v1") and path.startswith("/v1/"):
        base = base[: -len("/v1")]
    body = orjson.dumps(call.record.request)
    exchange = Exchange(method="POST", path=path, request_body=body, rollout_id=call.rollout_id)
    with httpx.Client(timeout=timeout) as client, client.stream("POST", base + path, content=body, headers=_headers(call, api_key)) as response:
        exchange.status_code = response.status_code
        exchange.response_headers = {name.lower(): value for name, value in response.headers.items()}
        exchange.response_headers.pop("content-encoding", None)  # iter_bytes decodes
        for chunk in response.iter_bytes():
            exchange.add_response_chunk(chunk)
    exchange.extra = {"replayed_call": {"rollout_id": call.rollout_id, "call_index": call.call_index}}
    new_line = raw_line_from_exchange(exchange)
    return new_line, ModelCallRecord.from_raw_line(new_line, call.call_index)


def exact_credentials(endpoint: str | None, api_key_env: str | None) -> str | None:
    """The API key an exact replay sends to `endpoint` (None for none); ConfigError when the options disagree."""
    if api_key_env is not None and endpoint is None:
        raise ConfigError("An exact replay sends the API key only to an endpoint you name: pass --endpoint with --api-key-env.")
    api_key = os.environ.get(api_key_env) if api_key_env else None
    if api_key_env and api_key is None:
        raise ConfigError(f"The environment variable {api_key_env} is not set; set it to the endpoint's API key.")
    return api_key


def exact_run(
    source: str | Path,
    endpoint: str | None,
    *,
    api_key_env: str | None = None,
    timeout: float = 120.0,
    store: Any = None,
) -> dict[str, Any]:
    """The exact-replay report: per recorded call its eligibility and, where sent, whether the answer reproduced.

    With `store` (a CaptureStore), each answer the endpoint gave is appended to it as a captured
    call under the recorded call's rollout, its line naming the call it re-ran (`replayed_call`).
    """
    api_key = exact_credentials(endpoint, api_key_env)
    import httpx

    report = forensic_report(source)
    index = RecordingIndex.from_path(Path(source))
    for row, call in zip(report["calls"], index):
        reason = exact_eligibility(call)
        row["eligible"] = reason is None
        if reason is not None:
            row["not_checked"] = reason
            continue
        if endpoint is None:
            row["not_checked"] = "no --endpoint was given to re-run it against"
            continue
        try:
            fresh_line, fresh = _send(call, endpoint, api_key, timeout)
        except (httpx.HTTPError, OSError, ValueError) as exc:  # reported per call: the other calls are still checked
            row["not_checked"] = f"the request failed ({type(exc).__name__})"
            continue
        if store is not None:
            store.append(call.rollout_id, fresh_line)
        if fresh.status_code != call.record.status_code:
            row["reproduced"] = False
            row["differences"] = [{"pointer": "/status_code", "before": str(call.record.status_code), "after": str(fresh.status_code)}]
            continue
        differences, _ = json_differences(outcome_of(call.record), outcome_of(fresh))
        row["reproduced"] = not differences
        row["differences"] = [difference.to_dict() for difference in differences]
    checked = [row for row in report["calls"] if row["reproduced"] is not None]
    report.update(
        {
            "mode": "exact",
            "endpoint": endpoint,
            "eligible": all(row["eligible"] for row in report["calls"]),
            "checked": len(checked),
            "reproduced": sum(1 for row in checked if row["reproduced"]),
            "ok": bool(checked) and len(checked) == len(report["calls"]) and all(row["reproduced"] for row in checked),
        }
    )
    return report
