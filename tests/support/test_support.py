"""The real parts other tests stand on: replay upstream, fault upstream, local model."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("uvicorn", reason="the support servers need the venv (httpx, starlette, uvicorn)")
pytest.importorskip("openai", reason="the support tests drive the real openai SDK from the venv")

import httpx  # noqa: E402
import openai  # noqa: E402
from openai.types.chat import ChatCompletionMessageParam  # noqa: E402

from llmtap.demo import localmodel  # noqa: E402
from llmtap.demo.localmodel import LocalModelError, LocalModelServer, MissingLocalModelError, ensure_model_file  # noqa: E402
from tests.fixtures import RecordedExchange, all_fixtures, fixture  # noqa: E402
from tests.support.faults import DEFAULT_FIXTURES, FaultUpstream, refused_port, sse_events  # noqa: E402
from tests.support.replay import FIXTURE_HEADER, ReplayUpstream, split_into_pieces  # noqa: E402
from tests.support.servers import wait_for_http  # noqa: E402

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say this is a test"}]


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    """One plain httpx client for the module (building one costs an SSL context)."""
    with httpx.Client(trust_env=False, timeout=10.0) as client:
        yield client


def _stream_raw(client: httpx.Client, url: str, **kwargs: Any) -> tuple[httpx.Response, list[bytes]]:
    with client.stream("POST", url, **kwargs) as response:
        return response, list(response.iter_raw())


@pytest.fixture
def make_openai() -> Iterator[Callable[[str], openai.OpenAI]]:
    """Makes real OpenAI clients without retries, and closes them (and their sockets) afterwards."""
    clients: list[openai.OpenAI] = []

    def make(base_url: str) -> openai.OpenAI:
        clients.append(openai.OpenAI(base_url=base_url + "/v1", api_key="test-key", max_retries=0))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


# --- replay upstream ---------------------------------------------------------------------------


@pytest.mark.parametrize("recorded", all_fixtures(), ids=lambda recorded: recorded.id)
def test_replay_serves_each_recording_byte_for_byte(
    replay_upstream: ReplayUpstream, http: httpx.Client, recorded: RecordedExchange
) -> None:
    response, pieces = _stream_raw(http, replay_upstream.base_url + recorded.request_path, json=recorded.request_json)

    assert response.status_code == recorded.status
    assert response.headers["content-type"] == recorded.content_type
    assert b"".join(pieces) == recorded.body_bytes
    assert [r.fixture_id for r in replay_upstream.received] == [recorded.id]


def test_replay_sends_a_stream_in_several_pieces(http: httpx.Client) -> None:
    recorded = fixture("chat/text-stream-no-usage-gpt4")
    with ReplayUpstream([recorded], piece_delay=0.05).start() as upstream:
        response, pieces = _stream_raw(http, upstream.base_url + recorded.request_path, json=recorded.request_json)

    assert response.headers.get("transfer-encoding") == "chunked"
    assert len(pieces) > 1
    assert b"".join(pieces) == recorded.body_bytes


def test_replay_cuts_streams_mid_line() -> None:
    upstream = ReplayUpstream()
    stream_pieces = [upstream.pieces_for(recorded) for recorded in all_fixtures() if recorded.is_stream]

    assert all(len(pieces) > 1 for pieces in stream_pieces)
    assert any(not piece.endswith(b"\n") for pieces in stream_pieces for piece in pieces[:-1])


@given(body=st.binary(max_size=300), seed=st.integers(), low=st.integers(1, 6), extra=st.integers(0, 6))
def test_split_into_pieces_joins_back_to_the_body(body: bytes, seed: int, low: int, extra: int) -> None:
    pieces = split_into_pieces(body, random.Random(seed), min_pieces=low, max_pieces=low + extra)

    assert b"".join(pieces) == body
    assert len(pieces) <= max(1, low + extra)
    assert len(pieces) >= min(low, max(1, len(body)))
    assert all(pieces) or body == b""


def test_replay_selects_by_header_before_body(replay_upstream: ReplayUpstream, http: httpx.Client) -> None:
    named = fixture("chat/refusal-gpt4o")
    other = fixture("chat/text-basic-gpt4o")

    response = http.post(
        replay_upstream.base_url + "/v1/chat/completions",
        json=other.request_json,
        headers={FIXTURE_HEADER: named.id},
    )

    assert response.content == named.body_bytes
    assert replay_upstream.count_for(named.id) == 1


def test_replay_accepts_a_prefixed_path(replay_upstream: ReplayUpstream, http: httpx.Client) -> None:
    recorded = fixture("messages/text-basic-sonnet4")

    response = http.post(replay_upstream.base_url + "/ng-rollout/r1/v1/messages", json=recorded.request_json)

    assert response.content == recorded.body_bytes


def test_replay_answers_the_real_openai_sdk_exactly_once(
    replay_upstream: ReplayUpstream, make_openai: Callable[[str], openai.OpenAI]
) -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    client = make_openai(replay_upstream.base_url)

    raw = client.chat.completions.with_raw_response.create(**recorded.request_json)
    completion = raw.parse()

    assert raw.http_response.content == recorded.body_bytes
    assert completion.choices[0].message.content == json.loads(recorded.body_text)["choices"][0]["message"]["content"]
    assert replay_upstream.request_count == 1


@pytest.mark.parametrize(
    ("path", "headers", "body", "named_in_message"),
    [
        ("/v1/chat/completions", {}, b'{"model": "nobody-recorded-this"}', "No recording"),
        ("/v1/chat/completions", {}, b"not json", "not JSON"),
        ("/v1/chat/completions", {FIXTURE_HEADER: "chat/does-not-exist"}, b"{}", "chat/does-not-exist"),
        ("/v1/messages", {FIXTURE_HEADER: "chat/text-basic-gpt4o"}, b"{}", "/v1/chat/completions"),
    ],
    ids=["unknown-body", "non-json-body", "unknown-fixture", "wrong-path"],
)
def test_replay_answers_404_naming_the_problem(
    replay_upstream: ReplayUpstream,
    http: httpx.Client,
    path: str,
    headers: dict[str, str],
    body: bytes,
    named_in_message: str,
) -> None:
    response = http.post(replay_upstream.base_url + path, content=body, headers=headers)

    assert response.status_code == 404
    assert named_in_message in response.json()["error"]["message"]


def test_replay_answers_404_when_two_recordings_match(http: httpx.Client) -> None:
    original = fixture("chat/text-basic-gpt4o")
    twins = [RecordedExchange("chat", name, original.data) for name in ("twin-a", "twin-b")]
    with ReplayUpstream(twins).start() as upstream:
        response = http.post(upstream.base_url + original.request_path, json=original.request_json)

    assert response.status_code == 404
    message = response.json()["error"]["message"]
    assert "chat/twin-a" in message and "chat/twin-b" in message


# --- fault upstream ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "error_class"),
    [("status-500", "InternalServerError"), ("status-429", "RateLimitError"), ("status-401", "AuthenticationError")],
)
def test_fault_status_reaches_the_openai_sdk_as_its_error(
    fault_upstream: FaultUpstream, make_openai: Callable[[str], openai.OpenAI], fault: str, error_class: str
) -> None:
    client = make_openai(fault_upstream.url(fault))

    with pytest.raises(getattr(openai, error_class)) as raised:
        client.chat.completions.create(model="gpt-4", messages=MESSAGES)

    assert raised.value.status_code == int(fault.split("-")[1])
    assert fault_upstream.request_count == 1


def test_fault_status_on_messages_has_anthropics_error_shape(fault_upstream: FaultUpstream, http: httpx.Client) -> None:
    response = http.post(fault_upstream.url("status-529") + "/v1/messages", json={})

    assert response.status_code == 529
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "overloaded_error"


def test_fault_reset_delivers_n_events_then_a_connection_reset(
    fault_upstream: FaultUpstream, http: httpx.Client
) -> None:
    events = sse_events(fixture(DEFAULT_FIXTURES[("/chat/completions", True)]).body_bytes)
    received: list[bytes] = []

    with pytest.raises(httpx.ReadError, match="reset"):
        url = fault_upstream.url("reset-after-3") + "/v1/chat/completions"
        with http.stream("POST", url, json={"stream": True}) as response:
            received.extend(response.iter_raw())

    assert b"".join(received) == b"".join(events[:3])


def test_fault_reset_mid_stream_raises_in_the_openai_sdk(
    fault_upstream: FaultUpstream, make_openai: Callable[[str], openai.OpenAI]
) -> None:
    client = make_openai(fault_upstream.url("reset-after-3"))
    chunks = []

    with pytest.raises(openai.APIConnectionError):
        for chunk in client.chat.completions.create(model="gpt-4", messages=MESSAGES, stream=True):
            chunks.append(chunk)

    assert len(chunks) == 3


def test_fault_reset_mid_body_raises_in_the_openai_sdk(
    fault_upstream: FaultUpstream, make_openai: Callable[[str], openai.OpenAI]
) -> None:
    client = make_openai(fault_upstream.url("reset-after-1"))

    with pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model="gpt-4", messages=MESSAGES)


def test_fault_close_ends_the_stream_unfinished(fault_upstream: FaultUpstream, http: httpx.Client) -> None:
    events = sse_events(fixture(DEFAULT_FIXTURES[("/responses", True)]).body_bytes)
    received: list[bytes] = []

    with pytest.raises(httpx.RemoteProtocolError):
        with http.stream("POST", fault_upstream.url("close-after-2") + "/v1/responses", json={"stream": True}) as r:
            received.extend(r.iter_raw())

    assert b"".join(received) == b"".join(events[:2])


def test_fault_stall_first_sends_no_byte_before_the_stall(fault_upstream: FaultUpstream) -> None:
    with httpx.Client(trust_env=False, timeout=httpx.Timeout(5.0, read=0.2)) as client:
        with pytest.raises(httpx.ReadTimeout):
            client.post(fault_upstream.url("stall-first-3") + "/v1/chat/completions", json={})


def test_fault_stall_first_then_answers_whole(fault_upstream: FaultUpstream, http: httpx.Client) -> None:
    response = http.post(fault_upstream.url("stall-first-0.1") + "/v1/messages", json={})

    assert response.content == fixture(DEFAULT_FIXTURES[("/messages", False)]).body_bytes


def test_fault_stall_between_stalls_after_the_first_event(fault_upstream: FaultUpstream) -> None:
    first_event = sse_events(fixture(DEFAULT_FIXTURES[("/chat/completions", True)]).body_bytes)[0]
    received: list[bytes] = []

    with httpx.Client(trust_env=False, timeout=httpx.Timeout(5.0, read=0.3)) as client:
        with pytest.raises(httpx.ReadTimeout):
            url = fault_upstream.url("stall-between-3") + "/v1/chat/completions"
            with client.stream("POST", url, json={"stream": True}) as response:
                received.extend(response.iter_raw())

    assert b"".join(received) == first_event


def test_fault_no_terminal_drops_only_the_last_event(fault_upstream: FaultUpstream, http: httpx.Client) -> None:
    events = sse_events(fixture(DEFAULT_FIXTURES[("/messages", True)]).body_bytes)

    response, pieces = _stream_raw(http, fault_upstream.url("no-terminal") + "/v1/messages", json={})

    assert response.status_code == 200
    assert b"".join(pieces) == b"".join(events[:-1])
    assert b"message_stop" in events[-1] and b"message_stop" not in b"".join(pieces)


def test_fault_not_json_answers_200_with_a_body_that_is_not_json(
    fault_upstream: FaultUpstream, http: httpx.Client
) -> None:
    response = http.post(fault_upstream.url("not-json") + "/v1/chat/completions", json={})

    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    with pytest.raises(json.JSONDecodeError):
        response.json()


def test_fault_header_selects_a_fault_without_a_path_prefix(fault_upstream: FaultUpstream, http: httpx.Client) -> None:
    response = http.post(fault_upstream.base_url + "/v1/responses", json={}, headers={"x-fault": "status-503"})

    assert response.status_code == 503


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/fault/explode/v1/chat/completions"])
def test_fault_upstream_answers_404_when_no_known_fault_is_named(
    fault_upstream: FaultUpstream, http: httpx.Client, path: str
) -> None:
    response = http.post(fault_upstream.base_url + path, json={})

    assert response.status_code == 404
    assert "fault" in response.json()["error"]["message"]


def test_refused_port_refuses_connections(http: httpx.Client) -> None:
    with pytest.raises(httpx.ConnectError):
        http.post(f"http://127.0.0.1:{refused_port()}/v1/chat/completions", json={})


def test_refused_port_raises_connection_error_in_the_openai_sdk(make_openai: Callable[[str], openai.OpenAI]) -> None:
    client = make_openai(f"http://127.0.0.1:{refused_port()}")

    with pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model="gpt-4", messages=MESSAGES)


def test_wait_for_http_returns_the_first_answer(replay_upstream: ReplayUpstream) -> None:
    assert wait_for_http(replay_upstream.base_url + "/v1/models").status_code == 404


def test_wait_for_http_gives_up_on_a_refused_port() -> None:
    with pytest.raises(TimeoutError, match="Nothing answered"):
        wait_for_http(f"http://127.0.0.1:{refused_port()}/", timeout=0.2)


# --- local model -------------------------------------------------------------------------------


def test_missing_model_server_names_the_exact_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(localmodel, "_SERVER_MODULES", ("llama_cpp", "a_module_nobody_installed"))

    with pytest.raises(MissingLocalModelError) as raised:
        LocalModelServer()

    assert raised.value.command == "pip install 'llama-cpp-python[server]'"
    assert str(raised.value).endswith(raised.value.command)


def test_model_file_of_the_right_size_is_reused_without_assembling(tmp_path: Path) -> None:
    real = ensure_model_file()
    cached = tmp_path / real.name
    with cached.open("wb") as sparse:
        sparse.truncate(real.stat().st_size)

    assert ensure_model_file(tmp_path) == cached
    with cached.open("rb") as still_sparse:
        assert still_sparse.read(4) == b"\0\0\0\0"  # a real GGUF file starts with b"GGUF"


def test_local_model_server_that_dies_reports_its_output(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"this is not a model")

    with pytest.raises(LocalModelError, match="exited with code"):
        LocalModelServer(broken, startup_timeout=60).start()


@pytest.mark.slow
def test_local_model_answers_chat_completions_and_streams_without_usage(
    local_model: LocalModelServer, make_openai: Callable[[str], openai.OpenAI]
) -> None:
    client = make_openai(local_model.base_url)
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Count from 1 to 50, separated by commas."}
    ]

    completion = client.chat.completions.create(
        model=local_model.model, messages=messages, max_tokens=8, temperature=0.0
    )
    stream = client.chat.completions.create(
        model=local_model.model,
        messages=messages,
        max_tokens=8,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)

    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 8
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert any(c.choices and c.choices[0].finish_reason == "length" for c in chunks)
    assert all(chunk.usage is None for chunk in chunks)
