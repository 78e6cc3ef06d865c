"""Pairing JSON-RPC requests with responses: by id and direction, with outcomes, cancellations and retries."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmtap.mcp.pairing import CLIENT_TO_SERVER, SERVER_TO_CLIENT, Pairing, SessionIdentity


def _call(id_: Any, name: str = "echo", **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": {"name": name, "arguments": {}, **params}}


def _result(id_: Any, **result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "result": {"content": [{"type": "text", "text": "ok"}], **result}}


def test_a_response_closes_the_request_with_its_id_and_direction_only() -> None:
    pairing = Pairing(SessionIdentity("stdio"))
    assert pairing.observe(CLIENT_TO_SERVER, _call(1), 10) == []
    assert pairing.observe(CLIENT_TO_SERVER, _call("1", "other"), 10) == []
    # A response travelling the same way as the request is not its answer.
    assert pairing.observe(CLIENT_TO_SERVER, _result(1), 10) == []
    (first,) = pairing.observe(SERVER_TO_CLIENT, _result("1"), 20)
    assert first.name == "other" and first.jsonrpc_id == "1" and first.status == "completed"
    (second,) = pairing.observe(SERVER_TO_CLIENT, _result(1), 20)
    assert second.name == "echo" and second.response_bytes == 20 and second.request_bytes == 10
    assert second.duration_ms is not None and second.duration_ms >= 0
    assert pairing.stats.unmatched_responses == 1 and pairing.open_requests == 0


@given(st.permutations(list(range(8))))
def test_responses_in_any_order_close_their_own_requests(order: list[int]) -> None:
    pairing = Pairing(SessionIdentity("stdio"))
    for index in range(8):
        pairing.observe(CLIENT_TO_SERVER, _call(index, f"tool{index}"), 1)
    for index in order:
        (record,) = pairing.observe(SERVER_TO_CLIENT, _result(index), 1)
        assert record.name == f"tool{index}"


def test_outcomes_error_tool_error_and_cancellation() -> None:
    pairing = Pairing(SessionIdentity("stdio"))
    for id_ in (1, 2, 3):
        pairing.observe(CLIENT_TO_SERVER, _call(id_), 1)
    (error,) = pairing.observe(
        SERVER_TO_CLIENT, {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad"}}, 1
    )
    assert error.status == "failed" and error.error == {"category": "jsonrpc_error", "code": -32602, "message": "bad"}
    (tool_error,) = pairing.observe(SERVER_TO_CLIENT, _result(2, isError=True), 1)
    assert tool_error.status == "failed" and tool_error.is_error is True
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}}
    (cancelled,) = pairing.observe(CLIENT_TO_SERVER, cancel, 1)
    assert cancelled.status == "cancelled"


def test_a_reused_id_closes_the_earlier_request_as_incomplete() -> None:
    pairing = Pairing(SessionIdentity("stdio"))
    pairing.observe(CLIENT_TO_SERVER, _call(1, "first"), 1)
    (old,) = pairing.observe(CLIENT_TO_SERVER, _call(1, "second"), 1)
    assert old.name == "first" and old.status == "incomplete" and old.error == {"category": "id_reused"}


def test_unrecorded_methods_and_notifications_make_no_record() -> None:
    pairing = Pairing(SessionIdentity("stdio"))
    assert pairing.observe(CLIENT_TO_SERVER, {"jsonrpc": "2.0", "id": 1, "method": "ping"}, 1) == []
    assert pairing.observe(SERVER_TO_CLIENT, {"jsonrpc": "2.0", "id": 1, "result": {}}, 1) == []
    assert pairing.observe(CLIENT_TO_SERVER, {"jsonrpc": "2.0", "method": "notifications/initialized"}, 1) == []
    assert pairing.stats.records == 0


def test_the_handshake_and_the_stateless_meta_set_the_session_identity() -> None:
    identity = SessionIdentity("stdio")
    pairing = Pairing(identity)
    pairing.observe(
        CLIENT_TO_SERVER,
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "clientInfo": {"name": "c", "version": "1", "extra": "x"}},
        },
        1,
    )
    pairing.observe(
        SERVER_TO_CLIENT,
        {
            "jsonrpc": "2.0",
            "id": 0,
            "result": {"protocolVersion": "2025-06-18", "serverInfo": {"name": "s", "version": "2"}},
        },
        1,
    )
    assert (identity.era, identity.version, identity.client, identity.server) == (
        "handshake",
        "2025-06-18",
        {"name": "c", "version": "1"},
        {"name": "s", "version": "2"},
    )
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "m"},
    }
    pairing.observe(CLIENT_TO_SERVER, _call(1, _meta=meta), 1)
    (record,) = pairing.observe(
        SERVER_TO_CLIENT, _result(1, _meta={"io.modelcontextprotocol/serverInfo": {"name": "s2"}}), 1
    )
    assert record.protocol == {"era": "stateless", "version": "2026-07-28"} and record.client == {"name": "m"}
    assert record.server == {"name": "s2"}


def test_a_retry_without_request_state_links_only_to_a_unique_same_request() -> None:
    pairing = Pairing(SessionIdentity("stdio"))
    asked = {"inputRequests": {"k": {"method": "elicitation/create", "params": {}}}, "resultType": "input_required"}
    pairing.observe(CLIENT_TO_SERVER, _call(1, "ask"), 1)
    (first,) = pairing.observe(SERVER_TO_CLIENT, {"jsonrpc": "2.0", "id": 1, "result": asked}, 1)
    assert first.status == "input_required" and first.result["input_requests"] == [
        {"key": "k", "method": "elicitation/create"}
    ]
    retry = _call(2, "ask", inputResponses={"k": {"action": "accept", "content": {"pin": "1234"}}})
    pairing.observe(CLIENT_TO_SERVER, retry, 1)
    (second,) = pairing.observe(SERVER_TO_CLIENT, _result(2), 1)
    assert second.retry == {"of": first.call_id, "original": first.call_id, "round": 1, "linked_by": "same_request"}
    (response,) = second.input["responses"]  # type: ignore[index]
    assert response["action"] == "accept" and response["content_digest"].startswith("hmac-sha256:")
    assert "1234" not in second.to_line().decode()


def test_elicitation_digests_are_keyed_per_session() -> None:
    digests = []
    for _ in range(2):
        pairing = Pairing(SessionIdentity("stdio"))
        pairing.observe(
            SERVER_TO_CLIENT,
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "elicitation/create",
                "params": {"requestedSchema": {"properties": {"pin": {}}}},
            },
            1,
        )
        (record,) = pairing.observe(
            CLIENT_TO_SERVER, {"jsonrpc": "2.0", "id": 1, "result": {"action": "accept", "content": {"pin": "1234"}}}, 1
        )
        assert record.direction == "server_to_client" and record.arguments == {
            "mode": None,
            "requested_fields": ["pin"],
        }
        digests.append(record.result["content_digest"])  # type: ignore[index]
    # The same short answer in two sessions gives unrelated digests: a guess cannot be hashed and compared.
    assert digests[0] != digests[1]


def test_close_all_records_every_open_request_as_incomplete() -> None:
    pairing = Pairing(SessionIdentity("stdio"))
    pairing.observe(CLIENT_TO_SERVER, _call(1), 1)
    pairing.observe(
        SERVER_TO_CLIENT,
        {"jsonrpc": "2.0", "id": 9, "method": "sampling/createMessage", "params": {"messages": [{}], "maxTokens": 5}},
        1,
    )
    records = pairing.close_all("server_exited", {"exit_code": 1})
    assert [(r.method, r.status, r.error) for r in records] == [
        ("tools/call", "incomplete", {"category": "server_exited", "exit_code": 1}),
        ("sampling/createMessage", "incomplete", {"category": "server_exited", "exit_code": 1}),
    ]


def test_open_requests_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import llmtap.mcp.pairing as pairing_module

    monkeypatch.setattr(pairing_module, "MAX_PENDING", 3)
    pairing = Pairing(SessionIdentity("stdio"))
    evicted = [record for index in range(5) for record in pairing.observe(CLIENT_TO_SERVER, _call(index), 1)]
    limit = {"category": "pending_limit"}
    assert [(r.jsonrpc_id, r.error) for r in evicted] == [(0, limit), (1, limit)]
    assert pairing.open_requests == 3
