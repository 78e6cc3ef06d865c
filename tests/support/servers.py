"""Loopback hosting for the test upstreams: free ports, uvicorn in a thread, waiting for HTTP."""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import TypeVar

import httpx
import uvicorn
from starlette.types import ASGIApp

__all__ = ["ServerThread", "StopsOnExit", "free_port", "run_uvicorn_in_thread", "wait_for_http"]

LOOPBACK = "127.0.0.1"
_Self = TypeVar("_Self", bound="StopsOnExit")


def free_port() -> int:
    """Return a loopback TCP port that nothing listens on at the moment of the call."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


def bound_socket(port: int = 0) -> socket.socket:
    """Bind a loopback socket now, so a server started later owns the port without a race."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((LOOPBACK, port))
    except OSError:
        sock.close()
        raise
    return sock


class StopsOnExit:
    """`with` support for the loopback servers here: leaving the block calls `stop()`."""

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ServerThread(StopsOnExit):
    """An ASGI app served by uvicorn on loopback from a daemon thread.

    The socket is bound before the thread starts, so `port` is settled at construction.
    `stop()` asks uvicorn to exit, gives open connections `graceful_timeout` seconds, then
    joins the thread; it is idempotent and also runs on leaving a `with` block.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        port: int = 0,
        graceful_timeout: int = 1,
        lifespan: str = "off",
        config: uvicorn.Config | None = None,
    ) -> None:
        """`config`, when given, is served as it is (its `app` is served, `app` is ignored)."""
        self._socket = bound_socket(port)
        self.port: int = self._socket.getsockname()[1]
        config = config or uvicorn.Config(
            app,
            lifespan=lifespan,
            ws="none",
            log_level="warning",
            access_log=False,
            server_header=False,
            timeout_graceful_shutdown=graceful_timeout,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._socket]},
            name=f"uvicorn-{self.port}",
            daemon=True,
        )

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, timeout: float = 10.0) -> ServerThread:
        """Start serving and return once uvicorn accepts connections."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"The uvicorn server on port {self.port} exited during start-up; see its log above.")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"The uvicorn server on port {self.port} did not start within {timeout} s.")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Ask uvicorn to exit and wait for its thread; safe to call twice."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._socket.close()


def run_uvicorn_in_thread(app: ASGIApp, port: int = 0) -> ServerThread:
    """Serve `app` on loopback (`port` 0 picks a free one) and return the running handle.

    Usage::

        with run_uvicorn_in_thread(app) as server:
            httpx.get(server.base_url + "/")
    """
    return ServerThread(app, port=port).start()


def wait_for_http(url: str, timeout: float = 10.0, *, interval: float = 0.05) -> httpx.Response:
    """Poll `url` with GET until any HTTP answer comes back, and return that answer.

    Environment proxies are ignored so loopback traffic never leaves the machine.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    with httpx.Client(trust_env=False, timeout=max(interval, 1.0)) as client:
        while True:
            try:
                return client.get(url)
            except httpx.TransportError as error:
                last_error = error
            if time.monotonic() > deadline:
                raise TimeoutError(f"Nothing answered GET {url!r} within {timeout} s (last error: {last_error!r}).")
            time.sleep(interval)
