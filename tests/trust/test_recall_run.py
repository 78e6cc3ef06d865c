"""Recall through a real `llmtap run`: every corpus credential leaves every capsule file, every benign id stays.

The workload uses the openai SDK against a replay upstream serving recorded exchanges with the
corpus planted in them. For each credential (and each benign value) it makes two calls and prints
one log line: a plain call whose request carries the value in prompt text, in JSON-escaped tool
arguments (a quote and a newline around it), in a URL query and in an `.env` tool result, and
whose recorded answer carries it in the tool-call arguments it returns (JSON in a JSON string);
and a streamed call whose recorded answer spreads it over four text deltas. Finalisation redacts
the capsule, so no file of it (capture lines, model-calls.jsonl, stdout, the manifest, env.lock,
anything) holds the credential or any 8-character piece of it, decoded or not, while every benign
value is still there verbatim; and `validate` passes.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from llmtap.trust.validate import validate_path
from tests.fixtures import RecordedExchange, fixture
from tests.support.replay import ReplayUpstream
from tests.trust.corpus import BENIGN, SECRETS, embeddings
from tests.trust.streams import plant_split

TOOL_CALL = fixture("chat/tool-call-gpt4o")
STREAM = fixture("chat/text-stream-include-usage-gpt4")
CALL_ID = "call_kX9vTz3Yd2Qh8LmN1oPa4RsU"
MARKER = re.compile(r"\[REDACTED:[a-z0-9-]+\]")
NOT_CAPTURED = ("url_registry.json", "redaction-proof.json")

WORKLOAD = """
import json, os, sys
import openai
cases = json.loads(open(sys.argv[1]).read())
with openai.OpenAI(base_url=os.environ["REPLAY_BASE"] + "/v1", api_key="sk-test", max_retries=0) as client:
    for case in cases:
        print(case["log_line"], flush=True)
        answer = client.chat.completions.create(
            model="gpt-4o", messages=case["messages"], extra_headers={"x-replay-fixture": case["plain"]}
        )
        assert answer.choices[0].message.tool_calls
        stream = client.chat.completions.create(
            model="gpt-4", messages=[{"role": "user", "content": "repeat it"}], stream=True,
            stream_options={"include_usage": True}, extra_headers={"x-replay-fixture": case["stream"]},
        )
        "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
"""


def _messages(text: str) -> list[dict[str, Any]]:
    places = embeddings(text)
    return [
        {"role": "user", "content": places["prompt"]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": CALL_ID,
                    "type": "function",
                    "function": {"name": "deploy", "arguments": json.dumps({"note": f'use "{text}"\n', "n": 1})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": CALL_ID, "content": places["env_file"]},
        {"role": "user", "content": f"Fetch {places['url_query']} please"},
    ]


def _exchange(base: RecordedExchange, name: str, body: str) -> RecordedExchange:
    data = copy.deepcopy(base.data)
    data["response"]["body_text"] = body
    return RecordedExchange("chat", name, data)


def _tool_call_answer(text: str) -> str:
    answer = json.loads(TOOL_CALL.body_text)
    answer["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = json.dumps({"note": f'use "{text}"\n'})
    return json.dumps(answer, indent=2)


VALUES = [("secret", sample.in_context(), sample.secret) for sample in SECRETS] + [
    ("benign", value, value) for value in BENIGN
]


@pytest.fixture(scope="module")
def recall_capsule(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One real run over the whole corpus; its finished capsule."""
    work = tmp_path_factory.mktemp("recall-run")
    exchanges: list[RecordedExchange] = []
    cases = []
    for number, (_, text, _) in enumerate(VALUES):
        exchanges.append(_exchange(TOOL_CALL, f"plain-{number}", _tool_call_answer(text)))
        exchanges.append(_exchange(STREAM, f"stream-{number}", plant_split(STREAM, f"here: {text} done", pieces=4)))
        cases.append(
            {
                "messages": _messages(text),
                "log_line": embeddings(text)["log_line"],
                "plain": f"chat/plain-{number}",
                "stream": f"chat/stream-{number}",
            }
        )
    (work / "cases.json").write_text(json.dumps(cases))
    (work / "workload.py").write_text(WORKLOAD)
    with ReplayUpstream(exchanges, piece_delay=0.0).start() as upstream:
        env = dict(os.environ, REPLAY_BASE=upstream.base_url)
        command = [sys.executable, "-m", "llmtap.cli.run", "--capsule-dir", str(work / "runs"), "--",
                   sys.executable, "workload.py", str(work / "cases.json")]  # fmt: skip
        done = subprocess.run(command, env=env, cwd=work, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert upstream.request_count == 2 * len(VALUES)
    [capsule] = [path for path in (work / "runs").iterdir() if path.is_dir()]
    yield capsule


def _strings(value: Any, depth: int = 0) -> Iterator[str]:
    """Every string in a JSON value, and in JSON held by its strings (tool arguments), decoded."""
    if isinstance(value, str):
        yield value
        if depth < 4 and value[:1] in ("{", "["):
            try:
                yield from _strings(json.loads(value), depth + 1)
            except ValueError:
                pass
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item, depth)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item, depth)


@pytest.fixture(scope="module")
def capsule_texts(recall_capsule: Path) -> dict[str, list[str]]:
    """Each capsule file as raw text, plus every decoded JSON string in it (line by line for JSONL)."""
    texts: dict[str, list[str]] = {}
    for path in sorted(recall_capsule.rglob("*")):
        if not path.is_file():
            continue
        raw = path.read_bytes()
        found = [raw.decode("utf-8", "replace")]
        documents = raw.splitlines() if path.name.endswith(".jsonl") else [raw]
        for document in documents:
            try:
                found.extend(_strings(orjson.loads(document)))
            except orjson.JSONDecodeError:
                pass
        texts[str(path.relative_to(recall_capsule))] = found
    return texts


def _pieces(secret: str) -> list[str]:
    return [secret] + [secret[start : start + 8] for start in range(0, max(1, len(secret) - 8), 4)]


def test_the_run_recorded_every_call_and_validates(recall_capsule: Path) -> None:
    manifest = json.loads((recall_capsule / "capsule.json").read_bytes())
    assert manifest["status"] == "success" and manifest["counts"]["model_calls"] == 2 * len(VALUES)
    assert "capture_tampered" not in manifest
    assert validate_path(recall_capsule).problems == []


def test_every_credential_and_every_piece_of_it_left_every_capsule_file(
    recall_capsule: Path, capsule_texts: dict[str, list[str]]
) -> None:
    assert {"model-calls.jsonl", "outputs/stdout.txt", "capsule.json", "env.lock"} <= set(capsule_texts)
    assert any(name.startswith("calls/") for name in capsule_texts)
    left: list[tuple[str, str]] = []
    for kind, _, secret in VALUES:
        if kind != "secret":
            continue
        for name, texts in capsule_texts.items():
            # Markers name their rule ("aws-bedrock-..."), and the registry and proof hold no captured text:
            # there only the whole secret is looked for, elsewhere every piece of it too.
            pieces = [secret] if name in NOT_CAPTURED else _pieces(secret)
            if any(piece in MARKER.sub("", text) for piece in pieces for text in texts):
                left.append((name, secret[:6]))
    assert left == []


def test_the_proof_has_a_finding_of_every_rule_in_each_place(recall_capsule: Path) -> None:
    proof = json.loads((recall_capsule / "redaction-proof.json").read_bytes())
    by_rule: dict[str, set[str]] = {}
    for finding in proof["findings"]:
        by_rule.setdefault(finding["rule_id"], set()).add(finding["file"].split("/")[0])
    for sample in SECRETS:
        assert {"calls", "model-calls.jsonl", "outputs"} <= by_rule.get(sample.rule_id, set()), sample.rule_id
    serialized = (recall_capsule / "redaction-proof.json").read_text()
    assert not [sample.rule_id for sample in SECRETS if sample.secret[:16] in serialized]


def test_every_benign_value_is_still_there_verbatim(capsule_texts: dict[str, list[str]]) -> None:
    missing = []
    for kind, _, value in VALUES:
        if kind != "benign":
            continue
        for name in ("model-calls.jsonl", "outputs/stdout.txt"):
            if not any(value in text for text in capsule_texts[name]):
                missing.append((name, value[:24]))
        calls = [text for name, texts in capsule_texts.items() if name.startswith("calls/") for text in texts]
        if not any(value in text for text in calls):
            missing.append(("calls", value[:24]))
    assert missing == []
