"""`llmtap run` over a program calling the real local model (Gemma 3 270M on llama.cpp)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_run_sdks import llmtap_run, only_capsule

pytestmark = pytest.mark.slow

WORKLOAD = '''
import json, os
import openai

with openai.OpenAI(base_url=os.environ["MODEL_BASE"] + "/v1", api_key="unused", max_retries=0) as client:
    ask = {"model": os.environ["MODEL_NAME"], "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8}
    whole = client.chat.completions.create(**ask)
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})
        if chunk.choices
    )
print(json.dumps({"whole": whole.choices[0].message.content, "usage": whole.usage.total_tokens, "streamed": streamed}))
'''


def test_calls_to_the_local_model_are_recorded_once_with_their_answers_and_usage(local_model: Any, tmp_path: Path) -> None:
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    env = dict(os.environ, MODEL_BASE=local_model.base_url, MODEL_NAME=local_model.model or "gemma")
    result = llmtap_run(["--", sys.executable, str(script)], env, tmp_path)
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    capsule = only_capsule(tmp_path)
    lines = [json.loads(line) for line in (capsule / "calls" / "default.capture.jsonl").read_text().splitlines()]
    assert [line.get("stream", False) for line in lines] == [False, True]
    assert lines[0]["response"]["choices"][0]["message"]["content"] == printed["whole"]
    assert lines[0]["response"]["usage"]["total_tokens"] == printed["usage"]
    assert lines[1]["response"]["choices"][0]["message"]["content"] == printed["streamed"]
    assert lines[1]["stream_truncated"] is False
    model_calls = [json.loads(line) for line in (capsule / "model-calls.jsonl").read_text().splitlines()]
    assert all(call["attributes"]["gen_ai.provider.name"] == "local" for call in model_calls)
    assert model_calls[0]["attributes"]["gen_ai.usage.output_tokens"] == lines[0]["response"]["usage"]["completion_tokens"]
    # llama.cpp sends no usage in a stream: unknown stays absent, never a made-up zero.
    assert "gen_ai.usage.output_tokens" not in model_calls[1]["attributes"]
