"""Plant text into the deltas of real recorded streams, the way a model that echoes a key would stream it.

Test-only knowledge of where each dialect's streams carry text (chat `choices[0].delta.content`,
Responses `response.output_text.delta`, Messages `text_delta`), so the redaction under test
never gets it from here.
"""

from __future__ import annotations

import json
from typing import Any

from llmtap.exchange import Exchange
from llmtap.records import raw_line_from_exchange
from tests.fixtures import RecordedExchange

__all__ = ["capture_line", "plant_split"]


def _blocks(body: str) -> list[str]:
    return body.split("\n\n")


def _data_of(block: str) -> tuple[int, Any] | None:
    lines = block.split("\n")
    for index, line in enumerate(lines):
        if line.startswith("data:"):
            try:
                return index, json.loads(line[5:])
            except json.JSONDecodeError:
                return None
    return None


def _text_slot(dialect: str, data: Any) -> tuple[dict[str, Any], str] | None:
    """The dict and key that hold one text delta, or None."""
    if not isinstance(data, dict):
        return None
    if dialect == "chat":
        choices = data.get("choices") or []
        delta = choices[0].get("delta") if choices and isinstance(choices[0], dict) else None
        if isinstance(delta, dict) and isinstance(delta.get("content"), str) and delta["content"]:
            return delta, "content"
    elif dialect == "responses":
        if data.get("type") == "response.output_text.delta" and isinstance(data.get("delta"), str):
            return data, "delta"
    elif dialect == "messages":
        delta = data.get("delta")
        if data.get("type") == "content_block_delta" and isinstance(delta, dict) and delta.get("type") == "text_delta":
            return delta, "text"
    return None


def plant_split(recorded: RecordedExchange, text: str, pieces: int = 3) -> str:
    """Return the stream body with `text` spread over `pieces` consecutive text deltas (after the first).

    Where the stream also carries the whole text (Responses `.done` events and the final
    response), the whole text is updated too, as the real service would send it.
    """
    blocks = _blocks(recorded.body_text)
    slots = []
    for number, block in enumerate(blocks):
        found = _data_of(block)
        if found is None:
            continue
        slot = _text_slot(recorded.dialect, found[1])
        if slot is not None:
            slots.append((number, found[0], found[1], slot))
    if len(slots) < pieces + 1:
        raise ValueError(f"{recorded.id} has too few text deltas")
    old_full = "".join(slot[3][0][slot[3][1]] for slot in slots)
    size = -(-len(text) // pieces)
    parts = [text[i : i + size] for i in range(0, len(text), size)]
    for (number, line_index, data, (holder, key)), part in zip(slots[1 : 1 + len(parts)], parts):
        holder[key] = part
        lines = blocks[number].split("\n")
        lines[line_index] = "data: " + json.dumps(data, separators=(",", ":"), ensure_ascii=False)
        blocks[number] = "\n".join(lines)
    new_full = "".join(slot[3][0][slot[3][1]] for slot in slots)
    body = "\n\n".join(blocks)
    if recorded.dialect == "responses":
        body = body.replace(
            json.dumps(old_full, ensure_ascii=False)[1:-1], json.dumps(new_full, ensure_ascii=False)[1:-1]
        )
    return body


def capture_line(recorded: RecordedExchange, *, body: str | None = None, request: Any = None) -> dict[str, Any]:
    """The capture line llmtap writes for `recorded` (optionally with another body or request)."""
    exchange = Exchange(
        method="POST",
        path=recorded.request_path,
        request_body=json.dumps(recorded.request_json if request is None else request).encode(),
        rollout_id="r-1",
    )
    exchange.status_code = recorded.status
    exchange.response_headers = {"content-type": recorded.content_type}
    raw = (recorded.body_text if body is None else body).encode()
    step = max(1, len(raw) // 5)
    for start in range(0, len(raw), step):
        exchange.add_response_chunk(raw[start : start + step])
    exchange.finish()
    return raw_line_from_exchange(exchange)
