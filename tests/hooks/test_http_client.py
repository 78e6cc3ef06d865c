"""The standard library's http.client, whole and streamed, through the shared suite."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest

from llmtap.hooks.install import HOOKED_LIBRARIES
from tests.hooks.suite import HookSuite, Reply, StreamedHookSuite, reply

pytestmark = pytest.mark.skipif("http.client" not in HOOKED_LIBRARIES, reason="this tree has no http.client hook")


def _request(lib: Any, url: str, request_json: Any, headers: Mapping[str, str]) -> tuple[Any, Any]:
    """Send the POST on a new connection; return the connection and its response (the caller closes both)."""
    parts = urlsplit(url)
    connection = lib.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        sent = {**headers, "content-type": "application/json"}
        connection.request("POST", parts.path, body=orjson.dumps(request_json), headers=sent)
        return connection, connection.getresponse()
    except BaseException:
        connection.close()
        raise


class TestHttpClientConnection(HookSuite):
    """`HTTPConnection.request` then `getresponse().read()`."""

    library = "http.client"
    connection_error = "ConnectionRefusedError"  # a builtin: http.client lets the OS error through

    def perform(self, url: str, request_json: Any, headers: Mapping[str, str]) -> Reply:
        connection, response = _request(self.lib, url, request_json, headers)
        try:
            return reply(response.status, response.read(), response.headers)
        finally:
            connection.close()


class TestHttpClientConnectionStream(StreamedHookSuite):
    """The response read in pieces with `read1`, as a streaming caller does."""

    library = "http.client"
    connection_error = "ConnectionRefusedError"
    first_piece_end = frozenset({"closed"})
    unread_end = frozenset({"closed"})
    stream_break_errors = frozenset({"ConnectionResetError", "IncompleteRead"})

    def perform(self, url: str, request_json: Any, headers: Mapping[str, str]) -> Reply:
        connection, response = _request(self.lib, url, request_json, headers)
        try:
            pieces = []
            while piece := response.read1(100):
                pieces.append(piece)
            return reply(response.status, b"".join(pieces), response.headers)
        finally:
            connection.close()

    def perform_and_stop_after_first_piece(self, url: str, request_json: Any, headers: Mapping[str, str]) -> bytes:
        connection, response = _request(self.lib, url, request_json, headers)
        try:
            piece: bytes = response.read1(100)
            response.close()
            return piece
        finally:
            connection.close()

    def perform_and_close_unread(self, url: str, request_json: Any, headers: Mapping[str, str]) -> int:
        connection, response = _request(self.lib, url, request_json, headers)
        try:
            response.close()
            return int(response.status)
        finally:
            connection.close()
