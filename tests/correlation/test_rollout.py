"""The /ng-rollout/ prefix: rollout ids from run bodies, path splitting, context, and agent helpers."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field

import llmtap.correlation.ids
from llmtap.correlation import (
    ROLLOUT_ID_PATTERN,
    ROLLOUT_PREFIX,
    CorrelatedPath,
    base_url_for_run,
    current_rollout_id,
    resolve_model_base_url,
    rollout_context,
    rollout_id_from_run,
    rollout_id_from_run_body,
    rollout_path_prefix,
    run_body_value,
    split_correlation_path,
    split_rollout_prefix,
    url_path_for_request,
    url_path_for_run,
)
from llmtap.correlation.sampling import ModelCallSampling, encode_model_sampling
from llmtap.errors import InvalidRolloutIdError, LlmtapError

GENERATION_PATHS = ["/v1/responses", "/v1/chat/completions", "/v1/messages"]
# Short enough that an attempt suffix still fits the store's length limit.
rollout_ids = st.from_regex(ROLLOUT_ID_PATTERN, fullmatch=True).filter(lambda rid: len(rid) <= 120)
segments = st.one_of(
    st.just("null"),
    st.builds(
        lambda t, m: encode_model_sampling(ModelCallSampling(temperature=t, max_output_tokens=m)),
        st.none() | st.floats(min_value=0, max_value=2, allow_nan=False),
        st.none() | st.integers(min_value=1, max_value=2**53 - 1),
    ),
)
SEGMENT = encode_model_sampling(ModelCallSampling(temperature=1.0, max_output_tokens=128))
SAMPLING_ROW = {"temperature": 1.0, "max_output_tokens": 128}


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    responses_create_params: dict[str, Any] = {}


# --- one id pattern -----------------------------------------------------------------------------


def test_correlation_uses_the_stores_one_id_pattern() -> None:
    assert ROLLOUT_ID_PATTERN is llmtap.correlation.ids.ROLLOUT_ID_PATTERN


def test_invalid_rollout_id_error_is_both_a_value_error_and_an_llmtap_error() -> None:
    with pytest.raises(InvalidRolloutIdError) as raised:
        rollout_id_from_run_body({"_ng_rollout_id": "has space"})
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, LlmtapError)


# --- id derivation (reference acceptance list) --------------------------------------------------


def test_id_is_task_index_dash_rollout_index() -> None:
    assert rollout_id_from_run_body({"_ng_task_index": 3, "_ng_rollout_index": 1}) == "3-1"


@pytest.mark.parametrize("body", [{"_ng_task_index": 3}, {"_ng_rollout_index": 1}, {}, None, {"_ng_attempt_index": 2}])
def test_partial_indices_give_no_id(body: Any) -> None:
    assert rollout_id_from_run_body(body) is None


def test_attempt_above_zero_appends_its_suffix_and_zero_appends_none() -> None:
    base = {"_ng_task_index": 3, "_ng_rollout_index": 1}
    assert rollout_id_from_run_body({**base, "_ng_attempt_index": 1}) == "3-1-a1"
    assert rollout_id_from_run_body({**base, "_ng_attempt_index": "2"}) == "3-1-a2"
    assert rollout_id_from_run_body({**base, "_ng_attempt_index": 0}) == "3-1"
    assert rollout_id_from_run_body({**base, "_ng_attempt_index": None}) == "3-1"


@pytest.mark.parametrize("attempt", ["invalid", "x", "-1", -1, 1.0, True, "", " 2"])
def test_an_attempt_that_is_not_a_non_negative_integer_raises(attempt: Any) -> None:
    with pytest.raises(ValueError, match="_ng_attempt_index"):
        rollout_id_from_run_body({"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_attempt_index": attempt})


def test_explicit_id_wins_and_still_gets_the_attempt_suffix() -> None:
    body = {"_ng_rollout_id": "job-7.task_3", "_ng_task_index": 3, "_ng_rollout_index": 1}
    assert rollout_id_from_run_body(body) == "job-7.task_3"
    assert rollout_id_from_run_body({**body, "_ng_attempt_index": 1}) == "job-7.task_3-a1"


@pytest.mark.parametrize("explicit", [".hidden", "has/slash", "has space", "", 7, "röllout", "../a", "-lead"])
def test_invalid_explicit_ids_raise_rather_than_being_sanitized(explicit: Any) -> None:
    with pytest.raises(InvalidRolloutIdError):
        rollout_id_from_run_body({"_ng_rollout_id": explicit, "_ng_task_index": 3, "_ng_rollout_index": 1})


def test_explicit_none_falls_back_to_derivation() -> None:
    body = {"_ng_rollout_id": None, "_ng_task_index": 3, "_ng_rollout_index": 1}
    assert rollout_id_from_run_body(body) == "3-1"


def test_digit_string_indices_keep_the_callers_digits_as_the_reference_builds_them() -> None:
    assert rollout_id_from_run_body({"_ng_task_index": "01", "_ng_rollout_index": "0"}) == "01-0"
    assert rollout_id_from_run_body({"_ng_task_index": "03", "_ng_rollout_index": 1}) == "03-1"
    assert rollout_id_from_run_body({"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_attempt_index": "02"}) == "3-1-a2"


@pytest.mark.parametrize("index", [True, False, -1, 1.0, "1.0", "x", "", "٣", [1]])
def test_indices_that_are_not_non_negative_integers_raise(index: Any) -> None:
    with pytest.raises(ValueError, match="_ng_task_index"):
        rollout_id_from_run_body({"_ng_task_index": index, "_ng_rollout_index": 1})


def test_ids_are_read_from_a_pydantic_model_and_from_attributes() -> None:
    model = RunRequest.model_validate({"_ng_task_index": 4, "_ng_rollout_index": 2, "_ng_attempt_index": 1})
    assert rollout_id_from_run_body(model) == "4-2-a1"
    assert rollout_id_from_run(SimpleNamespace(_ng_rollout_id="x1")) == "x1"  # type: ignore[arg-type]


@given(rollout_ids)
def test_accepted_explicit_ids_round_trip_through_the_prefix(rollout_id: str) -> None:
    derived = rollout_id_from_run_body({"_ng_rollout_id": rollout_id})
    assert derived == rollout_id
    assert split_rollout_prefix(url_path_for_run("/v1/responses", {"_ng_rollout_id": rollout_id})) == (
        rollout_id,
        "/v1/responses",
    )


# --- splitting ----------------------------------------------------------------------------------


def test_split_returns_the_id_and_the_path_to_route() -> None:
    assert split_rollout_prefix("/ng-rollout/4-2/v1/chat/completions") == ("4-2", "/v1/chat/completions")
    assert split_rollout_prefix("/ng-rollout/4-2") == ("4-2", "/")
    assert split_rollout_prefix("/ng-rollout/4-2?x=1") == ("4-2", "/?x=1")
    assert split_rollout_prefix("/ng-rollout/4-2/v1/responses?x=1") == ("4-2", "/v1/responses?x=1")


@pytest.mark.parametrize("path", ["/v1/responses", "/ng-rollout", "/ng-rollouts/4-2/v1/responses", "/x/ng-rollout/4-2/v1"])
def test_split_leaves_unprefixed_paths_alone(path: str) -> None:
    assert split_rollout_prefix(path) == (None, path)


@pytest.mark.parametrize(
    "path", ["/ng-rollout//v1/responses", "/ng-rollout/", "/ng-rollout/../v1/responses", "/ng-rollout/a b/v1", "/ng-rollout/ü/v1"]
)
def test_split_raises_for_a_prefixed_path_with_an_invalid_id(path: str) -> None:
    with pytest.raises(InvalidRolloutIdError):
        split_rollout_prefix(path)


def test_split_correlation_path_takes_off_both_prefixes() -> None:
    path = f"/ng-rollout/4-2/ng-sampling/{SEGMENT}/v1/messages"
    assert split_correlation_path(path) == CorrelatedPath("4-2", SEGMENT, "/v1/messages")
    assert split_correlation_path("/ng-sampling/null/v1/responses") == CorrelatedPath(None, "null", "/v1/responses")
    assert split_correlation_path("/v1/responses") == CorrelatedPath(None, None, "/v1/responses")
    with pytest.raises(ValueError):
        split_correlation_path("/ng-rollout/4-2/ng-sampling/e31/v1/messages")


@given(st.none() | rollout_ids, st.none() | segments, st.sampled_from([*GENERATION_PATHS, "/verify", "/"]))
def test_built_prefix_splits_back_into_its_parts(rollout_id: str | None, segment: str | None, rest: str) -> None:
    built = rollout_path_prefix(rollout_id, segment) + rest
    assert split_correlation_path(built) == CorrelatedPath(rollout_id, segment, rest)


def test_rollout_path_prefix_validates_the_id_and_the_segment() -> None:
    assert rollout_path_prefix(None) == ""
    assert rollout_path_prefix("4-2") == "/ng-rollout/4-2"
    assert rollout_path_prefix("4-2", "null") == "/ng-rollout/4-2/ng-sampling/null"
    with pytest.raises(InvalidRolloutIdError):
        rollout_path_prefix("a/b")
    with pytest.raises(ValueError):
        rollout_path_prefix("4-2", "not base64!")


# --- context ------------------------------------------------------------------------------------


def test_rollout_context_sets_the_current_id_inside_the_block_only() -> None:
    assert current_rollout_id() is None
    with rollout_context("4-2"):
        assert current_rollout_id() == "4-2"
        with rollout_context(None):
            assert current_rollout_id() is None
        assert current_rollout_id() == "4-2"
    assert current_rollout_id() is None


def test_rollout_context_refuses_an_invalid_id_before_entering() -> None:
    with pytest.raises(InvalidRolloutIdError):
        with rollout_context("../escape"):
            pytest.fail("the block must not run")
    assert current_rollout_id() is None


def test_rollout_context_is_separate_for_concurrent_tasks() -> None:
    async def run(rollout_id: str) -> str | None:
        with rollout_context(rollout_id):
            await asyncio.sleep(0)
            return current_rollout_id()

    async def main() -> list[str | None]:
        return list(await asyncio.gather(run("0-0"), run("0-1")))

    assert asyncio.run(main()) == ["0-0", "0-1"]


# --- url_path_for_run ---------------------------------------------------------------------------


def test_path_for_run_adds_the_prefix_and_without_an_id_changes_nothing() -> None:
    assert url_path_for_run("/v1/responses", {"_ng_task_index": 4, "_ng_rollout_index": 2}) == "/ng-rollout/4-2/v1/responses"
    assert url_path_for_run("/v1/responses", {"_ng_task_index": 4}) == "/v1/responses"
    assert url_path_for_run("v1/responses", {"_ng_rollout_id": "r1"}) == "/ng-rollout/r1/v1/responses"


def test_path_for_run_adds_the_sampling_segment_after_the_prefix_on_generation_paths() -> None:
    body = {"_ng_rollout_id": "r1", "_ng_model_sampling": SAMPLING_ROW}
    assert url_path_for_run("/v1/chat/completions", body) == f"/ng-rollout/r1/ng-sampling/{SEGMENT}/v1/chat/completions"
    assert url_path_for_run("/verify", body) == "/ng-rollout/r1/verify"
    assert url_path_for_run("/v1/messages", {"_ng_model_sampling": SAMPLING_ROW}) == f"/ng-sampling/{SEGMENT}/v1/messages"


def test_path_for_run_never_prefixes_twice() -> None:
    body = {"_ng_rollout_id": "r2", "_ng_model_sampling": SAMPLING_ROW}
    for path in ["/ng-rollout/r1/v1/responses", "/ng-sampling/null/v1/responses"]:
        assert url_path_for_run(path, body) == path


def test_path_for_run_refuses_invalid_sampling_values() -> None:
    with pytest.raises(ValueError, match="_ng_model_sampling"):
        url_path_for_run("/v1/responses", {"_ng_rollout_id": "r1", "_ng_model_sampling": {"temperature": True}})


# --- url_path_for_request -----------------------------------------------------------------------


def test_path_for_request_carries_an_inbound_prefix_from_a_path_string() -> None:
    assert url_path_for_request("/v1/responses", "/ng-rollout/4-2/v1/responses") == "/ng-rollout/4-2/v1/responses"
    inbound = f"/ng-rollout/4-2/ng-sampling/{SEGMENT}/v1/responses"
    assert url_path_for_request("/v1/chat/completions", inbound) == f"/ng-rollout/4-2/ng-sampling/{SEGMENT}/v1/chat/completions"


def test_path_for_request_without_an_inbound_prefix_changes_nothing() -> None:
    assert url_path_for_request("/v1/responses", None) == "/v1/responses"
    assert url_path_for_request("/v1/responses", "/v1/responses") == "/v1/responses"
    assert url_path_for_request("/v1/responses", SimpleNamespace()) == "/v1/responses"


def test_path_for_request_reads_route_params_url_path_and_scope() -> None:
    by_param = SimpleNamespace(path_params={"rollout_id": "4-2"}, url=SimpleNamespace(path="/x"))
    assert url_path_for_request("/v1/responses", by_param) == "/ng-rollout/4-2/v1/responses"
    by_url = SimpleNamespace(url=SimpleNamespace(path="/ng-rollout/4-3/v1/responses"))
    assert url_path_for_request("/v1/responses", by_url) == "/ng-rollout/4-3/v1/responses"
    by_scope = SimpleNamespace(scope={"path": "/v1/responses", "raw_path": b"/ng-rollout/4-4/v1/responses"})
    assert url_path_for_request("/v1/responses", by_scope) == "/ng-rollout/4-4/v1/responses"


def test_path_for_request_carries_a_sampling_header_and_refuses_one_that_differs() -> None:
    with_header = SimpleNamespace(url=SimpleNamespace(path="/ng-rollout/4-2/v1/responses"), headers={"x-ng-sampling": "null"})
    assert url_path_for_request("/v1/responses", with_header) == "/ng-rollout/4-2/ng-sampling/null/v1/responses"
    conflicting = SimpleNamespace(
        url=SimpleNamespace(path=f"/ng-rollout/4-2/ng-sampling/{SEGMENT}/v1/responses"), headers={"x-ng-sampling": "null"}
    )
    with pytest.raises(ValueError, match="different values"):
        url_path_for_request("/v1/responses", conflicting)


def test_path_for_request_raises_for_an_invalid_inbound_id() -> None:
    with pytest.raises(InvalidRolloutIdError):
        url_path_for_request("/v1/responses", "/ng-rollout/a%2Fb/v1/responses")
    with pytest.raises(InvalidRolloutIdError):
        url_path_for_request("/v1/responses", SimpleNamespace(path_params={"rollout_id": "a b"}))


def test_path_for_request_reads_a_real_starlette_request() -> None:
    requests = pytest.importorskip("starlette.requests")
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/ng-rollout/7-0/ng-sampling/null/v1/responses",
        "raw_path": b"/ng-rollout/7-0/ng-sampling/null/v1/responses",
        "query_string": b"",
        "headers": [(b"host", b"agent:8000")],
        "scheme": "http",
        "server": ("agent", 8000),
    }
    request = requests.Request(scope)
    assert url_path_for_request("/v1/responses", request) == "/ng-rollout/7-0/ng-sampling/null/v1/responses"


# --- base URLs ----------------------------------------------------------------------------------


def test_base_url_for_run_strips_the_trailing_slash_and_appends_the_prefix() -> None:
    body = {"_ng_task_index": 4, "_ng_rollout_index": 2, "_ng_attempt_index": 1}
    assert base_url_for_run("http://model:8000/", body) == "http://model:8000/ng-rollout/4-2-a1"
    assert base_url_for_run("http://model:8000", {**body, "_ng_model_sampling": SAMPLING_ROW}) == (
        f"http://model:8000/ng-rollout/4-2-a1/ng-sampling/{SEGMENT}"
    )


def test_base_url_for_run_returns_the_base_url_exactly_without_an_id_or_values() -> None:
    assert base_url_for_run("http://model:8000/", {}) == "http://model:8000/"
    assert base_url_for_run("http://model:8000/", None) == "http://model:8000/"
    assert base_url_for_run("http://model:8000/", {"_ng_model_sampling": SAMPLING_ROW}) == (
        f"http://model:8000/ng-sampling/{SEGMENT}"
    )


def test_resolve_model_base_url_builds_prefix_then_v1() -> None:
    assert resolve_model_base_url("http://127.0.0.1:8000", "3-1") == "http://127.0.0.1:8000/ng-rollout/3-1/v1"
    assert resolve_model_base_url("127.0.0.1:8000", "3-1") == "http://127.0.0.1:8000/ng-rollout/3-1/v1"
    assert resolve_model_base_url("http://h:1/v1/", "3-1") == "http://h:1/ng-rollout/3-1/v1"
    assert resolve_model_base_url("http://h:1") == "http://h:1/v1"
    assert resolve_model_base_url("http://h:1", "3-1", sampling_segment="null") == "http://h:1/ng-rollout/3-1/ng-sampling/null/v1"
    assert resolve_model_base_url("https://gw.example/models/", None, sampling_segment=SEGMENT) == (
        f"https://gw.example/models/ng-sampling/{SEGMENT}/v1"
    )


@pytest.mark.parametrize("name", ["policy_model", "", "host:", ":80", "host:port", "a/b:1"])
def test_resolve_model_base_url_refuses_what_is_neither_url_nor_host_port(name: str) -> None:
    with pytest.raises(ValueError, match="neither a URL nor host:port"):
        resolve_model_base_url(name, "3-1")


def test_resolve_model_base_url_refuses_a_bad_id_or_segment() -> None:
    with pytest.raises(InvalidRolloutIdError):
        resolve_model_base_url("http://h:1", "bad id")
    with pytest.raises(ValueError):
        resolve_model_base_url("http://h:1", "3-1", sampling_segment="e31")


def test_prefix_constant_is_the_fixed_wire_name() -> None:
    assert ROLLOUT_PREFIX == "/ng-rollout/"


def test_an_attempt_suffix_that_pushes_an_id_past_the_store_limit_raises() -> None:
    long_id = "r" * llmtap.correlation.ids.MAX_ROLLOUT_ID_LENGTH
    assert rollout_id_from_run_body({"_ng_rollout_id": long_id}) == long_id
    with pytest.raises(InvalidRolloutIdError):
        rollout_id_from_run_body({"_ng_rollout_id": long_id, "_ng_attempt_index": 1})


# --- ids the reference system builds (issue 17 item 6) ------------------------------------------

# The reference system's rules, written from its behaviour (a model, not its code): its store files
# any non-empty id of ASCII letters, digits, '.', '_' and '-'; an explicit `_ng_rollout_id` must
# also start with a letter or digit, checked with `re.match`, so a trailing newline passes there.
_REFERENCE_ID_CHARACTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_FILE_NAME_BYTES = 255


def reference_store_accepts(rollout_id: str) -> bool:
    return bool(rollout_id) and all(char in _REFERENCE_ID_CHARACTERS for char in rollout_id)


def reference_explicit_accepts(rollout_id: str) -> bool:
    import re

    return re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", rollout_id) is not None


def llmtap_accepts(check: Any, rollout_id: str) -> bool:
    try:
        check(rollout_id)
    except InvalidRolloutIdError:
        return False
    return True


# Mostly id characters, with the ones that must be refused mixed in, and lengths around the bound.
id_texts = st.text(alphabet=st.sampled_from(sorted(_REFERENCE_ID_CHARACTERS) + ["/", " ", "%", "ü", "\n", "٣", "\x00"]))
long_ids = st.builds(lambda char, n, rest: char * n + rest, st.sampled_from("a.-_9"), st.integers(190, 245), id_texts)


@given(id_texts | long_ids)
def test_a_capture_point_files_every_id_the_reference_store_files_that_is_safe_as_a_file_name(rollout_id: str) -> None:
    from llmtap.correlation.ids import MAX_ROLLOUT_ID_LENGTH, validate_rollout_id

    expected = (
        reference_store_accepts(rollout_id)
        and len(rollout_id) <= MAX_ROLLOUT_ID_LENGTH
        and rollout_id not in (".", "..")  # dot segments: a URL drops them
    )
    assert llmtap_accepts(validate_rollout_id, rollout_id) == expected


@given(id_texts | long_ids)
def test_an_explicit_id_is_accepted_exactly_where_the_reference_accepts_it_and_it_can_be_filed(rollout_id: str) -> None:
    from llmtap.correlation.ids import MAX_ROLLOUT_ID_LENGTH

    expected = (
        reference_explicit_accepts(rollout_id)
        and not rollout_id.endswith("\n")  # `re.match` with `$` lets one through; no file name may hold it
        and len(rollout_id) <= MAX_ROLLOUT_ID_LENGTH
    )
    assert llmtap_accepts(lambda rid: rollout_id_from_run_body({"_ng_rollout_id": rid}), rollout_id) == expected


@given(id_texts | long_ids)
def test_a_file_stem_is_reversible_never_hidden_and_every_name_fits(rollout_id: str) -> None:
    from llmtap.correlation.ids import rollout_file_stem, rollout_id_from_file_stem, validate_rollout_id

    if not llmtap_accepts(validate_rollout_id, rollout_id):
        return
    stem = rollout_file_stem(rollout_id)
    assert rollout_id_from_file_stem(stem) == rollout_id
    assert not stem.startswith(".") and "/" not in stem and stem not in (".", "..")
    # The longest name the store makes: the marker's temporary file, with a 7-digit pid.
    assert len(f".{stem}.capture.incomplete.4194303.{'f' * 8}.tmp".encode()) <= _FILE_NAME_BYTES


@pytest.mark.parametrize("stem", [".hidden", "a%2Eb", "%2E", "%2E.", "", "a" * 215, "a b", "%2E%2Ex"])
def test_a_name_no_valid_id_has_is_never_read_back_as_an_id(stem: str) -> None:
    from llmtap.correlation.ids import rollout_id_from_file_stem

    assert rollout_id_from_file_stem(stem) is None


def test_ids_the_reference_files_are_stored_whole_even_at_the_bound_with_the_largest_pid(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from llmtap.correlation.ids import MAX_ROLLOUT_ID_LENGTH
    from llmtap.store import CaptureStore

    monkeypatch.setattr(os, "getpid", lambda: 4194303)  # Linux's largest pid: the longest temporary names
    longest, dotted = "r" * MAX_ROLLOUT_ID_LENGTH, "." + "d" * (MAX_ROLLOUT_ID_LENGTH - 1)
    with CaptureStore(tmp_path) as store:
        for rollout_id in (longest, dotted, "..."):
            store.append(rollout_id, {"model_call_id": "m1", "started_at": 1.0})
            store.mark_incomplete(rollout_id, "test")
            assert store.read(rollout_id).incomplete
            store.clear(rollout_id)
            store.append(rollout_id, {"model_call_id": "m2", "started_at": 2e9})
            assert [record["model_call_id"] for _, record in store.read(rollout_id).entries] == ["m2"]
        assert store.rollouts() == sorted([longest, dotted, "..."])
    names = os.listdir(tmp_path)
    assert not any(name.startswith(".") for name in names)
    assert f"%2E{'d' * (MAX_ROLLOUT_ID_LENGTH - 1)}.capture.jsonl" in names


class ReferenceRunRequest(BaseModel):
    """The shape of the reference system's run request: the explicit id in a field under its alias."""

    model_config = ConfigDict(populate_by_name=True)
    responses_create_params: dict[str, Any] = {}
    capture_rollout_id: Any = Field(default=None, alias="_ng_rollout_id", exclude=True)


def test_an_explicit_id_is_read_from_a_pydantic_field_under_its_alias() -> None:
    by_alias = ReferenceRunRequest.model_validate({"_ng_rollout_id": "job-7"})
    by_name = ReferenceRunRequest(capture_rollout_id="job-8")
    assert rollout_id_from_run_body(by_alias) == "job-7"
    assert rollout_id_from_run_body(by_name) == "job-8"
    assert url_path_for_run("/v1/responses", by_alias) == "/ng-rollout/job-7/v1/responses"
    assert rollout_id_from_run_body(ReferenceRunRequest()) is None
    with pytest.raises(InvalidRolloutIdError):
        rollout_id_from_run_body(ReferenceRunRequest.model_validate({"_ng_rollout_id": ".hidden"}))


def test_a_validation_alias_and_alias_choices_are_read_too() -> None:
    from pydantic import AliasChoices

    class Row(BaseModel):
        rollout: Any = Field(default=None, validation_alias=AliasChoices("_ng_rollout_id", "rid"))
        task: Any = Field(default=None, validation_alias="_ng_task_index")

    assert rollout_id_from_run_body(Row.model_validate({"rid": "r-1"})) == "r-1"
    assert rollout_id_from_run_body(Row.model_validate({"_ng_rollout_id": "r-2"})) == "r-2"
    row = Row.model_validate({"_ng_task_index": "07"})
    assert run_body_value(row, "_ng_task_index") == "07"


def test_reading_a_plain_mapping_imports_no_pydantic() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from llmtap.correlation.run_body import run_body_value; "
        "assert run_body_value({'_ng_rollout_id': 'x'}, '_ng_rollout_id') == 'x'; "
        "print('pydantic' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


# --- the training token-capture segment (issue 17 item 7) -----------------------------------------


def test_helpers_put_the_training_segment_after_the_id_and_before_the_sampling_segment() -> None:
    body = {"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_model_sampling": SAMPLING_ROW}
    expected = f"/ng-rollout/3-1/training-token-capture/ng-sampling/{SEGMENT}/v1/responses"
    assert url_path_for_run("/v1/responses", body, token_capture=True) == expected
    assert base_url_for_run("http://h:1/", body, token_capture=True) == expected.removesuffix("/v1/responses").join(
        ["http://h:1", ""]
    )
    assert resolve_model_base_url("h:1", "3-1", token_capture=True) == "http://h:1/ng-rollout/3-1/training-token-capture/v1"
    assert rollout_path_prefix(None, token_capture=True) == ""  # no rollout, no token capture
    assert split_correlation_path(expected) == CorrelatedPath("3-1", SEGMENT, "/v1/responses", True)


def test_an_inbound_training_segment_is_carried_downstream() -> None:
    inbound = SimpleNamespace(
        path_params={"rollout_id": "4-2"}, url=SimpleNamespace(path="/ng-rollout/4-2/training-token-capture/v1/responses")
    )
    assert url_path_for_request("/v1/chat/completions", inbound) == "/ng-rollout/4-2/training-token-capture/v1/chat/completions"
    assert url_path_for_request("/v1/chat/completions", "/ng-rollout/4-2/v1/responses") == "/ng-rollout/4-2/v1/chat/completions"


@pytest.mark.parametrize(
    ("rest", "split"),
    [
        ("/training-token-capture/v1/responses", (True, "/v1/responses")),
        ("/training-token-capture", (True, "/")),
        ("/training-token-capture?x=1", (True, "/?x=1")),
        ("/training-token-captured/v1", (False, "/training-token-captured/v1")),
        ("/v1/responses", (False, "/v1/responses")),
    ],
)
def test_the_segment_is_split_only_as_a_whole_segment(rest: str, split: tuple[bool, str]) -> None:
    from llmtap.correlation import split_token_capture_segment

    assert split_token_capture_segment(rest) == split


@given(rollout_ids, st.booleans(), st.sampled_from(GENERATION_PATHS), st.none() | segments)
def test_every_built_path_splits_back_into_what_built_it(rollout_id: str, token_capture: bool, path: str, segment: Any) -> None:
    from llmtap.correlation.sampling import with_model_sampling_segment

    built = with_model_sampling_segment(f"{rollout_path_prefix(rollout_id, token_capture=token_capture)}{path}", segment)
    assert split_correlation_path(built) == CorrelatedPath(rollout_id, segment, path, token_capture)
