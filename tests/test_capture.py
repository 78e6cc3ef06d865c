"""`llmtap.capture()` and `llmtap.rollout()` with the real openai and anthropic SDKs over the replay upstream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest

import llmtap.capture as llmtap_capture
from llmtap.hooks.install import installed_hooks
from tests.fixtures import fixture

CHAT = fixture("chat/text-basic-gpt4o")
CHAT_STREAM = fixture("chat/text-stream-include-usage-gpt4")
RESPONSES_STREAM = fixture("responses/text-basic-stream-gpt55")
MESSAGES = fixture("messages/text-basic-sonnet4")
MESSAGES_STREAM = fixture("messages/tool-use-stream-sonnet4")


def _capsule(run: llmtap_capture.Capture) -> Path:
    assert run.capsule_dir is not None
    return run.capsule_dir


def _openai(upstream: Any, **options: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=upstream.base_url + "/v1", api_key="sk-test-not-recorded", max_retries=0, **options)


def _anthropic(upstream: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=upstream.base_url, api_key="sk-ant-test-not-recorded", max_retries=0)


def _openai_calls(upstream: Any) -> list[Any]:
    """The same calls, with and without capture: what the program sees."""
    with _openai(upstream) as client:
        plain = client.chat.completions.create(**CHAT.request_json).model_dump()
        chunks = [chunk.model_dump() for chunk in client.chat.completions.create(**CHAT_STREAM.request_json)]
        raw = client.chat.completions.with_raw_response.create(**CHAT.request_json)
        events = [event.type for event in client.responses.create(**RESPONSES_STREAM.request_json)]
        return [plain, chunks, raw.status_code, raw.parse().model_dump(), events]


def _anthropic_calls(upstream: Any) -> list[Any]:
    with _anthropic(upstream) as client:
        message = client.messages.create(**MESSAGES.request_json).model_dump()
        arguments = {key: value for key, value in MESSAGES_STREAM.request_json.items() if key != "stream"}
        with client.messages.stream(**arguments) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message().model_dump()
        return [message, text, final]


def test_openai_sync_stream_raw_and_responses_calls_are_each_recorded_once(replay_upstream: Any, tmp_path: Path) -> None:
    expected = _openai_calls(replay_upstream)
    replay_upstream.reset()
    with llmtap_capture.capture(runs_dir=tmp_path) as run:
        seen = _openai_calls(replay_upstream)
    assert seen == expected
    assert replay_upstream.request_count == 4
    records = run.records()
    assert len(records) == 4
    assert [record.dialect for record in records] == ["chat", "chat", "chat", "responses"]
    assert [record.stream for record in records] == [False, True, False, True]
    assert all(record.response is not None and record.tokens_out is not None for record in records)
    assert all(record.error_category is None for record in records)
    calls_file = (_capsule(run) / "calls" / "default.capture.jsonl").read_text()
    assert "sk-test-not-recorded" not in calls_file


def test_anthropic_sync_and_messages_stream_are_recorded_with_usage(replay_upstream: Any, tmp_path: Path) -> None:
    expected = _anthropic_calls(replay_upstream)
    replay_upstream.reset()
    with llmtap_capture.capture(runs_dir=tmp_path) as run:
        seen = _anthropic_calls(replay_upstream)
    assert seen == expected
    records = run.records()
    assert [record.dialect for record in records] == ["messages", "messages"]
    assert records[1].stream and not records[1].stream_truncated
    assert all(record.tokens_in and record.tokens_out for record in records)
    model_calls = [json.loads(line) for line in (_capsule(run) / "model-calls.jsonl").read_text().splitlines()]
    assert [call["attributes"]["gen_ai.operation.name"] for call in model_calls] == ["chat", "chat"]
    assert model_calls[0]["attributes"]["gen_ai.system_instructions"] == [{"type": "text", "content": "You are a helpful assistant"}]


async def test_async_sdk_calls_inside_a_capture_block(replay_upstream: Any, tmp_path: Path) -> None:
    with llmtap_capture.capture(runs_dir=tmp_path) as run:
        oa = openai.AsyncOpenAI(base_url=replay_upstream.base_url + "/v1", api_key="x", max_retries=0)
        completion = await oa.chat.completions.create(**CHAT.request_json)
        stream = await oa.chat.completions.create(**CHAT_STREAM.request_json)
        streamed = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
        an = anthropic.AsyncAnthropic(base_url=replay_upstream.base_url, api_key="x", max_retries=0)
        message = await an.messages.create(**MESSAGES.request_json)
        await oa.close()
        await an.close()
    assert completion.choices[0].message.content and streamed and message.content
    records = run.records()
    assert [(record.dialect, record.stream) for record in records] == [("chat", False), ("chat", True), ("messages", False)]
    assert all(record.tokens_out for record in records)


def test_openai_over_a_legacy_httpx_client_is_recorded_once(replay_upstream: Any, tmp_path: Path) -> None:
    import httpx

    with llmtap_capture.capture(runs_dir=tmp_path) as run:
        with _openai(replay_upstream, http_client=httpx.Client()) as client:
            client.chat.completions.create(**CHAT.request_json)
    [record] = run.records()
    assert record.tokens_in == 20
    assert replay_upstream.request_count == 1


def test_the_manifest_records_status_counts_usage_and_semconv(replay_upstream: Any, tmp_path: Path) -> None:
    with llmtap_capture.capture(runs_dir=tmp_path) as run, _openai(replay_upstream) as client:
        client.chat.completions.create(**CHAT.request_json)
    manifest = json.loads((_capsule(run) / "capsule.json").read_text())
    assert manifest["status"] == "success" and manifest["capture_mode"] == "in-process"
    assert manifest["counts"]["model_calls"] == 1
    assert manifest["usage"]["input_tokens"] == 20 and manifest["usage"]["output_tokens"] == 2
    assert manifest["semconv"]["version"]
    for name in ("env.lock", "capture-health.json", "model-calls.jsonl", "url_registry.json"):
        assert (_capsule(run) / name).is_file()


def test_an_exception_leaving_the_block_marks_the_run_failed_with_its_type_only(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        with llmtap_capture.capture(runs_dir=tmp_path) as run:
            raise ValueError("prompt text that must not be stored")
    manifest = json.loads((_capsule(run) / "capsule.json").read_text())
    assert manifest["status"] == "failure"
    assert manifest["error"] == {"type": "ValueError"}
    assert "prompt text" not in (_capsule(run) / "capsule.json").read_text()


def test_the_decorator_gives_each_call_its_own_capsule(replay_upstream: Any, tmp_path: Path) -> None:
    @llmtap_capture.capture(runs_dir=tmp_path)
    def ask() -> str:
        with _openai(replay_upstream) as client:
            return client.chat.completions.create(**CHAT.request_json).choices[0].message.content or ""

    assert ask() == ask()
    capsules = sorted(path for path in tmp_path.iterdir() if (path / "capsule.json").exists())
    assert len(capsules) == 2
    assert [json.loads((path / "capsule.json").read_text())["counts"]["model_calls"] for path in capsules] == [1, 1]


async def test_the_decorator_works_on_coroutine_functions(replay_upstream: Any, tmp_path: Path) -> None:
    @llmtap_capture.capture(runs_dir=tmp_path)
    async def ask() -> str:
        client = openai.AsyncOpenAI(base_url=replay_upstream.base_url + "/v1", api_key="x", max_retries=0)
        try:
            completion = await client.chat.completions.create(**CHAT.request_json)
        finally:
            await client.close()
        return completion.choices[0].message.content or ""

    assert await ask() == "Oi!"
    [capsule] = [path for path in tmp_path.iterdir() if (path / "capsule.json").exists()]
    assert json.loads((capsule / "capsule.json").read_text())["counts"]["model_calls"] == 1


def test_capture_dir_mode_writes_store_files_per_rollout_and_no_capsule(replay_upstream: Any, tmp_path: Path) -> None:
    with llmtap_capture.capture(capture_dir=tmp_path / "model-calls") as run:
        with llmtap_capture.rollout("0-1"), _openai(replay_upstream) as client:
            client.chat.completions.create(**CHAT.request_json)
    assert run.capsule_dir is None
    assert (tmp_path / "model-calls" / "0-1.capture.jsonl").is_file()
    assert [record.tokens_in for record in run.records("0-1")] == [20]


def test_nested_captures_keep_their_own_calls(replay_upstream: Any, tmp_path: Path) -> None:
    with _openai(replay_upstream) as client, llmtap_capture.capture(runs_dir=tmp_path / "outer") as outer:
        client.chat.completions.create(**CHAT.request_json)
        with llmtap_capture.capture(runs_dir=tmp_path / "inner") as inner:
            client.chat.completions.create(**CHAT.request_json)
            client.chat.completions.create(**CHAT.request_json)
        client.chat.completions.create(**CHAT.request_json)
    assert len(outer.records()) == 2
    assert len(inner.records()) == 2


def test_hooks_are_removed_when_the_last_capture_ends(replay_upstream: Any, tmp_path: Path) -> None:
    with llmtap_capture.capture(runs_dir=tmp_path), _openai(replay_upstream) as client:
        client.chat.completions.create(**CHAT.request_json)
        assert "httpx2" in installed_hooks()
    assert installed_hooks() == []
    assert not hasattr(httpx2.Client.send, "__llmtap_original__")


def test_llmtap_capture_is_callable_even_after_its_module_was_imported(replay_upstream: Any, tmp_path: Path) -> None:
    import llmtap

    with llmtap.capture(runs_dir=tmp_path) as run, _openai(replay_upstream) as client:  # type: ignore[operator]
        client.chat.completions.create(**CHAT.request_json)
    assert len(run.records()) == 1


def test_an_invalid_rollout_id_is_refused_at_once() -> None:
    from llmtap.errors import InvalidRolloutIdError

    with pytest.raises(InvalidRolloutIdError):
        llmtap_capture.rollout("../etc")
