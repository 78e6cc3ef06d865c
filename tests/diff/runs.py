"""Runs built from the recorded real exchanges: capture lines, capture directories, capsules and attached rows."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from llmtap.exchange import Exchange
from llmtap.records import raw_line_from_exchange
from llmtap.rollouts.attach import AttachOptions, attach_file
from llmtap.store import CaptureStore
from tests.fixtures import RecordedExchange, fixture

__all__ = [
    "AGENT_ROLLOUTS",
    "agent_run",
    "answer_with",
    "line_for",
    "write_capsule",
    "write_rows",
    "write_run",
]

WITH_PAYLOADS = AttachOptions(trajectory=False, include_payloads=True)

# Rollouts of real agent turns: a tool call, then the follow-up carrying the tool result.
AGENT_ROLLOUTS: dict[str, list[str]] = {
    "0-0": ["chat/tool-call-gpt4o", "chat/tool-result-followup-gpt4o"],
    "0-1": ["messages/tool-use-sonnet4", "messages/tool-result-followup-sonnet4"],
    "1-0": ["responses/function-call-gpt55", "responses/function-call-output-followup-gpt55"],
    "1-1": ["chat/text-basic-gpt4o"],
}


def line_for(
    recorded: RecordedExchange,
    *,
    rollout_id: str,
    request: dict[str, Any] | None = None,
    body: bytes | None = None,
    status: int | None = None,
    content_type: str | None = None,
    latency_ms: float | None = None,
) -> dict[str, Any]:
    """The persisted line for one recorded exchange, optionally with its request, response or latency replaced."""
    payload = recorded.body_bytes if body is None else body
    exchange = Exchange(
        method="POST",
        path=recorded.request_path,
        request_body=json.dumps(recorded.request_json if request is None else request).encode(),
        rollout_id=rollout_id,
    )
    exchange.status_code = recorded.status if status is None else status
    exchange.response_headers = {"content-type": content_type or recorded.content_type}
    step = max(1, len(payload) // 3)
    for start in range(0, len(payload), step):
        exchange.add_response_chunk(payload[start : start + step])
    exchange.finish()
    line = raw_line_from_exchange(exchange)
    if latency_ms is not None:
        line["latency_ms"] = latency_ms
    return line


def answer_with(recorded: RecordedExchange, text: str) -> bytes:
    """A non-streamed chat answer's body with its text replaced."""
    body = json.loads(recorded.body_text)
    body["choices"][0]["message"]["content"] = text
    return json.dumps(body).encode()


def agent_run(latency_ms: float = 100.0) -> dict[str, list[dict[str, Any]]]:
    """Every agent rollout as capture lines, each call taking `latency_ms`."""
    return {
        rollout_id: [line_for(fixture(name), rollout_id=rollout_id, latency_ms=latency_ms) for name in names]
        for rollout_id, names in AGENT_ROLLOUTS.items()
    }


def write_run(root: Path, rollouts: dict[str, list[dict[str, Any]]]) -> Path:
    """Write lines into a capture directory through the store, and return the directory."""
    store = CaptureStore(root)
    try:
        for rollout_id, lines in rollouts.items():
            for line in lines:
                store.append(rollout_id, copy.deepcopy(line))
    finally:
        store.close()
    return root


def write_capsule(root: Path, rollouts: dict[str, list[dict[str, Any]]]) -> Path:
    """A minimal run capsule: a manifest and the calls directory."""
    root.mkdir(parents=True)
    (root / "capsule.json").write_text(json.dumps({"run_id": root.name, "status": "success"}))
    write_run(root / "calls", rollouts)
    return root


def write_rows(
    path: Path,
    capture_dir: Path,
    rewards: dict[str, float],
    *,
    extra: dict[str, dict[str, Any]] | None = None,
    options: AttachOptions = WITH_PAYLOADS,
) -> Path:
    """Collect-style rows (one per rollout, with a reward) attached to a capture directory by the real `attach_file`.

    By default the attached calls keep their payloads; `AttachOptions()` attaches as `llmtap attach`
    does by default (payloads moved into the trajectory).
    """
    source = path.with_suffix(".in.jsonl")
    with source.open("w") as handle:
        for rollout_id, reward in rewards.items():
            row = {"_ng_rollout_id": rollout_id, "reward": reward, **(extra or {}).get(rollout_id, {})}
            handle.write(json.dumps(row) + "\n")
    attach_file(source, path, capture_dir, options=options)
    return path
