"""What every dialect exposes beyond normalizing: its provider, its error shape, one token-id rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmtap.dialects import DIALECTS, get_dialect
from llmtap.dialects.base import token_ids
from llmtap.rollouts.terminal_reading import _token_ids as terminal_token_ids
from llmtap.server.middleware import CaptureMiddleware
from llmtap.store import CaptureStore


def test_every_dialect_names_its_provider() -> None:
    assert {name: dialect.provider for name, dialect in DIALECTS.items()} == {
        "chat": "openai",
        "responses": "openai",
        "messages": "anthropic",
    }


@pytest.mark.parametrize("name", ["chat", "responses"])
def test_openai_dialects_answer_errors_in_openai_shape(name: str) -> None:
    body = orjson.loads(get_dialect(name).error_body("Bad segment.", "invalid_model_sampling", 400))
    assert body == {"error": {"message": "Bad segment.", "type": "invalid_request_error", "code": "invalid_model_sampling"}}
    assert orjson.loads(get_dialect(name).error_body("x", "c", 503))["error"]["type"] == "server_error"


@pytest.mark.parametrize(
    ("status", "kind"), [(400, "invalid_request_error"), (413, "request_too_large"), (404, "not_found_error"), (502, "api_error")]
)
def test_messages_answers_errors_in_anthropic_shape(status: int, kind: str) -> None:
    body = orjson.loads(get_dialect("messages").error_body("Bad segment.", "invalid_model_sampling", status))
    assert body == {"type": "error", "error": {"type": kind, "message": "Bad segment.", "code": "invalid_model_sampling"}}


def _refusing_app(tmp_path: Path) -> CaptureMiddleware:
    async def never_called(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("a refused request must not reach the upstream app")

    return CaptureMiddleware(never_called, store=CaptureStore(tmp_path / "store"))


async def test_the_anthropic_sdk_reads_llmtaps_own_messages_error(tmp_path: Path) -> None:
    transport = httpx2.ASGITransport(app=_refusing_app(tmp_path))  # this anthropic SDK is built on httpx2
    async with httpx2.AsyncClient(transport=transport) as http:
        client = anthropic.AsyncAnthropic(
            api_key="unused", base_url="http://testserver/ng-rollout/r1/ng-sampling/!!bad!!", http_client=http, max_retries=0
        )
        with pytest.raises(anthropic.BadRequestError) as raised:
            await client.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    body = raised.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == "invalid_model_sampling"


async def test_the_openai_sdk_reads_llmtaps_own_chat_error(tmp_path: Path) -> None:
    transport = httpx.ASGITransport(app=_refusing_app(tmp_path))
    async with httpx.AsyncClient(transport=transport) as http:
        client = openai.AsyncOpenAI(
            api_key="unused", base_url="http://testserver/ng-rollout/r1/ng-sampling/!!bad!!/v1", http_client=http, max_retries=0
        )
        with pytest.raises(openai.BadRequestError) as raised:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert raised.value.code == "invalid_model_sampling"
    assert raised.value.type == "invalid_request_error"


async def test_an_invalid_rollout_id_on_messages_is_answered_in_anthropic_shape(tmp_path: Path) -> None:
    transport = httpx.ASGITransport(app=_refusing_app(tmp_path))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        response = await http.post("/ng-rollout/a%20b/v1/messages", content=b"{}")
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error" and body["error"]["code"] == "invalid_rollout_id"


# --- one token-id rule: a list of non-negative ints, else unknown (None) -----------------------------

_ids = st.lists(st.integers(min_value=-5, max_value=2**40), max_size=6)


@given(_ids)
def test_every_reader_of_token_ids_applies_the_one_rule(ids: list[int]) -> None:
    expected = ids if all(i >= 0 for i in ids) else None
    assert token_ids(ids) == expected
    assert terminal_token_ids(ids) == (None if expected is None else tuple(expected))
    chat = get_dialect("chat").normalize({"prompt_token_ids": ids, "choices": [{"index": 0, "message": {}, "token_ids": ids}]})
    responses = get_dialect("responses").normalize({"prompt_token_ids": ids, "token_ids": ids})
    messages = get_dialect("messages").normalize({"prompt_token_ids": ids, "token_ids": ids})
    for normalized in (chat, responses, messages):
        assert (normalized.prompt_token_ids, normalized.completion_token_ids) == (expected, expected)


@pytest.mark.parametrize("value", [[True, 1], [1.0], ["1"], [-1], None, "12", {"0": 1}])
def test_what_is_not_a_list_of_token_ids_is_unknown(value: Any) -> None:
    assert token_ids(value) is None
