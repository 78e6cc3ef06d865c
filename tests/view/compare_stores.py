"""Two runs to compare, built from the recorded real exchanges: run B inserts, removes and edits calls of run A."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from llmtap import CaptureStore
from tests.fixtures import fixture
from tests.view.stores import T0, XSS_TEXT, XSS_TOOL, capture_line

BASIC = fixture("chat/text-basic-gpt4o")
TOOL_CALL = fixture("chat/tool-call-gpt4o")

# The statuses of rollout "1-0"'s pairs, in order, as `llmtap diff` aligns them.
EDITED_ROLLOUT = "1-0"
EDITED_STATUSES = ["unchanged", "changed", "added", "unchanged", "removed", "unchanged"]


def question(
    uid: int, *, answer: str | None = None, started: float, latency: float = 100.0, **changes: Any
) -> dict[str, Any]:
    """A real chat call asking question `uid`, answered with `answer` (default: a reply naming it)."""
    request = copy.deepcopy(BASIC.request_json)
    request["messages"][-1]["content"] = f"Question number {uid}: say hi in Portuguese"
    request.update(changes)
    body = json.loads(BASIC.body_text)
    body["choices"][0]["message"]["content"] = answer if answer is not None else f"Oi {uid}!\nTudo bem."
    return capture_line(BASIC, started_at=started, latency_ms=latency, request=request, body=json.dumps(body).encode())


def xss_tool_call(*, started: float, crafted: bool) -> dict[str, Any]:
    """A real tool call; `crafted` puts hostile markup in the prompt, the tool name and its arguments."""
    request = copy.deepcopy(TOOL_CALL.request_json)
    body = json.loads(TOOL_CALL.body_text)
    if crafted:
        request["messages"][-1]["content"] = XSS_TEXT
        call = body["choices"][0]["message"]["tool_calls"][0]["function"]
        call["name"] = XSS_TOOL
        call["arguments"] = json.dumps({"location": XSS_TEXT})
    return capture_line(
        TOOL_CALL, started_at=started, latency_ms=300.0, request=request, body=json.dumps(body).encode()
    )


def _write(root: Path, rollouts: dict[str, list[dict[str, Any]]]) -> Path:
    store = CaptureStore(root)
    try:
        for rollout_id, lines in rollouts.items():
            for line in lines:
                store.append(rollout_id, line)
    finally:
        store.close()
    return root


def build_compare_runs(root_a: Path, root_b: Path) -> tuple[Path, Path]:
    """Write runs A and B as capture directories; B edits call 1, inserts one after it and removes call 3 of "1-0"."""
    a: dict[str, list[dict[str, Any]]] = {}
    b: dict[str, list[dict[str, Any]]] = {}
    a["0-0"] = [capture_line(fixture("chat/tool-call-gpt4o"), started_at=T0, latency_ms=800.0)]
    b["0-0"] = copy.deepcopy(a["0-0"])
    t = T0 + 100
    a[EDITED_ROLLOUT] = [question(uid, started=t + uid) for uid in range(5)]
    b[EDITED_ROLLOUT] = [
        question(0, started=t),
        question(1, started=t + 1, answer="Olá 1!\nTudo ótimo.", temperature=0.2, latency=180.0),  # edited
        question(77, started=t + 1.5),  # inserted
        question(2, started=t + 2),
        question(4, started=t + 4),  # question 3 removed
    ]
    a["xss-0"] = [xss_tool_call(started=T0 + 200, crafted=False)]
    b["xss-0"] = [xss_tool_call(started=T0 + 200, crafted=True)]
    a["4-0"] = [question(40, started=T0 + 300)]  # a rollout run B no longer has
    b["5-0"] = [question(50, started=T0 + 400)]  # a rollout new in run B
    return _write(root_a, a), _write(root_b, b)


def build_long_rollout(root_a: Path, root_b: Path, *, calls: int, changed: set[int]) -> None:
    """One rollout "long-0" of `calls` calls; B answers the calls numbered in `changed` differently."""
    a = [question(uid, started=T0 + uid) for uid in range(calls)]
    b = [question(uid, started=T0 + uid, answer=f"Olá {uid}!" if uid in changed else None) for uid in range(calls)]
    _write(root_a, {"long-0": a})
    _write(root_b, {"long-0": b})
