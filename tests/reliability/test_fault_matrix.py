"""The fault matrix: every upstream and client failure, every dialect, streamed and not, through a
real `llmtap serve` process.

tests/e2e/test_serve_faults.py pins each fault once (chat, in-process serve, one client). This
runs the whole matrix against the serve process and asserts, for every cell, the three things
the reliability principle promises:

- zero lost records: a call whose client got a complete response has its record on disk the
  moment the response ended (read at once, no polling); every other call has one soon after;
- zero altered bytes: what the client got equals what the upstream sends for the same request
  (a prefix of it when the call broke), and the record keeps the bytes the upstream sent;
- a category for every failure, on both sides: what the client met (`complete`, `reset`,
  `stall`, `disconnect`) and the record's `error_category`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from llmtap.records import ModelCallRecord
from llmtap.store import CaptureStore
from llmtap.store.readers import read_rollout_calls
from tests.support.faults import FAULT_HEADER, FaultUpstream, refused_port
from tests.support.serve_process import ServeProcess

CALLS: dict[str, tuple[str, dict[str, object]]] = {
    "chat": ("/v1/chat/completions", {"model": "gpt-4", "messages": [{"role": "user", "content": "Say this is a test"}]}),
    "responses": ("/v1/responses", {"model": "gpt-5.5", "input": "Say this is a test"}),
    "messages": (
        "/v1/messages",
        {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "Say this is a test"}]},
    ),
}
STALL_TIMEOUT = 0.5
# anthropic 2.x streams over httpx2, whose errors are not httpx's.
_TRANSPORT_ERRORS: tuple[type[Exception], ...] = (httpx.TransportError,)
try:
    import httpx2

    _TRANSPORT_ERRORS += (httpx2.TransportError,)
except ImportError:
    pass


@dataclass(frozen=True)
class Cell:
    """One fault and what it must lead to: the client's outcome, the HTTP status, the record's category."""

    fault: str  # a fault of tests/support/faults.py, or `refused` / `disconnect`
    client: str  # complete | reset | stall | disconnect
    status: int | None
    category: str | None
    streams_only: bool = False

    @property
    def upstream_fault(self) -> str:
        return {"disconnect": "stall-between-0.3", "refused": "ok"}.get(self.fault, self.fault)


MATRIX = [
    Cell("ok", "complete", 200, None),
    Cell("status-500", "complete", 500, "upstream_error"),
    Cell("status-503", "complete", 503, "upstream_error"),
    Cell("status-429", "complete", 429, "rate_limit"),
    Cell("refused", "complete", 502, "connection"),
    Cell("reset-after-2", "reset", 200, "connection"),
    Cell("close-after-2", "reset", 200, "connection"),
    Cell("no-terminal", "complete", 200, "stream_truncated", streams_only=True),
    Cell("stall-first-2", "stall", None, "cancelled"),
    Cell("disconnect", "disconnect", 200, "cancelled", streams_only=True),
]
CELLS = [
    pytest.param(cell, dialect, stream, id=f"{cell.fault}-{dialect}-{'stream' if stream else 'json'}",
                 marks=[pytest.mark.slow] if cell.client == "stall" else [])
    for cell in MATRIX
    for dialect in CALLS
    for stream in (True, False)
    if stream or not cell.streams_only
]


@dataclass
class Observed:
    """What a client saw of one call."""

    outcome: str
    status: int | None
    body: bytes


@pytest.fixture(scope="module")
def capture_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fault-matrix-capture")


@pytest.fixture(scope="module")
def serves(_fault_server: FaultUpstream, capture_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServeProcess]]:
    """Two serve processes on one capture dir: one before the fault upstream, one before a refused port."""
    logs = tmp_path_factory.mktemp("fault-matrix-logs")
    with ServeProcess(_fault_server.base_url, capture_dir, log=logs / "serve.log").start() as faulty, ServeProcess(
        f"http://127.0.0.1:{refused_port()}", capture_dir, log=logs / "refused.log"
    ).start() as refused:
        yield {"faulty": faulty, "refused": refused}


def rollout_for(cell: Cell, dialect: str, stream: bool, client: str) -> str:
    return f"{cell.fault}-{dialect}-{'s' if stream else 'j'}-{client}"


def call_raw(url: str, body: dict[str, object], fault: str, *, leave_after_first: bool = False) -> Observed:
    """POST with httpx and read the raw body as it comes, classifying how the call ended."""
    received = b""
    status = None
    try:
        timeout = httpx.Timeout(10.0, read=STALL_TIMEOUT if "stall-first" in fault else 10.0)
        with httpx.Client(trust_env=False, timeout=timeout) as http, http.stream(
            "POST", url, json=body, headers={FAULT_HEADER: fault}
        ) as response:
            status = response.status_code
            for piece in response.iter_raw():
                received += piece
                if leave_after_first:
                    return Observed("disconnect", status, received)
    except httpx.ReadTimeout:
        return Observed("stall", status, received)
    except (httpx.RemoteProtocolError, httpx.ReadError):
        return Observed("reset", status, received)
    return Observed("complete", status, received)


def wait_for_record(store: CaptureStore, rollout_id: str, timeout: float = 10.0) -> list[ModelCallRecord]:
    """Records of a call whose client left early: durability was promised to nobody, so poll."""
    deadline = time.monotonic() + timeout
    while True:
        records = read_rollout_calls(store, rollout_id, strict=True).records
        if records or time.monotonic() > deadline:
            return records
        time.sleep(0.02)


def record_of(store: CaptureStore, rollout_id: str, outcome: str) -> ModelCallRecord:
    if outcome == "complete":
        records = read_rollout_calls(store, rollout_id, strict=True).records  # durable before the last byte
    else:
        records = wait_for_record(store, rollout_id)
    assert len(records) == 1, f"{rollout_id}: {len(records)} records"
    return records[0]


@pytest.mark.parametrize(("cell", "dialect", "stream"), CELLS)
def test_every_fault_keeps_its_record_its_bytes_and_a_category(
    serves: dict[str, ServeProcess], fault_upstream: FaultUpstream, capture_dir: Path, cell: Cell, dialect: str, stream: bool
) -> None:
    path, body = CALLS[dialect]
    body = {**body, "stream": stream}
    serve = serves["refused" if cell.fault == "refused" else "faulty"]
    rollout_id = rollout_for(cell, dialect, stream, "httpx")
    direct = call_raw(fault_upstream.base_url + path, body, cell.upstream_fault)

    seen = call_raw(f"{serve.base_url}/ng-rollout/{rollout_id}{path}", body, cell.upstream_fault,
                    leave_after_first=cell.client == "disconnect")

    assert (seen.outcome, seen.status) == (cell.client, cell.status)
    record = record_of(CaptureStore(capture_dir, create=False), rollout_id, seen.outcome)
    assert record.error_category == cell.category
    if cell.fault == "refused":
        return
    if seen.outcome == "complete":
        assert seen.body == direct.body  # zero altered bytes
    else:
        assert direct.body.startswith(seen.body)
    stored = _stored_response(record)
    if stored is not None:  # a stream, or a body that is not a JSON object: kept as bytes
        assert stored.startswith(seen.body) and direct.body.startswith(stored)
    elif seen.outcome == "complete":
        assert record.response == json.loads(direct.body)  # a JSON body is kept parsed
    if record.stream and cell.category in ("connection", "cancelled", "stream_truncated"):
        assert record.stream_truncated


def _stored_response(record: ModelCallRecord) -> bytes | None:
    return record.response_raw.encode("utf-8") if record.response_raw is not None else None  # the recordings are UTF-8


# --- the same matrix through the real SDKs ----------------------------------------------------


def sdk_call(dialect: str, base_url: str, fault: str, stream: bool, leave_after_first: bool) -> str:
    """Make the call with the dialect's own SDK; return how it ended, as the SDK reported it."""
    timeout = STALL_TIMEOUT if "stall-first" in fault else 10.0
    headers = {FAULT_HEADER: fault}
    _, body = CALLS[dialect]
    try:
        if dialect == "messages":
            with anthropic.Anthropic(base_url=base_url, api_key="sk-test", max_retries=0, timeout=timeout,
                                     default_headers=headers) as claude:
                made = claude.messages.create(**body, stream=stream)  # type: ignore[call-overload]
                return _consume(made, stream, leave_after_first)
        with openai.OpenAI(base_url=base_url + "/v1", api_key="sk-test", max_retries=0, timeout=timeout,
                           default_headers=headers) as gpt:
            if dialect == "chat":
                return _consume(gpt.chat.completions.create(**body, stream=stream), stream, leave_after_first)  # type: ignore[call-overload]
            return _consume(gpt.responses.create(**body, stream=stream), stream, leave_after_first)  # type: ignore[call-overload]
    except (openai.APITimeoutError, anthropic.APITimeoutError):
        return "stall"
    except (openai.APIStatusError, anthropic.APIStatusError) as failed:
        return f"complete {failed.status_code}"
    except (openai.APIConnectionError, anthropic.APIConnectionError):
        return "reset"
    except _TRANSPORT_ERRORS:
        return "reset"  # the SDKs raise their transport's own error for a stream that breaks mid-way


def _consume(result: object, stream: bool, leave_after_first: bool) -> str:
    if not stream:
        return "complete 200"
    for _ in result:  # type: ignore[attr-defined]
        if leave_after_first:
            result.close()  # type: ignore[attr-defined]
            return "disconnect 200"
    return "complete 200"


SDK_CELLS = [
    pytest.param(cell, dialect, id=f"{cell.fault}-{dialect}", marks=[pytest.mark.slow] if cell.client == "stall" else [])
    for cell in MATRIX
    for dialect in CALLS
    if cell.fault != "no-terminal"  # an SDK stream without its end is fine to the SDK: covered above
]


@pytest.mark.parametrize(("cell", "dialect"), SDK_CELLS)
def test_the_sdks_see_each_fault_as_the_upstream_made_it_and_every_call_is_recorded(
    serves: dict[str, ServeProcess], fault_upstream: FaultUpstream, capture_dir: Path, cell: Cell, dialect: str
) -> None:
    serve = serves["refused" if cell.fault == "refused" else "faulty"]
    rollout_id = rollout_for(cell, dialect, True, "sdk")
    base = f"{serve.base_url}/ng-rollout/{rollout_id}"

    outcome = sdk_call(dialect, base, cell.upstream_fault, True, cell.client == "disconnect")

    expected = cell.client if cell.client in ("reset", "stall") else f"{cell.client} {cell.status}"
    assert outcome == expected
    record = record_of(CaptureStore(capture_dir, create=False), rollout_id, outcome.split()[0])
    assert record.error_category == cell.category
