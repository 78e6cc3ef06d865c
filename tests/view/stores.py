"""Capture stores for the viewer's tests, built from the recorded real exchanges through the real
capture pipeline (`raw_line_from_exchange`) and the real `CaptureStore`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmtap import CaptureStore
from llmtap.exchange import Exchange
from llmtap.records import raw_line_from_exchange
from tests.fixtures import RecordedExchange, fixture

T0 = 1_786_000_000.0

# A prompt and a tool name a hostile workload could send: each would run script if shown unescaped.
XSS_TEXT = (
    '<script>window.__xss = 1; alert("xss")</script><img src=x onerror="window.__xss=2;alert(2)">'
    '<a href="javascript:window.__xss=3">click</a><svg onload="window.__xss=4"></svg>{{7*7}}'
)
XSS_TOOL = '<img src=x onerror="window.__xss=5">'


def capture_line(
    recorded: RecordedExchange,
    *,
    started_at: float,
    latency_ms: float,
    ttft_ms: float | None = None,
    request: Any = None,
    body: bytes | None = None,
    cancelled: bool = False,
    rollout_id: str | None = None,
) -> dict[str, Any]:
    """The persisted line of one recorded exchange, as if it had started at `started_at` (`body` replaces the answer)."""
    exchange = Exchange(
        method="POST",
        path=recorded.request_path,
        request_body=json.dumps(request if request is not None else recorded.request_json).encode(),
        status_code=recorded.status,
        response_headers={"content-type": recorded.content_type},
        rollout_id=rollout_id,
        model_ref={"type": "responses_api_models", "name": "policy"},
    )
    exchange.started_at = started_at
    exchange.started_mono = 0.0
    exchange.first_byte_mono = (ttft_ms if ttft_ms is not None else latency_ms * 0.3) / 1000.0
    exchange.response_chunks.append((exchange.first_byte_mono, recorded.body_bytes if body is None else body))
    exchange.completed_mono = latency_ms / 1000.0
    exchange.completed_at = started_at + latency_ms / 1000.0
    exchange.cancelled = cancelled
    return raw_line_from_exchange(exchange)


def xss_request() -> dict[str, Any]:
    base = fixture("chat/tool-call-gpt4o").request_json
    request: dict[str, Any] = json.loads(json.dumps(base))
    request["messages"] = [
        {"role": "system", "content": XSS_TEXT},
        {"role": "user", "content": XSS_TEXT},
    ]
    for tool in request.get("tools", []):
        tool["function"]["name"] = XSS_TOOL
        tool["function"]["description"] = XSS_TEXT
    return request


def build_store(root: Path) -> dict[str, list[str]]:
    """Write the test rollouts under `root`; return rollout id -> the outcome of each call in time order."""
    plan: dict[str, list[tuple[str, float, float, dict[str, Any]]]] = {
        # A chat tool loop: the model asks for a tool, the agent runs it for ~1.5 s, the model answers.
        "0-0": [("chat/tool-call-gpt4o", 0.0, 800.0, {}), ("chat/tool-result-followup-gpt4o", 2.3, 600.0, {})],
        # Anthropic streams: a tool_use stream, then the follow-up; the first token comes early.
        "1-0": [
            ("messages/tool-use-stream-sonnet4", 0.0, 1900.0, {"ttft_ms": 350.0}),
            ("messages/tool-result-followup-sonnet4", 2.5, 1200.0, {}),
        ],
        # Responses: a stream that works, then a refused key.
        "2-0": [
            ("responses/text-basic-stream-gpt55", 0.0, 1500.0, {"ttft_ms": 420.0}),
            ("responses/error-401-invalid-api-key", 1.8, 90.0, {}),
        ],
        # Truncated by max_tokens, then a call the client cancelled.
        "3-0": [
            ("messages/max-tokens-stream-opus3", 0.0, 1000.0, {"ttft_ms": 200.0}),
            ("chat/text-basic-gpt4o", 1.2, 700.0, {"cancelled": True}),
        ],
        "10-0": [("responses/reasoning-tokens-gpt5-mini", 0.0, 3000.0, {})],
    }
    outcomes: dict[str, list[str]] = {}
    store = CaptureStore(root)
    try:
        for rollout_id, calls in plan.items():
            base = T0 + 100 * len(outcomes)
            for name, offset, latency, extra in calls:
                line = capture_line(
                    fixture(name), started_at=base + offset, latency_ms=latency, rollout_id=rollout_id, **extra
                )
                store.append(rollout_id, line)
            outcomes[rollout_id] = []
        store.append(
            "xss-0",
            capture_line(fixture("chat/tool-call-gpt4o"), started_at=T0 + 900, latency_ms=500.0, request=xss_request()),
        )
    finally:
        store.close()
    # A rollout with a damaged line between two good ones: the second keeps call_index 2.
    good = capture_line(fixture("chat/text-basic-gpt4o"), started_at=T0 + 1000, latency_ms=300.0)
    (root / "4-0.capture.jsonl").write_bytes(
        json.dumps(good).encode() + b"\n{not json\n" + json.dumps({**good, "started_at": T0 + 1001}).encode() + b"\n"
    )
    outcomes.update({
        "0-0": ["ok", "ok"], "1-0": ["ok", "ok"], "2-0": ["ok", "error"], "3-0": ["truncated", "cancelled"],
        "10-0": ["ok"], "xss-0": ["ok"], "4-0": ["ok", "ok"],
    })  # fmt: skip
    return outcomes


def build_training_store(root: Path, rollouts_file: Path, *, rollouts: int = 36) -> None:
    """A store that looks like a small RL job: tool loops of 2 to 7 calls, rewards, and the usual
    failures (a refused key, output cut by max_tokens, a cancelled call), plus its rollouts file."""
    from llmtap import attach_rollout, read_model_call_records

    tool_call, answer = fixture("chat/tool-call-gpt4o"), fixture("chat/tool-result-followup-gpt4o")
    store = CaptureStore(root)
    try:
        for task in range(rollouts // 2):
            for repeat in range(2):
                rollout_id = f"{task}-{repeat}"
                number = task * 2 + repeat
                started = T0 + number * 40.0
                steps = 2 + (number * 7) % 6
                for step in range(steps):
                    last = step == steps - 1
                    recorded, extra = (answer if last else tool_call), {}
                    if last and number % 9 == 4:
                        recorded = fixture("messages/max-tokens-stream-opus3")
                    elif last and number % 11 == 6:
                        recorded = fixture("chat/error-401-invalid-api-key")
                    elif last and number % 13 == 8:
                        extra = {"cancelled": True}
                    latency = 500.0 + (number * 37 + step * 211) % 1400
                    line = capture_line(
                        recorded,
                        started_at=started,
                        latency_ms=latency,
                        ttft_ms=latency * 0.25,
                        rollout_id=rollout_id,
                        **extra,
                    )
                    store.append(rollout_id, line)
                    started += latency / 1000.0 + 0.3 + ((number + step) % 5) * 0.35  # the tool runs in between
        rows = []
        for task in range(rollouts // 2):
            for repeat in range(2):
                rollout_id = f"{task}-{repeat}"
                records = read_model_call_records(store, rollout_id)
                answered = records[-1].error_category is None and (task + repeat) % 3 != 2
                row = {
                    "_ng_task_index": task,
                    "_ng_rollout_index": repeat,
                    "_ng_rollout_id": rollout_id,
                    "response": records[-1].response if answered else {"id": "not-captured"},
                    "reward": 1.0 if answered and (task * 3 + repeat) % 4 else 0.0,
                }
                rows.append(attach_rollout(row, store))
        rollouts_file.write_bytes(b"".join(json.dumps(row).encode() + b"\n" for row in rows))
    finally:
        store.close()
