"""The proxy's HTTP/1.1 upstream transport against scripted upstreams: framing, reuse, timeouts, faults.

Each test's upstream is a raw asyncio server whose handler writes exactly the bytes under test,
so the transport meets each framing and each way an upstream can fail on the wire.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Literal

import pytest

from llmtap.server.http1 import HIGH_WATER, UpstreamClosed, UpstreamReadTimeout
from llmtap.server.upstream import Http1Transport, UpstreamUnreachable, _Origin
from tests.support.faults import reset_connection

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class ScriptedUpstream:
    """Runs `handler(upstream, reader, writer, connection_number)` for each connection, and keeps what came in."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.open_now = 0
        self.most_open = 0
        self.requests: list[bytes] = []
        self.tasks: set[asyncio.Task[None]] = set()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        """Read one request (head and content-length body) and keep it; b"" at end of connection."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return b""
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        return request

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            await self.handler(self, reader, writer, self.connections)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client left, or the test is over
        finally:
            self.open_now -= 1
            writer.close()


Handler = Callable[[ScriptedUpstream, asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


@asynccontextmanager
async def scripted(handler: Handler, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[tuple[ScriptedUpstream, str]]:
    upstream = ScriptedUpstream(handler)
    server = await asyncio.start_server(upstream._serve, "127.0.0.1", 0, ssl=ssl_context)
    port = server.sockets[0].getsockname()[1]
    try:
        yield upstream, f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
    finally:
        server.close()
        for task in upstream.tasks:
            task.cancel()
        await asyncio.gather(*upstream.tasks, return_exceptions=True)


def answer_each(reply: bytes) -> Handler:
    """Answer every request on the connection with `reply`."""

    async def handler(upstream: ScriptedUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        while await upstream.read_request(reader):
            writer.write(reply)
            await writer.drain()

    return handler


def answer_once(reply: bytes, then: Literal["close", "hold", "reset"]) -> Handler:
    """Read one request, write `reply`, then close the connection, hold it open, or reset it."""

    async def handler(upstream: ScriptedUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        await upstream.read_request(reader)
        writer.write(reply)
        await writer.drain()
        if then == "hold":
            await reader.read()
        elif then == "reset":
            await asyncio.sleep(0.1)
            reset_connection(writer)

    return handler


def answering(reply: bytes) -> AbstractAsyncContextManager[tuple[ScriptedUpstream, str]]:
    """An upstream answering every request on every connection with `reply`."""
    return scripted(answer_each(reply))


def transport(**options: float) -> Http1Transport:
    settings = {"max_connections": 16, "connect_timeout_s": 5.0, "read_timeout_s": 5.0, **options}
    return Http1Transport(**settings)  # type: ignore[arg-type]


async def body_of(upstream_transport: Http1Transport, url: str, method: str = "POST", body: bytes = b"{}") -> tuple[int, bytes]:
    response = await upstream_transport.send(method, url, [(b"content-type", b"application/json")], body)
    try:
        return response.status, b"".join([chunk async for chunk in response.chunks()])
    finally:
        await response.aclose()


async def failed_body(reply: bytes, then: Literal["close", "hold", "reset"], **options: float) -> tuple[list[bytes], BaseException]:
    """The pieces of a body that could not be completed, and the exception that ended it."""
    async with scripted(answer_once(reply, then)) as (_, url):
        client = transport(**options)
        response = await client.send("POST", url + "/x", [], b"{}")
        received: list[bytes] = []
        try:
            async for chunk in response.chunks():
                received.append(chunk)
        except Exception as exc:  # what is under test
            return received, exc
        finally:
            await response.aclose()
            await client.aclose()
    raise AssertionError(f"the body completed: {received!r}")


async def test_the_request_goes_as_given_and_the_connection_is_kept_alive() -> None:
    async with answering(OK) as (upstream, url):
        client = transport()
        for _ in range(3):
            assert await body_of(client, url + "/v1/chat/completions?x=%7E", body=b'{"a":1}') == (200, b"{}")
        await client.aclose()
    assert upstream.connections == 1
    host = url.removeprefix("http://").encode()
    assert upstream.requests[0] == (
        b"POST /v1/chat/completions?x=%7E HTTP/1.1\r\nhost: " + host + b"\r\n"
        b"content-type: application/json\r\ncontent-length: 7\r\n\r\n{\"a\":1}"
    )


async def test_a_base_path_and_query_go_in_the_request_target_and_the_host_keeps_its_port() -> None:
    async with answering(OK) as (upstream, url):
        client = transport()
        for target in ("/api/v1/messages?beta=%2Fx", "", "?q=1"):
            assert await body_of(client, url + target) == (200, b"{}")
        await client.aclose()
    request_lines = [request.split(b"\r\n")[:2] for request in upstream.requests]
    host = b"host: " + url.removeprefix("http://").encode()
    assert request_lines == [
        [b"POST /api/v1/messages?beta=%2Fx HTTP/1.1", host],
        [b"POST / HTTP/1.1", host],
        [b"POST /?q=1 HTTP/1.1", host],
    ]


@pytest.mark.parametrize(
    ("origin", "host", "port", "host_header"),
    [
        ("http://example.com", "example.com", 80, b"example.com"),
        ("http://example.com:80", "example.com", 80, b"example.com"),
        ("https://api.example.com:443", "api.example.com", 443, b"api.example.com"),
        ("https://api.example.com:8443", "api.example.com", 8443, b"api.example.com:8443"),
        ("http://[::1]:8000", "::1", 8000, b"[::1]:8000"),
        ("http://user:secret@example.com", "example.com", 80, b"example.com"),
    ],
)
def test_the_host_header_names_the_origin_without_a_default_port_or_credentials(
    origin: str, host: str, port: int, host_header: bytes
) -> None:
    found = _Origin.of(origin)
    assert (found.host, found.port, found.host_header) == (host, port, host_header)
    assert (found.ssl is not None) == origin.startswith("https")


async def test_credentials_in_the_base_url_go_as_basic_auth_unless_the_request_has_its_own() -> None:
    async with answering(OK) as (upstream, url):
        client = transport()
        with_credentials = url.replace("http://", "http://vllm:p%40ss@")
        assert await body_of(client, with_credentials + "/v1/models") == (200, b"{}")
        response = await client.send("POST", with_credentials + "/v1/models", [(b"authorization", b"Bearer sk-own")], b"{}")
        await response.aclose()
        await client.aclose()
    assert b"\r\nauthorization: Basic dmxsbTpwQHNz\r\n" in upstream.requests[0]  # vllm:p@ss
    assert b"Basic" not in upstream.requests[1] and b"\r\nauthorization: Bearer sk-own\r\n" in upstream.requests[1]
    assert b"vllm" not in upstream.requests[0].split(b"\r\n")[1]  # the host header carries no credentials


async def test_a_get_without_body_sends_no_content_length() -> None:
    async with answering(OK) as (upstream, url):
        client = transport()
        assert await body_of(client, url + "/v1/models", method="GET", body=b"") == (200, b"{}")
        await client.aclose()
    assert b"content-length" not in upstream.requests[0]


async def test_a_chunked_body_arrives_piece_by_piece_before_it_ends() -> None:
    release_second = asyncio.Event()

    async def handler(upstream: ScriptedUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        await upstream.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b"6\r\ndata: \r\n")
        await writer.drain()
        await release_second.wait()
        writer.write(b"3\r\n1\n\n\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with scripted(handler) as (_, url):
        client = transport()
        response = await client.send("POST", url + "/v1/chat/completions", [], b"{}")
        pieces = response.chunks()
        assert await anext(pieces) == b"data: "  # the first piece, while the upstream still holds the second
        release_second.set()
        assert [piece async for piece in pieces] == [b"1\n\n"]
        assert (b"transfer-encoding", b"chunked") in response.headers
        await response.aclose()
        await client.aclose()


async def test_a_body_ended_by_closing_the_connection_is_complete_and_the_connection_not_reused() -> None:
    reply = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end"
    async with scripted(answer_once(reply, "close")) as (upstream, url):
        client = transport()
        assert await body_of(client, url + "/x") == (200, b"until the end")
        assert await body_of(client, url + "/x") == (200, b"until the end")
        await client.aclose()
    assert upstream.connections == 2


async def test_a_body_ended_by_a_reset_instead_of_a_close_is_a_failed_body() -> None:
    received, error = await failed_body(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\ncut", "reset")
    assert isinstance(error, UpstreamClosed) and isinstance(error.__cause__, ConnectionResetError)
    assert received in ([], [b"cut"])  # the reset may discard the unread bytes; none are ever invented or repeated


async def test_connection_close_from_the_upstream_is_honoured() -> None:
    reply = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"
    async with answering(reply) as (upstream, url):
        client = transport()
        for _ in range(2):
            assert await body_of(client, url + "/x") == (200, b"ok")
        await client.aclose()
    assert upstream.connections == 2


async def test_a_head_answer_declaring_a_length_has_no_body_and_does_not_hang() -> None:
    async with answering(b"HTTP/1.1 200 OK\r\ncontent-length: 1234\r\n\r\n") as (upstream, url):
        client = transport()
        assert await asyncio.wait_for(body_of(client, url + "/x", method="HEAD", body=b""), 5) == (200, b"")
        await client.aclose()


async def test_an_interim_103_is_skipped_for_the_real_answer() -> None:
    async with answering(b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n" + OK) as (_, url):
        client = transport()
        assert await body_of(client, url + "/x") == (200, b"{}")
        await client.aclose()


async def test_errors_come_back_as_answers_with_their_bodies() -> None:
    reply = b'HTTP/1.1 429 Too Many Requests\r\ncontent-length: 15\r\nretry-after: 3\r\n\r\n{"error":"slow"}'[:-1]
    async with answering(reply) as (_, url):
        client = transport()
        response = await client.send("POST", url + "/x", [], b"{}")
        assert response.status == 429 and (b"retry-after", b"3") in response.headers
        assert b"".join([chunk async for chunk in response.chunks()]) == b'{"error":"slow"'
        await response.aclose()
        await client.aclose()


async def test_silence_before_the_head_is_an_unreachable_timeout() -> None:
    async with scripted(answer_once(b"", "hold")) as (_, url):
        client = transport(read_timeout_s=0.2)
        with pytest.raises(UpstreamUnreachable) as caught:
            await client.send("POST", url + "/x", [], b"{}")
        assert caught.value.timed_out and isinstance(caught.value.cause, TimeoutError)
        await client.aclose()


async def test_silence_mid_body_fails_the_body_with_a_read_timeout() -> None:
    received, error = await failed_body(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf ", "hold", read_timeout_s=0.2)
    assert isinstance(error, UpstreamReadTimeout) and received == [b"half "]


async def test_a_long_stream_with_steady_bytes_never_times_out() -> None:
    async def handler(upstream: ScriptedUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        await upstream.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(8):
            writer.write(b"1\r\n.\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with scripted(handler) as (_, url):
        client = transport(read_timeout_s=0.15)  # the whole stream takes 0.4 s
        assert await body_of(client, url + "/x") == (200, b"." * 8)
        await client.aclose()


async def test_a_connection_dropped_mid_body_fails_the_body_as_a_connection_error() -> None:
    received, error = await failed_body(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial", "close")
    assert isinstance(error, UpstreamClosed) and isinstance(error, ConnectionError) and received == [b"partial"]


async def test_a_malformed_answer_is_unreachable_not_a_hang() -> None:
    async with answering(b"SPDY/9 what\r\n\r\n") as (_, url):
        client = transport()
        with pytest.raises(UpstreamUnreachable) as caught:
            await asyncio.wait_for(client.send("POST", url + "/x", [], b"{}"), 5)
        assert not caught.value.timed_out
        await client.aclose()


async def test_a_refused_connection_is_unreachable_and_not_retried() -> None:
    async with answering(OK) as (_, url):
        pass  # closed: its port now refuses
    client = transport()
    with pytest.raises(UpstreamUnreachable) as caught:
        await client.send("POST", url + "/x", [], b"{}")
    assert isinstance(caught.value.cause, ConnectionRefusedError) and not caught.value.timed_out


async def test_a_pooled_connection_dropped_as_the_request_lands_is_retried_once_on_a_new_one() -> None:
    async def handler(upstream: ScriptedUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        await upstream.read_request(reader)
        writer.write(OK)
        await writer.drain()
        if number == 1:
            await upstream.read_request(reader)  # the second request arrives, as the upstream closes it as idle
        else:
            await reader.read()

    async with scripted(handler) as (upstream, url):
        client = transport()
        assert await body_of(client, url + "/x") == (200, b"{}")
        assert await body_of(client, url + "/x") == (200, b"{}")
        await client.aclose()
    assert upstream.connections == 2 and len(upstream.requests) == 3


async def test_a_fresh_connection_dropped_without_answer_is_not_retried() -> None:
    async with scripted(answer_once(b"", "close")) as (upstream, url):
        client = transport()
        with pytest.raises(UpstreamUnreachable) as caught:
            await client.send("POST", url + "/x", [], b"{}")
        assert isinstance(caught.value.cause, ConnectionError)
        await client.aclose()
    assert upstream.connections == 1


async def test_the_pool_never_opens_more_than_its_limit() -> None:
    async def handler(upstream: ScriptedUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        while await upstream.read_request(reader):
            await asyncio.sleep(0.02)
            writer.write(OK)
            await writer.drain()

    async with scripted(handler) as (upstream, url):
        client = transport(max_connections=2)
        results = await asyncio.gather(*(body_of(client, url + "/x") for _ in range(9)))
        await client.aclose()
    assert results == [(200, b"{}")] * 9
    assert upstream.most_open <= 2 and len(upstream.requests) == 9


async def test_a_body_nobody_reads_stops_the_socket_instead_of_filling_memory() -> None:
    size = 16 * HIGH_WATER
    reply = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size + b"x" * size
    async with scripted(answer_once(reply, "hold")) as (_, url):
        client = transport()
        response = await client.send("POST", url + "/x", [], b"{}")
        await asyncio.sleep(0.3)  # the upstream writes all it can; the proxy reads nothing
        buffered = response._response._buffered  # type: ignore[attr-defined]
        assert HIGH_WATER <= buffered < 2 * HIGH_WATER
        assert len(b"".join([chunk async for chunk in response.chunks()])) == size
        await response.aclose()
        await client.aclose()


async def test_a_header_value_with_a_line_break_is_refused_before_sending() -> None:
    async with answering(OK) as (upstream, url):
        client = transport()
        with pytest.raises(UpstreamUnreachable):
            await client.send("POST", url + "/x", [(b"x-note", b"a\r\nx-injected: 1")], b"{}")
        await client.aclose()
    assert upstream.requests == []


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
async def test_an_https_upstream_is_verified_and_reached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    async with scripted(answer_each(OK), server_context) as (upstream, url):
        untrusting = transport()
        with pytest.raises(UpstreamUnreachable) as caught:
            await untrusting.send("POST", url + "/x", [], b"{}")
        assert isinstance(caught.value.cause, ssl.SSLCertVerificationError)
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # read when the transport makes its context
        trusting = transport()
        assert await body_of(trusting, url + "/v1/messages") == (200, b"{}")
        await trusting.aclose()
    assert upstream.requests[-1].startswith(b"POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1:")
