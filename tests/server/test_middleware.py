"""The capture middleware, driven as pure ASGI: what the client gets, and what the store holds."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from urllib.parse import unquote

import pytest

from llmtap.correlation.sampling import ModelCallSampling, encode_model_sampling
from llmtap.health import CaptureHealth
from llmtap.server.asgi import Receive, Scope, Send
from llmtap.server.middleware import CaptureMiddleware
from llmtap.store import CaptureStore
from llmtap.store.readers import read_model_call_records, read_rollout_calls
from tests.fixtures import fixture
from tests.server.asgi_harness import call_app, http_scope, replaying_app, request_body

MODEL_REF = {"type": "responses_api_models", "name": "policy_model"}


@pytest.fixture
def store(tmp_path: Path) -> CaptureStore:
    with CaptureStore(tmp_path / "calls") as opened:
        yield opened


def middleware(app, store: CaptureStore | None, **options) -> CaptureMiddleware:  # type: ignore[no-untyped-def]
    return CaptureMiddleware(app, store=store, model_ref=MODEL_REF, health=options.pop("health", CaptureHealth()), **options)


async def test_prefixed_call_is_captured_and_the_response_is_unchanged(store: CaptureStore) -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    seen: list[Scope] = []
    app = middleware(replaying_app(recorded, seen=seen), store)
    sent = await call_app(app, http_scope("/ng-rollout/7-1/v1/chat/completions"), request_body(recorded))
    assert sent.status == 200 and sent.body == recorded.body_bytes
    assert seen[0]["path"] == "/v1/chat/completions" and seen[0]["raw_path"] == b"/v1/chat/completions"
    [record] = read_model_call_records(store, "7-1")
    assert record.model_ref == MODEL_REF and record.dialect == "chat"
    assert record.response_id == json.loads(recorded.body_text)["id"]
    assert record.request == recorded.request_json and record.request_raw is None


async def test_the_inner_raw_path_stays_percent_encoded(store: CaptureStore) -> None:
    """`raw_path` is what a proxy sends upstream: the prefix comes off it exactly as sent."""
    raw_path = b"/ng-rollout/7-1/v1/deployments/a%2Fb/chat/completions"
    recorded = fixture("chat/text-basic-gpt4o")
    seen: list[Scope] = []
    app = middleware(replaying_app(recorded, seen=seen), store)
    scope = {**http_scope(unquote(raw_path.decode())), "raw_path": raw_path}
    await call_app(app, scope, request_body(recorded))
    assert seen[0]["raw_path"] == b"/v1/deployments/a%2Fb/chat/completions"
    assert seen[0]["path"] == "/v1/deployments/a/b/chat/completions"


async def test_a_prefix_encoded_otherwise_is_refused_not_re_encoded(store: CaptureStore) -> None:
    """A prefix whose raw and decoded forms disagree (`7%2D1` for `7-1`) is answered 400, never
    guessed at: the raw text after a decoded prefix is what would be sent upstream."""
    raw_path = b"/ng-rollout/7%2D1/v1/chat/completions"
    recorded = fixture("chat/text-basic-gpt4o")
    seen: list[Scope] = []
    app = middleware(replaying_app(recorded, seen=seen), store)
    sent = await call_app(app, {**http_scope(unquote(raw_path.decode())), "raw_path": raw_path}, request_body(recorded))
    assert sent.status == 400 and seen == []


async def test_each_call_gets_its_own_model_call_id(store: CaptureStore) -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    app = middleware(replaying_app(recorded), store)
    for _ in range(3):
        await call_app(app, http_scope("/ng-rollout/r/v1/chat/completions"), request_body(recorded))
    records = read_model_call_records(store, "r")
    assert [r.call_index for r in records] == [0, 1, 2]
    assert len({r.model_call_id for r in records}) == 3


async def test_unprefixed_calls_are_forwarded_and_not_captured(store: CaptureStore) -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    seen: list[Scope] = []
    app = middleware(replaying_app(recorded, seen=seen), store)
    sent = await call_app(app, http_scope("/v1/chat/completions"), request_body(recorded))
    assert sent.body == recorded.body_bytes and seen[0]["path"] == "/v1/chat/completions"
    assert store.rollouts() == []


async def test_prefixed_non_dialect_path_is_stripped_routed_and_not_captured(store: CaptureStore) -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    seen: list[Scope] = []
    app = middleware(replaying_app(recorded, seen=seen), store)
    await call_app(app, http_scope("/ng-rollout/r/v1/models", method="GET"), b"")
    assert seen[0]["path"] == "/v1/models"
    assert store.rollouts() == []


async def test_prefix_is_stripped_even_when_capture_is_off() -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    seen: list[Scope] = []
    app = middleware(replaying_app(recorded, seen=seen), None)
    sent = await call_app(app, http_scope("/ng-rollout/r/v1/chat/completions"), request_body(recorded))
    assert seen[0]["path"] == "/v1/chat/completions" and sent.body == recorded.body_bytes


@pytest.mark.parametrize("name", ["chat/text-stream-include-usage-gpt4", "responses/function-call-stream-gpt55",
                                  "messages/tool-use-stream-sonnet4"])
async def test_stream_terminal_is_released_only_after_the_record_is_durable(store: CaptureStore, name: str) -> None:
    recorded = fixture(name)
    app = middleware(replaying_app(recorded, pieces=12), store)
    path = f"/ng-rollout/s/{recorded.request_path.lstrip('/')}"
    sent = await call_app(app, http_scope(path), request_body(recorded),
                          snapshot=lambda: store.read("s").entries.__len__())
    assert sent.body == recorded.body_bytes
    # Chunks before the terminal event flow at once (no record yet); the terminal and after wait for it.
    assert sent.snapshots[0] == 0 and sent.snapshots[-1] == 1
    assert sent.snapshots == sorted(sent.snapshots)
    assert sent.snapshots.count(0) >= 2
    [record] = read_model_call_records(store, "s")
    assert record.stream and not record.stream_truncated and record.error_category is None


@pytest.mark.parametrize("pieces", [1, 4])
async def test_under_load_a_response_of_declared_length_keeps_its_head_with_its_first_body_bytes(
    store: CaptureStore, pieces: int
) -> None:
    # Its client can use nothing before the last byte, which waits for the record anyway: a head
    # sent alone would only cost the client a wake-up of its own.
    recorded = fixture("chat/text-basic-gpt4o")
    app = middleware(replaying_app(recorded, pieces=pieces, declare_length=True), store)
    app.in_flight += 1  # another call is in progress
    sent = await call_app(app, http_scope("/ng-rollout/j/v1/chat/completions"), request_body(recorded),
                          snapshot=lambda: store.read("j").entries.__len__())
    assert sent.body == recorded.body_bytes
    kinds = [message["type"] for message in sent.messages]
    assert kinds[0] == "http.response.start" and kinds.count("http.response.start") == 1
    if pieces == 1:  # the whole body completes the length: head and body wait for the record together
        assert set(sent.snapshots) == {1}
    else:  # the head goes with the first piece, at once; only the piece completing the body waits
        assert sent.snapshots[:2] == [0, 0] and sent.snapshots[-1] == 1
        assert sent.snapshots.count(0) == pieces


async def test_a_call_alone_sends_the_head_of_a_response_of_declared_length_at_once(store: CaptureStore) -> None:
    # Its client reads the head while the record is synced: the lone call's latency is what counts.
    recorded = fixture("chat/text-basic-gpt4o")
    app = middleware(replaying_app(recorded, pieces=1, declare_length=True), store)
    sent = await call_app(app, http_scope("/ng-rollout/j/v1/chat/completions"), request_body(recorded),
                          snapshot=lambda: store.read("j").entries.__len__())
    assert sent.messages[0]["type"] == "http.response.start" and sent.snapshots[0] == 0
    assert sent.snapshots[-1] == 1 and sent.body == recorded.body_bytes


async def test_stream_without_terminal_is_recorded_truncated_with_partial(store: CaptureStore) -> None:
    recorded = fixture("chat/text-stream-include-usage-gpt4")
    cut = type(recorded)(recorded.dialect, recorded.name, {
        **recorded.data, "response": {**recorded.data["response"], "body_text": recorded.body_text[:600]}})
    app = middleware(replaying_app(cut), store)
    sent = await call_app(app, http_scope("/ng-rollout/t/v1/chat/completions"), request_body(recorded))
    assert sent.body == recorded.body_bytes[:600]
    [record] = read_model_call_records(store, "t")
    assert record.stream_truncated and record.error_category == "stream_truncated"
    assert record.response is not None
    # The first 600 bytes hold two whole events, the role and `"This`, and the start of a third.
    assert record.response["id"] == "chatcmpl-ASYMZ4oSykiIFK4lXLReDiKyAjsQl"
    assert record.response["choices"][0]["message"]["content"] == '"This'


async def test_error_status_is_recorded_with_its_body(store: CaptureStore) -> None:
    recorded = fixture("messages/error-401-authentication")
    app = middleware(replaying_app(recorded), store)
    sent = await call_app(app, http_scope("/ng-rollout/e/v1/messages"), request_body(recorded))
    assert sent.status == 401 and sent.body == recorded.body_bytes
    [record] = read_model_call_records(store, "e")
    assert record.error_category == "auth" and record.status_code == 401
    assert record.error == json.loads(recorded.body_text)["error"]


async def test_app_exception_is_recorded_and_reraised(store: CaptureStore) -> None:
    class UpstreamFailure(Exception):
        status_code = 503

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        raise UpstreamFailure("boom")

    with pytest.raises(UpstreamFailure):
        await call_app(middleware(app, store), http_scope("/ng-rollout/x/v1/responses"), b'{"model": "m"}')
    [record] = read_model_call_records(store, "x")
    assert record.status_code == 503 and record.error_category == "upstream_error"
    assert record.request == {"model": "m"}


async def test_exception_mid_stream_keeps_the_partial_bytes(store: CaptureStore) -> None:
    recorded = fixture("chat/text-stream-include-usage-gpt4")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": recorded.body_bytes[:500], "more_body": True})
        raise ConnectionResetError("upstream reset")

    with pytest.raises(ConnectionResetError):
        await call_app(middleware(app, store), http_scope("/ng-rollout/m/v1/chat/completions"), b"{}")
    [record] = read_model_call_records(store, "m")
    assert record.status_code == 200 and record.error_category == "connection"
    assert record.stream_truncated and record.response_raw == recorded.body_text[:500]


async def test_client_disconnect_mid_stream_is_recorded_cancelled(store: CaptureStore) -> None:
    recorded = fixture("chat/text-stream-include-usage-gpt4")
    app = middleware(replaying_app(recorded, pieces=12), store)
    with pytest.raises(OSError):
        await call_app(app, http_scope("/ng-rollout/c/v1/chat/completions"), request_body(recorded),
                       disconnect_after_sends=3)
    [record] = read_model_call_records(store, "c")
    assert record.error_category == "cancelled" and record.stream_truncated


async def test_task_cancellation_still_leaves_a_record(store: CaptureStore) -> None:
    started = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
        started.set()
        await asyncio.sleep(30)

    task = asyncio.create_task(call_app(middleware(app, store), http_scope("/ng-rollout/k/v1/chat/completions"), b"{}"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [record] = read_model_call_records(store, "k")
    assert record.error_category == "cancelled"


async def test_invalid_rollout_id_is_a_clear_400(store: CaptureStore) -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    health = CaptureHealth()
    sent = await call_app(middleware(replaying_app(recorded), store, health=health),
                          http_scope("/ng-rollout/a%20b/v1/chat/completions"), b"{}")
    assert sent.status == 400 and b"not valid" in sent.body
    assert health.snapshot()["rejected_rollout_ids"] == 1


async def test_malformed_sampling_segment_is_a_400_and_still_recorded(store: CaptureStore) -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    bodies: list[bytes] = []
    app = middleware(replaying_app(recorded, bodies=bodies), store)
    sent = await call_app(app, http_scope("/ng-rollout/q/ng-sampling/!!bad!!/v1/chat/completions"), request_body(recorded))
    assert sent.status == 400 and bodies == []
    [record] = read_model_call_records(store, "q")
    assert record.status_code == 400 and record.error_category == "client_error"
    assert record.request == recorded.request_json


async def test_sampling_values_are_written_into_the_request(store: CaptureStore) -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    bodies: list[bytes] = []
    seen: list[Scope] = []
    app = middleware(replaying_app(recorded, bodies=bodies, seen=seen), store)
    segment = encode_model_sampling(ModelCallSampling(temperature=0.3, max_output_tokens=5))
    body = json.dumps({**recorded.request_json, "max_tokens": 50}).encode()
    await call_app(app, http_scope(f"/ng-rollout/p/ng-sampling/{segment}/v1/chat/completions"), body)
    sent_upstream = json.loads(bodies[0])
    assert sent_upstream["temperature"] == 0.3 and sent_upstream["max_tokens"] == 5
    assert dict(seen[0]["headers"])[b"content-length"] == str(len(bodies[0])).encode()
    [record] = read_model_call_records(store, "p")
    assert record.request is not None and record.request["max_tokens"] == 5


async def test_null_sampling_keeps_the_callers_values(store: CaptureStore) -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    bodies: list[bytes] = []
    app = middleware(replaying_app(recorded, bodies=bodies), store)
    body = json.dumps({**recorded.request_json, "temperature": 0.9}).encode()
    await call_app(app, http_scope("/ng-rollout/n/ng-sampling/null/v1/chat/completions"), body)
    assert json.loads(bodies[0])["temperature"] == 0.9


async def test_credentials_never_reach_the_store(store: CaptureStore) -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    headers = [(b"content-type", b"application/json"), (b"authorization", b"Bearer sk-secret-123"),
               (b"x-api-key", b"sk-ant-secret"), (b"cookie", b"session=abc")]
    await call_app(middleware(replaying_app(recorded), store), http_scope("/ng-rollout/h/v1/chat/completions", headers=headers),
                   request_body(recorded))
    text = store.path_for("h").read_text()
    assert "sk-secret-123" not in text and "sk-ant-secret" not in text and "session=abc" not in text


async def test_store_failure_never_changes_the_response(store: CaptureStore, monkeypatch: pytest.MonkeyPatch) -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    health = CaptureHealth()

    async def failing_append(rollout_id, record, **options):  # type: ignore[no-untyped-def]
        from llmtap.errors import StoreError

        store.mark_incomplete(rollout_id, "test")
        raise StoreError("disk full")

    monkeypatch.setattr(store, "append_async", failing_append)
    sent = await call_app(middleware(replaying_app(recorded), store, health=health),
                          http_scope("/ng-rollout/f/v1/chat/completions"), request_body(recorded))
    assert sent.status == 200 and sent.body == recorded.body_bytes
    assert health.snapshot()["record_write_failed"] == 1
    assert read_rollout_calls(store, "f").incomplete


async def test_a_call_alone_in_the_server_lets_the_store_sync_on_the_loop(
    store: CaptureStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    alone_flags: list[bool] = []
    real_append = store.append_async

    async def spying_append(rollout_id, record, *, alone=False, encoded=None):  # type: ignore[no-untyped-def]
        alone_flags.append(alone)
        return await real_append(rollout_id, record, alone=alone, encoded=encoded)

    monkeypatch.setattr(store, "append_async", spying_append)
    unprefixed_started, finish_unprefixed = asyncio.Event(), asyncio.Event()
    replay = replaying_app(recorded)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/slow":  # an uncaptured request still in progress
            unprefixed_started.set()
            await finish_unprefixed.wait()
        await replay(scope, receive, send)

    capturing = middleware(app, store)
    await call_app(capturing, http_scope("/ng-rollout/a/v1/chat/completions"), request_body(recorded))
    slow = asyncio.create_task(call_app(capturing, http_scope("/slow"), request_body(recorded)))
    await unprefixed_started.wait()
    await call_app(capturing, http_scope("/ng-rollout/a/v1/chat/completions"), request_body(recorded))
    finish_unprefixed.set()
    await slow
    assert alone_flags == [True, False]
    assert capturing.in_flight == 0
    assert len(read_rollout_calls(store, "a").records) == 2


async def test_non_http_scopes_pass_straight_through(store: CaptureStore) -> None:
    calls: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        calls.append(scope["type"])

    await middleware(app, store)({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    assert calls == ["lifespan"]


async def test_required_sampling_refuses_a_call_without_a_segment_and_records_it(store: CaptureStore) -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    bodies: list[bytes] = []
    app = middleware(replaying_app(recorded, bodies=bodies), store, require_sampling=True)
    refused = await call_app(app, http_scope("/ng-rollout/rq/v1/chat/completions"), request_body(recorded))
    allowed = await call_app(app, http_scope("/ng-rollout/rq/ng-sampling/null/v1/chat/completions"), request_body(recorded))
    assert refused.status == 400 and b"requires each generation call" in refused.body
    assert allowed.status == 200 and len(bodies) == 1
    assert [r.status_code for r in read_model_call_records(store, "rq")] == [400, 200]


async def test_sampling_segment_without_rollout_prefix_is_applied_and_not_captured(store: CaptureStore) -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    bodies: list[bytes] = []
    seen: list[Scope] = []
    app = middleware(replaying_app(recorded, bodies=bodies, seen=seen), store)
    segment = encode_model_sampling(ModelCallSampling(top_p=0.5))
    sent = await call_app(app, http_scope(f"/ng-sampling/{segment}/v1/chat/completions"), request_body(recorded))
    assert sent.status == 200 and seen[0]["path"] == "/v1/chat/completions"
    assert json.loads(bodies[0])["top_p"] == 0.5
    assert store.rollouts() == []


async def test_a_stream_keeps_each_chunk_as_it_arrived_so_it_can_be_cut_back(store: CaptureStore) -> None:
    """`response_chunks` holds one [offset_ms, length] per body chunk the app sent: the lengths
    cut `response_raw` back into exactly those chunks, in order, at non-decreasing offsets."""
    recorded = fixture("chat/text-stream-include-usage-gpt4")
    app = middleware(replaying_app(recorded, pieces=5), store)
    sent = await call_app(app, http_scope("/ng-rollout/chunks/v1/chat/completions"), request_body(recorded))
    assert sent.body == recorded.body_bytes
    [line] = [json.loads(text) for text in store.path_for("chunks").read_text().splitlines()]
    payload = recorded.body_bytes
    step = max(1, len(payload) // 5)
    expected = [payload[start : start + step] for start in range(0, len(payload), step)]
    assert [length for _, length in line["response_chunks"]] == [len(piece) for piece in expected]
    offsets = [offset for offset, _ in line["response_chunks"]]
    assert offsets == sorted(offsets) and offsets[0] >= 0
    [record] = read_model_call_records(store, "chunks")
    assert "response_chunks" not in record.extra  # a field of llmtap's own lines, not an unknown one


# --- the training token-capture segment (issue 17 item 7) -----------------------------------------


@pytest.mark.parametrize("sampling", ["", "/ng-sampling/null"])
async def test_the_training_token_capture_segment_is_stripped_and_its_call_captured_and_marked(
    store: CaptureStore, sampling: str
) -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    seen: list[Scope] = []
    app = middleware(replaying_app(recorded, seen=seen), store)
    path = f"/ng-rollout/4-2/training-token-capture{sampling}/v1/chat/completions"
    sent = await call_app(app, http_scope(path), request_body(recorded))
    assert sent.body == recorded.body_bytes
    assert seen[0]["path"] == "/v1/chat/completions" and seen[0]["raw_path"] == b"/v1/chat/completions"
    [line] = [record for _, record in store.read("4-2").entries]
    assert line["training_token_capture"] is True and line["http"]["path"] == "/v1/chat/completions"


async def test_an_eval_call_has_no_training_token_capture_mark(store: CaptureStore) -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    app = middleware(replaying_app(recorded), store)
    await call_app(app, http_scope("/ng-rollout/4-2/v1/chat/completions"), request_body(recorded))
    [line] = [record for _, record in store.read("4-2").entries]
    assert "training_token_capture" not in line


@pytest.mark.parametrize(
    ("path", "routed"),
    [
        ("/training-token-capture/v1/chat/completions", "/training-token-capture/v1/chat/completions"),
        ("/ng-rollout/4-2/training-token-captured/v1/chat/completions", "/training-token-captured/v1/chat/completions"),
    ],
)
async def test_the_segment_is_only_the_segment_and_only_after_a_rollout_prefix(
    store: CaptureStore, path: str, routed: str
) -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    seen: list[Scope] = []
    app = middleware(replaying_app(recorded, seen=seen), store)
    await call_app(app, http_scope(path), request_body(recorded))
    assert seen[0]["path"] == routed
    assert store.rollouts() == []  # not a dialect path: routed as it is, nothing captured


async def test_a_leading_dot_id_is_captured_under_an_escaped_file_name(store: CaptureStore) -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    app = middleware(replaying_app(recorded), store)
    sent = await call_app(app, http_scope("/ng-rollout/.hidden/v1/chat/completions"), request_body(recorded))
    assert sent.status == 200
    assert store.rollouts() == [".hidden"]
    assert (store.root / "%2Ehidden.capture.jsonl").is_file()
    assert not any(name.name.startswith(".") for name in store.root.iterdir())
    [record] = read_model_call_records(store, ".hidden")
    assert record.status_code == 200
