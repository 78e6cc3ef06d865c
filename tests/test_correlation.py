"""The /ng-rollout/ prefix: rollout ids from run bodies, path splitting, context, and agent helpers."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

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


def test_digit_string_indices_are_coerced_so_the_same_row_gives_the_same_id() -> None:
    assert rollout_id_from_run_body({"_ng_task_index": "03", "_ng_rollout_index": "1"}) == "3-1"


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
    "path", ["/ng-rollout//v1/responses", "/ng-rollout/", "/ng-rollout/.hidden/v1/responses", "/ng-rollout/a b/v1", "/ng-rollout/ü/v1"]
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
        url_path_for_request("/v1/responses", "/ng-rollout/.x/v1/responses")
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
