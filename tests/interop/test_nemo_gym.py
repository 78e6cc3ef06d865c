"""llmtap against the reference system's real code (NeMo Gym 0.7.0), each in its own interpreter.

Its agent helpers make model calls through `llmtap serve` (the training token-capture segment
included); its reader reads llmtap's store; llmtap's reader reads a directory its own capture
middleware and store wrote; and both sides derive rollout ids and URLs from the same run bodies.
The reference runs in the drivers of `drivers/`, in the venv `conftest.py` builds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from llmtap.correlation import base_url_for_run, rollout_id_from_run_body, url_path_for_run
from llmtap.records import aggregate_metrics
from llmtap.store import CaptureStore
from llmtap.store.readers import read_model_call_records
from tests.fixtures import RecordedExchange, fixture
from tests.interop.conftest import ReferenceDriver
from tests.support.replay import ReplayUpstream
from tests.support.serve_process import ServeProcess

pytestmark = pytest.mark.slow

BASE_URL = "http://127.0.0.1:9/"
LONG_ID = "r" * 205  # refused by llmtap before issue 17 (more than 200), filed by both now
RUN_BODIES: list[dict[str, Any]] = [
    {"_ng_task_index": 3, "_ng_rollout_index": 1},
    {"_ng_task_index": "01", "_ng_rollout_index": "0"},
    {"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_attempt_index": "2"},
    {"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_attempt_index": 0},
    {"_ng_task_index": 3},
    {},
    {"_ng_rollout_id": "job-7.task_3"},
    {"_ng_rollout_id": "job-7", "_ng_attempt_index": 1},
    {"_ng_rollout_id": None, "_ng_task_index": 4, "_ng_rollout_index": 2},
    {"_ng_rollout_id": LONG_ID},
    {"_ng_rollout_id": ".hidden"},
    {"_ng_rollout_id": "has space"},
    {"_ng_rollout_id": "has/slash"},
    {"_ng_rollout_id": ""},
    {"_ng_rollout_id": 7},
]
# Indices that are not integers: the reference builds an id from their text (`True-1`, `x-1`) or
# coerces them (` 2` is attempt 2); llmtap refuses them with a ValueError naming the field.
DIVERGENT_BODIES: list[dict[str, Any]] = [
    {"_ng_task_index": True, "_ng_rollout_index": 1},
    {"_ng_task_index": "x", "_ng_rollout_index": 1},
    {"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_attempt_index": " 2"},
]


class ReferenceShapedRunRequest(BaseModel):
    """The reference's run request, as its code declares it: the explicit id in a field under its alias,
    other keys dropped."""

    model_config = ConfigDict(populate_by_name=True)
    responses_create_params: dict[str, Any]
    capture_rollout_id: str | None = Field(default=None, alias="_ng_rollout_id", exclude=True)


def _outcome(function: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    try:
        return {"value": function(*args, **kwargs)}
    except ValueError:  # the reference raises ValueError; llmtap's InvalidRolloutIdError is one
        return {"error": "ValueError"}


def _model_outcome(body: dict[str, Any]) -> dict[str, Any]:
    from pydantic import ValidationError

    try:
        model = ReferenceShapedRunRequest.model_validate({**body, "responses_create_params": {"input": "hi"}})
    except ValidationError:
        return {"error": "ValidationError"}
    return _outcome(rollout_id_from_run_body, model)


def test_both_sides_derive_the_same_ids_and_urls_from_the_same_run_bodies(reference: ReferenceDriver) -> None:
    theirs = reference("ids_and_urls", {"bodies": RUN_BODIES, "base_url": BASE_URL, "path": "/v1/responses"})
    ours = [
        {
            "dict_id": _outcome(rollout_id_from_run_body, body),
            "model_id": _model_outcome(body),
            "url_path": _outcome(url_path_for_run, "/v1/responses", body),
            "token_url_path": _outcome(url_path_for_run, "/v1/responses", body, token_capture=True),
            "base_url": _outcome(base_url_for_run, BASE_URL, body),
            "token_base_url": _outcome(base_url_for_run, BASE_URL, body, token_capture=True),
        }
        for body in RUN_BODIES
    ]
    for body, mine, reference_result in zip(RUN_BODIES, ours, theirs):
        assert mine == reference_result, body
    assert theirs[1]["dict_id"] == {"value": "01-0"} and theirs[6]["model_id"] == {"value": "job-7.task_3"}


def test_where_the_reference_builds_ids_from_non_integer_indices_llmtap_refuses_them(reference: ReferenceDriver) -> None:
    theirs = reference("ids_and_urls", {"bodies": DIVERGENT_BODIES, "base_url": BASE_URL, "path": "/v1/responses"})
    assert [result["dict_id"] for result in theirs] == [{"value": "True-1"}, {"value": "x-1"}, {"value": "3-1-a2"}]
    for body in DIVERGENT_BODIES:
        with pytest.raises(ValueError, match="_ng_"):
            rollout_id_from_run_body(body)


# --- the reference agent's calls through `llmtap serve` ------------------------------------------

CHAT = fixture("chat/text-basic-gpt4o")
CHAT_STREAM = fixture("chat/text-stream-include-usage-gpt4")
RESPONSES = fixture("responses/function-call-gpt55")


@pytest.fixture
def served_capture(replay_upstream: ReplayUpstream, tmp_path: Path, reference: ReferenceDriver) -> dict[str, Any]:
    """The reference agent's calls made through a real `llmtap serve` in front of the replay upstream."""
    capture_dir = tmp_path / "calls"
    calls = [
        {"body": {"_ng_task_index": 0, "_ng_rollout_index": 0}, "token_capture": False, "via": "sdk", "fixture": CHAT},
        {"body": {"_ng_task_index": "01", "_ng_rollout_index": 0}, "token_capture": True, "via": "sdk", "fixture": CHAT},
        {"body": {"_ng_rollout_id": "job-7"}, "token_capture": True, "via": "url_path", "fixture": RESPONSES},
        {"body": {"_ng_rollout_id": LONG_ID}, "token_capture": False, "via": "url_path", "fixture": CHAT_STREAM},
    ]
    payload = [
        {key: value for key, value in call.items() if key != "fixture"}
        | {"path": call["fixture"].request_path, "request": call["fixture"].request_json}
        for call in calls
    ]
    with ServeProcess(replay_upstream.base_url, capture_dir, log=tmp_path / "serve.log").start() as serve:
        answers = reference("agent_calls", {"server_url": serve.base_url, "calls": payload})
    return {"dir": capture_dir, "calls": calls, "answers": answers, "upstream_paths": [r.path for r in replay_upstream.received]}


def test_the_reference_agents_calls_through_llmtap_serve_are_captured_under_its_ids(served_capture: dict[str, Any]) -> None:
    calls, answers = served_capture["calls"], served_capture["answers"]
    assert answers[1]["url"].endswith("/ng-rollout/01-0/training-token-capture/v1")
    assert answers[2]["url"].endswith("/ng-rollout/job-7/training-token-capture/v1/responses")
    for call, answer in zip(calls[:3], answers[:3]):
        assert answer["status"] == 200 and answer["body"] == json.loads(call["fixture"].body_text)
    assert answers[3]["status"] == 200 and answers[3]["body"] == CHAT_STREAM.body_text  # the stream, byte for byte
    # The upstream sees the dialect path alone: the prefix and the training segment are stripped.
    assert all(not path.startswith(("/ng-rollout", "/training-token-capture")) for path in served_capture["upstream_paths"])
    with CaptureStore(served_capture["dir"]) as store:
        assert store.rollouts() == sorted(["0-0", "01-0", "job-7", LONG_ID])
        lines = {rollout_id: [line for _, line in store.read(rollout_id).entries] for rollout_id in store.rollouts()}
    assert [len(found) for found in lines.values()] == [1, 1, 1, 1]
    assert "training_token_capture" not in lines["0-0"][0] and "training_token_capture" not in lines[LONG_ID][0]
    assert lines["01-0"][0]["training_token_capture"] is True and lines["job-7"][0]["training_token_capture"] is True
    assert lines[LONG_ID][0]["stream"] is True


# The fields both readers define the same way (the reference's ModelCallRecord, llmtap's record).
SHARED_FIELDS = (
    "model_call_id", "response_id", "call_index", "model_ref", "model", "dialect", "status_code", "response_status",
    "error_category", "started_at", "completed_at", "latency_total_ms", "latency_ttft_ms", "tokens_in", "tokens_out",
    "tokens_reasoning", "tokens_total", "cache_hit", "cached_tokens", "cache_creation_tokens", "reasoning_content",
    "request", "response", "request_raw", "response_raw",
)  # fmt: skip
SHARED_METRICS = ("tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cached_tokens", "num_calls")


def _shared(record: dict[str, Any]) -> dict[str, Any]:
    return {name: record[name] for name in SHARED_FIELDS}


def _tool_calls(records: list[dict[str, Any]]) -> list[list[tuple[Any, Any]]]:
    return [[(call["call_id"], call["name"]) for call in record["tool_calls"]] for record in records]


def test_the_reference_reader_on_llmtaps_store_reads_the_same_records_and_metrics(
    served_capture: dict[str, Any], reference: ReferenceDriver
) -> None:
    with CaptureStore(served_capture["dir"]) as store:
        rollout_ids = store.rollouts()
        ours = {rollout_id: read_model_call_records(store, rollout_id) for rollout_id in rollout_ids}
    theirs = reference("read_store", {"capture_dir": str(served_capture["dir"]), "rollout_ids": rollout_ids})
    assert len(rollout_ids) == 4
    for rollout_id in rollout_ids:
        mine = [record.to_dict() for record in ours[rollout_id]]
        assert len(mine) == len(theirs[rollout_id]["records"]) == 1
        assert [_shared(r) for r in mine] == [_shared(r) for r in theirs[rollout_id]["records"]], rollout_id
        assert _tool_calls(mine) == _tool_calls(theirs[rollout_id]["records"])
        metrics = aggregate_metrics(ours[rollout_id])
        for name in SHARED_METRICS:
            assert metrics[name] == theirs[rollout_id]["metrics"][name], (rollout_id, name)
        assert metrics["latency_total_ms"] == pytest.approx(theirs[rollout_id]["metrics"]["latency_total_ms"])


def test_the_continuation_fingerprint_llmtap_stores_is_the_one_the_reference_computes(
    served_capture: dict[str, Any], reference: ReferenceDriver
) -> None:
    """Every line `llmtap serve` wrote carries `continuation_fingerprint` with version 2, and the
    reference's own `assistant_fingerprint` of the same call's request items and output gives
    exactly those bytes: llmtap's captures are lineage rows the reference resolver can match."""
    from llmtap.dialects import get_dialect

    lines = []
    with CaptureStore(served_capture["dir"]) as store:
        for rollout_id in store.rollouts():
            lines.extend(line for _, line in store.read(rollout_id).entries)
    item_lists = []
    for line in lines:
        dialect = get_dialect(line["dialect"])
        item_lists.append([*dialect.fingerprint_request_items(line["request"]), *dialect.fingerprint_outputs(line["response"])[0]])
    theirs = reference("fingerprint_items", {"item_lists": item_lists})
    assert len(lines) == 4 and theirs["version"] == 2
    assert [line["fingerprint_version"] for line in lines] == [2] * 4
    assert [line["continuation_fingerprint"] for line in lines] == theirs["fingerprints"]
    assert all(len(found) == 64 for found in theirs["fingerprints"])


# --- llmtap's reader on a directory the reference's own middleware and store wrote ---------------


def _reference_call(rollout_id: str, recorded: RecordedExchange) -> dict[str, Any]:
    return {
        "path": f"/ng-rollout/{rollout_id}{recorded.request_path}",
        "request_body": json.dumps(recorded.request_json),
        "status": recorded.status,
        "content_type": recorded.content_type,
        "response_body": recorded.body_text,
    }


def test_llmtaps_reader_reads_what_the_reference_store_wrote_as_the_reference_does(
    tmp_path: Path, reference: ReferenceDriver
) -> None:
    capture_dir = tmp_path / "reference-calls"
    written = {"0-0": [CHAT, CHAT_STREAM], "job-7": [RESPONSES], LONG_ID: [CHAT]}
    calls = [_reference_call(rollout_id, recorded) for rollout_id, found in written.items() for recorded in found]
    received = reference("write_store", {"capture_dir": str(capture_dir), "model_server_name": "policy_model", "calls": calls})
    assert [answer["status"] for answer in received] == [200] * len(calls)
    theirs = reference("read_store", {"capture_dir": str(capture_dir), "rollout_ids": list(written)})
    with CaptureStore(capture_dir) as store:
        assert store.rollouts() == sorted(written)
        for rollout_id, recorded in written.items():
            mine = [record.to_dict() for record in read_model_call_records(store, rollout_id)]
            assert len(mine) == len(theirs[rollout_id]["records"]) == len(recorded)
            assert [_shared(r) for r in mine] == [_shared(r) for r in theirs[rollout_id]["records"]], rollout_id
            assert _tool_calls(mine) == _tool_calls(theirs[rollout_id]["records"])
            metrics = aggregate_metrics(read_model_call_records(store, rollout_id))
            for name in SHARED_METRICS:
                assert metrics[name] == theirs[rollout_id]["metrics"][name], (rollout_id, name)


def test_llmtap_attach_on_a_directory_the_reference_wrote_attaches_what_the_reference_attaches(
    tmp_path: Path, reference: ReferenceDriver
) -> None:
    capture_dir = tmp_path / "reference-calls"
    calls = [_reference_call("0-0", CHAT), _reference_call("0-0", RESPONSES), _reference_call("job-7", CHAT_STREAM)]
    reference("write_store", {"capture_dir": str(capture_dir), "model_server_name": "policy_model", "calls": calls})
    rows = [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0},
        {"_ng_rollout_id": "job-7", "_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 0.0},
        {"_ng_task_index": 9, "_ng_rollout_index": 9, "reward": 0.5},  # no capture at all
    ]
    theirs = reference("merge_rows", {"capture_dir": str(capture_dir), "rows": rows})
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    attached = subprocess.run(
        [sys.executable, "-m", "llmtap", "attach", str(rollouts), "--capture-dir", str(capture_dir), "--no-trajectory"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert attached.returncode == 0, attached.stderr
    ours = [json.loads(line) for line in rollouts.read_text().splitlines()]
    for mine, reference_row in zip(ours, theirs):
        mine_capture, their_capture = mine["ng_model_call_capture"], reference_row["ng_model_call_capture"]
        assert mine["reward"] == reference_row["reward"]
        assert mine_capture["rollout_id"] == their_capture["rollout_id"]
        for name in SHARED_METRICS:
            assert mine_capture["metrics"][name] == their_capture["metrics"][name], (mine_capture["rollout_id"], name)
        shared_without_payloads = [n for n in SHARED_FIELDS if n not in ("request", "response", "request_raw", "response_raw")]
        assert [{n: call[n] for n in shared_without_payloads} for call in mine_capture["calls"]] == [
            {n: call[n] for n in shared_without_payloads} for call in their_capture["calls"]
        ]
        assert [gap["code"] for gap in mine_capture.get("gaps", [])] == [gap["code"] for gap in their_capture.get("gaps", [])]
    assert [len(row["ng_model_call_capture"]["calls"]) for row in ours] == [2, 1, 0]
