"""Error categories: from statuses and from exceptions."""

from __future__ import annotations

import orjson

from llmtap.records import (
    ERROR_CATEGORIES,
    category_for_exception,
    category_for_status,
    raw_line_from_exchange,
)
from tests.records.test_line import bare_exchange

EXPECTED_STATUS_CATEGORY = {400: "client_error", 401: "auth", 404: "not_found"}


def test_status_categories() -> None:
    assert [category_for_status(s) for s in (200, 408, 504, 429, 401, 403, 404, 422, 400, 500, 503, None)] == [
        None, "timeout", "timeout", "rate_limit", "auth", "auth", "not_found",
        "client_error", "client_error", "upstream_error", "upstream_error", None,
    ]


def test_exception_categories_follow_the_exception_chain() -> None:
    class ReadTimeout(Exception): ...

    class RemoteProtocolError(Exception): ...

    wrapped = RuntimeError("outer")
    wrapped.__cause__ = ReadTimeout()
    assert category_for_exception(wrapped) == "timeout"
    assert category_for_exception(ConnectionResetError()) == "connection"
    assert category_for_exception(RemoteProtocolError()) == "connection"
    assert category_for_exception(ValueError()) == "exception"


def test_every_category_is_one_of_the_known_names() -> None:
    assert set(ERROR_CATEGORIES) >= {
        "timeout", "rate_limit", "auth", "not_found", "client_error", "upstream_error", "incomplete",
        "stream_truncated", "capture_parse_error", "connection", "exception", "cancelled",
    }


def test_exception_with_upstream_status_keeps_that_status_and_category() -> None:
    class UpstreamError(Exception):
        status_code = 403

    exchange = bare_exchange()
    exchange.exception = UpstreamError("secret prompt text")
    line = raw_line_from_exchange(exchange)
    assert line["status_code"] == 403 and line["error_category"] == "auth"
    assert line["exception_type"] == "UpstreamError"
    assert "secret prompt text" not in orjson.dumps(line).decode()


def test_synthesized_status_lets_the_exception_decide() -> None:
    exchange = bare_exchange()
    exchange.status_code = 502
    exchange.status_synthesized = True
    exchange.exception = ConnectionRefusedError()
    assert raw_line_from_exchange(exchange)["error_category"] == "connection"
