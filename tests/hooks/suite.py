"""The one suite every HTTP-library hook runs through, entered once per call style.

A call style is a subclass (named `Test...`, in `tests/hooks/test_<library>.py`) that says which
hooked library it drives (`library`, a key of `llmtap.hooks.install.HOOKED_LIBRARIES`) and makes
one POST the way a user of that style would (`perform`). A style that hands the body out as a
stream derives from `StreamedHookSuite` and also says how a caller stops early. Against the real
replay and fault upstreams over loopback, the suite then checks for every style:

- the caller gets the recorded bytes unchanged, the upstream sees the request once, and exactly
  one record lands, with the right hook, dialect, bodies, status and no credential;
- a refused connection re-raises the library's own error and a 5xx reaches the caller as it was
  sent, each leaving one record with its error category;
- a call outside the registry, without an active capture, or already claimed by a layer above
  passes through and leaves no record (suppression);
- after the hooks are removed no record lands, the response is the same, and no wrapper is left;
  a second install (a second capture, a second hook object) still records once;
- the layers below (urllib3 under requests) are hooked too and stay silent: one record;
- streamed styles: a stream abandoned after its first piece, one closed unread, and one reset by
  the server mid-body each leave one record saying how it ended.

`tests/hooks/test_hook_suite_completeness.py` fails, naming the library, when a hooked HTTP
library lacks a whole-body or a streamed style. Adding a library is one small subclass per style:
`perform` (and, streamed, the two early endings) in the library's own calls, plus the class
attributes; `tests/hooks/test_http_client.py` (the standard library's `http.client`) is the
shortest example.
"""

from __future__ import annotations

import abc
import asyncio
import builtins
import importlib
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, TypeVar

import orjson
import pytest

from llmtap.hooks.base import Hook, Patch, claim_call, release_call, wrapped_original
from llmtap.hooks.install import HOOKED_LIBRARIES, acquire_hooks, installed_hooks, release_hooks
from llmtap.hooks.session import CaptureSession, reset_session, use_session
from tests.fixtures import RecordedExchange, fixture
from tests.hooks.conftest import recorded_lines
from tests.support.faults import FAULT_FIXTURE_HEADER, FaultUpstream, refused_port
from tests.support.replay import ReplayUpstream

__all__ = ["CREDENTIALS", "HookSuite", "Reply", "StreamedHookSuite", "reply", "run"]

# Sent on every suite call; a record must keep neither value.
CREDENTIALS = {
    "authorization": "Bearer sk-suite-secret-never-recorded",
    "x-api-key": "sk-ant-suite-secret-never-recorded",
}

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run an async style's call on a fresh event loop (the test's context, so its capture, carries over)."""
    return asyncio.run(coroutine)


@dataclass(frozen=True)
class Reply:
    """What the caller got: the status, every body byte it read, and the content type it was told."""

    status: int
    body: bytes
    content_type: str


def reply(status: int, body: bytes, headers: Any) -> Reply:
    """The Reply for `status`, `body` and the response's headers (any mapping with a case-blind `get`)."""
    return Reply(status, body, str(headers.get("content-type", "")))


def hook_for(library: str) -> type[Hook]:
    """The hook class the install registry names for `library`."""
    module_name, class_name = HOOKED_LIBRARIES[library]
    hook_class: type[Hook] = getattr(importlib.import_module(module_name), class_name)
    return hook_class


def choke_points(library: ModuleType, hook_class: type[Hook]) -> list[Patch]:
    """The attributes `hook_class` patches in `library`, as it would patch them (nothing is applied)."""
    return hook_class()._make_patches(library)


def current(patch: Patch) -> Any:
    """What the patched attribute holds now (the class's own entry, not one inherited)."""
    return patch.owner.__dict__.get(patch.name, getattr(patch.owner, patch.name, None))


class HookSuite(abc.ABC):
    """The checks every call style of every hooked HTTP library passes; see the module docstring.

    A subclass sets `library`, `connection_error` (the dotted name, in the library's module or
    else a builtin, of what a refused connection raises) and `perform`; `recording` picks the
    recorded exchange it replays (a JSON one here, a stream for `StreamedHookSuite`),
    `lower_layers` the libraries it runs on top of (those this tree hooks must stay silent).
    """

    library: ClassVar[str]
    connection_error: ClassVar[str]
    recording: ClassVar[str] = "chat/text-basic-gpt4o"
    lower_layers: ClassVar[tuple[str, ...]] = ()
    streamed: ClassVar[bool] = False

    lib: ModuleType

    @abc.abstractmethod
    def perform(self, url: str, request_json: Any, headers: Mapping[str, str]) -> Reply:
        """POST `request_json` to `url` with `headers` in this style; return what the caller read."""

    # --- helpers -------------------------------------------------------------------------------

    @pytest.fixture(autouse=True)
    def _library(self) -> None:
        self.lib = pytest.importorskip(self.library)

    @property
    def hook(self) -> str:
        """The hook's label on records."""
        return self.library

    @property
    def recorded(self) -> RecordedExchange:
        return fixture(self.recording)

    @property
    def recorded_reply(self) -> Reply:
        """What the caller gets from the replay upstream, captured or not."""
        return Reply(200, self.recorded.body_bytes, self.recorded.content_type)

    def call(self, base_url: str, path: str | None = None) -> Reply:
        return self.perform(base_url + (path or self.recorded.request_path), self.recorded.request_json, CREDENTIALS)

    def assert_recorded_whole(self, line: dict[str, Any], session: CaptureSession) -> None:
        recorded = self.recorded
        assert line["capture"]["hook"] == self.hook
        assert line["capture"]["point"] == "in-process"
        assert line["capture"]["end"] == "eof"
        assert line["provider"] == "local"
        assert line["dialect"] == recorded.dialect
        assert line["status_code"] == recorded.status == 200
        assert line["error_category"] is None
        assert line["request"] == recorded.request_json
        assert line["http"]["method"] == "POST" and line["http"]["path"] == recorded.request_path
        assert line["latency_ms"] is not None and line["latency_ttft_ms"] is not None
        if recorded.is_stream:
            assert line["stream"] is True and line["stream_truncated"] is False
            assert line["response_raw"] == recorded.body_text
            assert isinstance(line["response"], dict)
        else:
            assert "stream" not in line
            assert line["response"] == orjson.loads(recorded.body_bytes)
        request_headers = line["http"]["request_headers"]
        assert not set(CREDENTIALS) & set(request_headers)
        assert request_headers["content-type"].startswith("application/json")
        on_disk = b"".join(path.read_bytes() for path in Path(session.store_root).glob("*.jsonl"))
        assert not any(secret.encode() in on_disk for secret in CREDENTIALS.values())

    # --- the suite -----------------------------------------------------------------------------

    def test_a_call_returns_the_recorded_bytes_and_leaves_one_whole_record(
        self, capture_session: CaptureSession, replay_upstream: ReplayUpstream
    ) -> None:
        reply = self.call(replay_upstream.base_url)
        assert reply == self.recorded_reply
        [sent] = replay_upstream.received
        assert sent.path == self.recorded.request_path and sent.fixture_id == self.recording
        assert orjson.loads(sent.body) == self.recorded.request_json
        [line] = recorded_lines(capture_session)
        self.assert_recorded_whole(line, capture_session)

    def test_a_refused_connection_raises_the_librarys_error_and_leaves_one_connection_record(
        self, capture_session: CaptureSession
    ) -> None:
        expected: Any = self.lib if hasattr(self.lib, self.connection_error.split(".")[0]) else builtins
        for name in self.connection_error.split("."):
            expected = getattr(expected, name)
        with pytest.raises(expected) as raised:
            self.call(f"http://127.0.0.1:{refused_port()}")
        assert type(raised.value) is expected
        [line] = recorded_lines(capture_session)
        assert line["capture"]["hook"] == self.hook and line["capture"]["end"] == "error"
        assert line["error_category"] == "connection"
        assert line["exception_type"] == expected.__name__
        assert line["status_code"] is None and line["response"] is None

    def test_a_server_error_reaches_the_caller_as_sent_and_is_recorded_as_upstream_error(
        self, capture_session: CaptureSession, fault_upstream: FaultUpstream
    ) -> None:
        reply = self.call(fault_upstream.url("status-500"))
        assert reply.status == 500
        [line] = recorded_lines(capture_session)
        assert line["capture"]["hook"] == self.hook and line["capture"]["end"] == "eof"
        assert line["status_code"] == 500 and line["error_category"] == "upstream_error"
        assert line["response"] == orjson.loads(reply.body)
        assert fault_upstream.request_count == 1

    def test_a_call_outside_the_registry_passes_through_unrecorded(
        self, capture_session: CaptureSession, replay_upstream: ReplayUpstream
    ) -> None:
        reply = self.call(replay_upstream.base_url, "/v1/models")
        assert reply.status == 404 and orjson.loads(reply.body)["error"]["type"] == "replay_no_match"
        assert replay_upstream.request_count == 1
        assert recorded_lines(capture_session) == []

    def test_without_an_active_capture_the_call_is_unchanged_and_unrecorded(
        self, capture_session: CaptureSession, replay_upstream: ReplayUpstream
    ) -> None:
        token = use_session(None)
        try:
            reply = self.call(replay_upstream.base_url)
        finally:
            reset_session(token)
        assert reply == self.recorded_reply
        assert recorded_lines(capture_session) == []

    def test_a_call_a_layer_above_already_claimed_is_left_to_that_layer(
        self, capture_session: CaptureSession, replay_upstream: ReplayUpstream
    ) -> None:
        token = claim_call()
        try:
            reply = self.call(replay_upstream.base_url)
        finally:
            release_call(token)
        assert reply == self.recorded_reply
        assert recorded_lines(capture_session) == []

    def test_after_uninstall_nothing_is_recorded_the_reply_is_the_same_and_no_wrapper_is_left(
        self, capture_session: CaptureSession, replay_upstream: ReplayUpstream
    ) -> None:
        patches = choke_points(self.lib, hook_for(self.library))
        originals = [wrapped_original(current(patch)) for patch in patches]
        assert patches and None not in originals
        hooked = self.call(replay_upstream.base_url)
        release_hooks()  # the capture_session fixture's acquire is the only one
        try:
            assert self.library not in installed_hooks()
            assert [current(patch) for patch in patches] == originals
            unhooked = self.call(replay_upstream.base_url)
        finally:
            acquire_hooks()  # what the fixture releases at teardown
        assert unhooked == hooked == self.recorded_reply
        assert len(recorded_lines(capture_session)) == 1

    def test_installing_twice_records_once_and_a_second_hooks_uninstall_keeps_the_first(
        self, capture_session: CaptureSession, replay_upstream: ReplayUpstream
    ) -> None:
        patches = choke_points(self.lib, hook_for(self.library))
        ours = [current(patch) for patch in patches]
        acquire_hooks()  # a second capture needing the hooks installs nothing again
        second = hook_for(self.library)()
        try:
            second.install(self.lib)  # finds every choke point already wrapped by llmtap
            assert [current(patch) for patch in patches] == ours
            self.call(replay_upstream.base_url)
        finally:
            second.uninstall()
            release_hooks()
        assert [current(patch) for patch in patches] == ours
        self.call(replay_upstream.base_url)
        lines = recorded_lines(capture_session)
        assert [line["capture"]["hook"] for line in lines] == [self.hook, self.hook]
        assert replay_upstream.request_count == 2

    def test_the_layers_below_are_hooked_and_stay_silent(
        self, capture_session: CaptureSession, replay_upstream: ReplayUpstream
    ) -> None:
        hooked_below = [layer for layer in self.lower_layers if layer in HOOKED_LIBRARIES]
        for lower in hooked_below:
            importlib.import_module(lower)
        assert {self.library, *hooked_below} <= set(installed_hooks())
        self.call(replay_upstream.base_url)
        assert [line["capture"]["hook"] for line in recorded_lines(capture_session)] == [self.hook]


class StreamedHookSuite(HookSuite):
    """The suite for a style that hands the body out as a stream, plus its early endings.

    `first_piece_end` and `unread_end` are the `capture.end` words a record gets when the caller
    stops after one piece and when it closes without reading (the library's own method name, or
    the tee's "closed"); `stream_break_errors` the names of what the caller may see when the
    server resets the connection mid-body.
    """

    recording: ClassVar[str] = "chat/text-stream-include-usage-gpt4"
    stream_output_tokens: ClassVar[int] = 5  # what the recording's own usage event says
    streamed: ClassVar[bool] = True
    first_piece_end: ClassVar[frozenset[str]]
    unread_end: ClassVar[frozenset[str]]
    stream_break_errors: ClassVar[frozenset[str]]

    @abc.abstractmethod
    def perform_and_stop_after_first_piece(self, url: str, request_json: Any, headers: Mapping[str, str]) -> bytes:
        """Start the call, read one piece of the body, then stop reading and close; return the piece."""

    @abc.abstractmethod
    def perform_and_close_unread(self, url: str, request_json: Any, headers: Mapping[str, str]) -> int:
        """Start the call and close the response without reading its body; return the status."""

    def assert_recorded_whole(self, line: dict[str, Any], session: CaptureSession) -> None:
        super().assert_recorded_whole(line, session)
        usage = line["response"]["usage"]
        assert usage.get("completion_tokens", usage.get("output_tokens")) == self.stream_output_tokens

    def slow_stream_url(self, fault_upstream: FaultUpstream) -> tuple[str, dict[str, str]]:
        """Where the recording streams with a pause between its events, so the rest has not arrived yet.

        aiohttp takes in bytes as they arrive, not as the caller reads: a fast stream would be whole
        (and its record complete) before the caller could stop.
        """
        url = fault_upstream.url("stall-between-0.2") + self.recorded.request_path
        return url, {FAULT_FIXTURE_HEADER: self.recording}

    def test_a_stream_abandoned_after_its_first_piece_is_one_truncated_record(
        self, capture_session: CaptureSession, fault_upstream: FaultUpstream
    ) -> None:
        url, headers = self.slow_stream_url(fault_upstream)
        piece = self.perform_and_stop_after_first_piece(url, self.recorded.request_json, headers)
        assert piece and self.recorded.body_bytes.startswith(piece)
        [line] = recorded_lines(capture_session)
        assert line["capture"]["end"] in self.first_piece_end
        assert line["stream"] is True and line["stream_truncated"] is True
        assert line["error_category"] == "stream_truncated"
        assert line["response_raw"].encode().startswith(piece)
        assert len(line["response_raw"]) < len(self.recorded.body_text)

    def test_a_stream_closed_unread_is_one_record_saying_so(
        self, capture_session: CaptureSession, fault_upstream: FaultUpstream
    ) -> None:
        url, headers = self.slow_stream_url(fault_upstream)
        status = self.perform_and_close_unread(url, self.recorded.request_json, headers)
        assert status == 200
        [line] = recorded_lines(capture_session)
        assert line["capture"]["end"] in self.unread_end
        assert line["status_code"] == 200 and line["stream_truncated"] is True
        assert line["error_category"] == "stream_truncated"

    def test_a_connection_reset_mid_stream_raises_and_is_one_error_record(
        self, capture_session: CaptureSession, fault_upstream: FaultUpstream
    ) -> None:
        with pytest.raises(Exception) as raised:
            self.call(fault_upstream.url("reset-after-2"))
        assert type(raised.value).__name__ in self.stream_break_errors
        [line] = recorded_lines(capture_session)
        assert line["capture"]["hook"] == self.hook and line["capture"]["end"] == "error"
        assert line["error_category"] in ("connection", "stream_truncated")
        assert line["status_code"] == 200 and line["stream"] is True and line["stream_truncated"] is True
