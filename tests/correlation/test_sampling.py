"""The /ng-sampling/ segment: encoding, strict decoding, path handling, config, and request rewriting."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, ValidationError

from llmtap.correlation.sampling import (
    MODEL_SAMPLING_HEADER,
    MODEL_SAMPLING_NULL,
    ModelCallSampling,
    ModelCallSamplingConfig,
    apply_model_sampling,
    current_model_sampling_segment,
    decode_model_sampling,
    encode_model_sampling,
    model_call_sampling_config,
    model_sampling_context,
    model_sampling_from_run_body,
    model_sampling_path_segment,
    resolve_sampling_segment,
    split_sampling_segment,
    with_model_sampling_segment,
)
from llmtap.dialects import get_dialect
from tests.fixtures import all_fixtures

MAX_SAFE = 2**53 - 1
GENERATION_PATHS = ["/v1/responses", "/v1/chat/completions", "/v1/messages"]


def b64(raw: str | bytes) -> str:
    """Encode arbitrary text the way a (possibly wrong) sender would: unpadded base64url."""
    data = raw.encode("utf-8") if isinstance(raw, str) else raw
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64(segment: str) -> str:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)).decode("utf-8")


samplings = st.builds(
    ModelCallSampling,
    temperature=st.none() | st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False),
    top_p=st.none() | st.floats(min_value=0, max_value=1, exclude_min=True, allow_nan=False),
    max_output_tokens=st.none() | st.integers(min_value=1, max_value=MAX_SAFE),
)


# --- ModelCallSampling -----------------------------------------------------------------------


def test_sampling_values_accept_greedy_temperature_and_the_largest_safe_integer() -> None:
    sampling = ModelCallSampling(temperature=0.0, top_p=1.0, max_output_tokens=MAX_SAFE)
    assert (sampling.temperature, sampling.top_p, sampling.max_output_tokens) == (0.0, 1.0, MAX_SAFE)


@pytest.mark.parametrize(
    "values",
    [
        {"temperature": True},
        {"top_p": False},
        {"max_output_tokens": True},
        {"max_output_tokens": 0},
        {"max_output_tokens": -5},
        {"max_output_tokens": MAX_SAFE + 1},
        {"max_output_tokens": 5.0},
        {"temperature": -0.1},
        {"temperature": float("nan")},
        {"temperature": float("inf")},
        {"top_p": 0},
        {"top_p": 1.5},
        {"temperature": "0.5"},
        {"seed": 1},
    ],
)
def test_sampling_values_refuse_bools_strings_out_of_range_and_unknown_fields(values: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ModelCallSampling.model_validate(values)


# --- encode / decode ----------------------------------------------------------------------------


def test_encode_none_gives_null_and_null_decodes_to_none() -> None:
    assert encode_model_sampling(None) == MODEL_SAMPLING_NULL == "null"
    assert decode_model_sampling("null") is None


def test_encode_writes_compact_sorted_json_without_unset_fields() -> None:
    sampling = ModelCallSampling(top_p=0.9, max_output_tokens=64)
    text = unb64(encode_model_sampling(sampling))
    assert text == json.dumps({"max_output_tokens": 64, "top_p": 0.9}, separators=(",", ":"), sort_keys=True)
    assert "temperature" not in text


def test_encode_of_no_values_is_an_empty_object_not_null() -> None:
    segment = encode_model_sampling(ModelCallSampling())
    assert unb64(segment) == "{}"
    assert decode_model_sampling(segment) == ModelCallSampling()


@given(samplings)
def test_encoded_values_decode_to_the_same_values(sampling: ModelCallSampling) -> None:
    segment = encode_model_sampling(sampling)
    assert "=" not in segment and len(segment) <= 1024
    assert all(c.isascii() and (c.isalnum() or c in "-_") for c in segment)
    assert decode_model_sampling(segment) == sampling


@given(samplings, samplings)
def test_equal_values_encode_to_equal_text_and_different_values_to_different_text(
    first: ModelCallSampling, second: ModelCallSampling
) -> None:
    assert (encode_model_sampling(first) == encode_model_sampling(second)) == (first == second)


def test_decode_accepts_non_compact_json_from_another_encoder() -> None:
    segment = b64('{ "temperature" : 0.7 ,\n "max_output_tokens": 12 }')
    assert decode_model_sampling(segment) == ModelCallSampling(temperature=0.7, max_output_tokens=12)


@pytest.mark.parametrize(
    ("segment", "message_part"),
    [
        ("", "base64url"),
        (b64('{"temperature":1}') + "=", "base64url"),
        ("eyJ0ZW1w+ZXJ", "base64url"),
        ("eyJ0ZW1w/ZXJ", "base64url"),
        ("e30 ", "base64url"),
        ("é30", "base64url"),
        ("a", "base64 length"),
        ("e31", "canonical"),
        ("A" * 1025, "over the limit"),
        (b64(b"\xff\xfe{}"), "UTF-8"),
        (b64("{"), "JSON"),
        (b64("[1, 2]"), "list"),
        (b64('"temperature"'), "str"),
        (b64("1"), "int"),
        (b64("null"), "NoneType"),
        (b64('{"temperature":1,"temperature":2}'), "repeats the key 'temperature'"),
        (b64('{"seed":1}'), "seed"),
        (b64('{"temperature":true}'), "temperature"),
        (b64('{"top_p":"0.5"}'), "top_p"),
        (b64('{"temperature":NaN}'), "NaN"),
        (b64('{"temperature":-Infinity}'), "-Infinity"),
        (b64('{"temperature":1e400}'), "temperature"),
        (b64('{"max_output_tokens":0}'), "max_output_tokens"),
        (b64('{"max_output_tokens":9007199254740992}'), "max_output_tokens"),
        (b64('{"max_output_tokens":5.0}'), "max_output_tokens"),
        (b64('{"top_p":0}'), "top_p"),
    ],
)
def test_decode_refuses_malformed_or_ambiguous_segments_with_a_clear_message(segment: str, message_part: str) -> None:
    with pytest.raises(ValueError) as raised:
        decode_model_sampling(segment)
    message = str(raised.value)
    assert message_part in message
    assert message.endswith(".") and "\n" not in message


def test_decode_refuses_a_non_string() -> None:
    with pytest.raises(ValueError, match="not a string"):
        decode_model_sampling(123)  # type: ignore[arg-type]


@given(st.text(max_size=60))
def test_decode_of_arbitrary_text_returns_values_or_raises_value_error_only(text: str) -> None:
    try:
        result = decode_model_sampling(text)
    except ValueError:
        return
    assert result is None or isinstance(result, ModelCallSampling)
    # Whatever decodes is a value the encoder writes back as text that decodes to it again.
    assert decode_model_sampling(encode_model_sampling(result)) == result


@given(st.binary(max_size=48))
def test_decode_of_arbitrary_bytes_returns_values_or_raises_value_error_only(data: bytes) -> None:
    try:
        result = decode_model_sampling(b64(data))
    except ValueError:
        return
    assert isinstance(result, ModelCallSampling)
    assert decode_model_sampling(encode_model_sampling(result)) == result


# --- run bodies ---------------------------------------------------------------------------------


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    responses_create_params: dict[str, Any] = {}


def test_run_body_values_are_read_from_a_mapping_a_model_or_an_instance() -> None:
    expected = ModelCallSampling(temperature=1.0, max_output_tokens=32)
    assert model_sampling_from_run_body({"_ng_model_sampling": {"temperature": 1.0, "max_output_tokens": 32}}) == expected
    model = RunRequest.model_validate({"_ng_model_sampling": {"temperature": 1.0, "max_output_tokens": 32}})
    assert model_sampling_from_run_body(model) == expected
    assert model_sampling_from_run_body({"_ng_model_sampling": expected}) is expected


@pytest.mark.parametrize("body", [None, {}, {"_ng_model_sampling": None}, RunRequest()])
def test_run_body_without_values_gives_none(body: Any) -> None:
    assert model_sampling_from_run_body(body) is None


@pytest.mark.parametrize(
    "value", [{"temperature": True}, {"seed": 3}, {"max_output_tokens": 0}, "eyJ9", [0.5], 0.7]
)
def test_run_body_with_invalid_values_raises_value_error(value: Any) -> None:
    with pytest.raises(ValueError, match="_ng_model_sampling"):
        model_sampling_from_run_body({"_ng_model_sampling": value})


# --- paths --------------------------------------------------------------------------------------


def test_path_segment_is_empty_for_none_and_validated_otherwise() -> None:
    segment = encode_model_sampling(ModelCallSampling(temperature=0.2))
    assert model_sampling_path_segment(None) == ""
    assert model_sampling_path_segment("null") == "/ng-sampling/null"
    assert model_sampling_path_segment(segment) == f"/ng-sampling/{segment}"
    with pytest.raises(ValueError):
        model_sampling_path_segment("not valid!")


@pytest.mark.parametrize("path", GENERATION_PATHS)
def test_segment_goes_in_front_of_a_generation_path_and_after_a_rollout_prefix(path: str) -> None:
    assert with_model_sampling_segment(path, "null") == f"/ng-sampling/null{path}"
    assert with_model_sampling_segment(f"/ng-rollout/4-2{path}", "null") == f"/ng-rollout/4-2/ng-sampling/null{path}"


@pytest.mark.parametrize(
    "path",
    [
        "/verify",
        "/v1/models",
        "/v1/responses/extra",
        "/ng-rollout/4-2/verify",
        "/ng-sampling/null/v1/responses",
        "/ng-rollout/4-2/ng-sampling/null/v1/responses",
        "/ng-rollout//v1/responses",
        "/ng-rollout/../v1/responses",
        "/ng-rollout/a b/v1/chat/completions",
        "/ng-rollout/4-2",
    ],
)
def test_segment_leaves_other_paths_already_segmented_paths_and_malformed_prefixes_unchanged(path: str) -> None:
    assert with_model_sampling_segment(path, "null") == path


def test_segment_keeps_a_query_string_at_the_end_and_none_changes_nothing() -> None:
    assert with_model_sampling_segment("/v1/responses?x=1", "null") == "/ng-sampling/null/v1/responses?x=1"
    assert with_model_sampling_segment("/v1/responses", None) == "/v1/responses"


def test_split_takes_a_leading_segment_off_and_returns_the_rest() -> None:
    segment = encode_model_sampling(ModelCallSampling(top_p=0.5))
    assert split_sampling_segment(f"/ng-sampling/{segment}/v1/chat/completions") == (segment, "/v1/chat/completions")
    assert split_sampling_segment("/ng-sampling/null/v1/messages?beta=true") == ("null", "/v1/messages?beta=true")
    assert split_sampling_segment("/ng-sampling/null") == ("null", "/")
    assert split_sampling_segment("/v1/responses") == (None, "/v1/responses")
    assert split_sampling_segment("/ng-samplingnull/v1/responses") == (None, "/ng-samplingnull/v1/responses")


@pytest.mark.parametrize("path", ["/ng-sampling//v1/responses", "/ng-sampling/e31/v1/responses", "/ng-sampling/x=/v1"])
def test_split_refuses_an_empty_or_malformed_segment(path: str) -> None:
    with pytest.raises(ValueError):
        split_sampling_segment(path)


@given(st.one_of(st.just(None), samplings), st.sampled_from([*GENERATION_PATHS, "/verify"]))
def test_inserted_segment_splits_back_off(sampling: ModelCallSampling | None, path: str) -> None:
    segment = encode_model_sampling(sampling)
    built = with_model_sampling_segment(path, segment)
    expected = (segment, path) if path in GENERATION_PATHS else (None, path)
    assert split_sampling_segment(built) == expected


# --- header and path together -------------------------------------------------------------------


def test_header_name_is_the_fixed_wire_name() -> None:
    assert MODEL_SAMPLING_HEADER == "x-ng-sampling"


def test_resolve_takes_the_segment_from_path_or_header() -> None:
    segment = encode_model_sampling(ModelCallSampling(temperature=0.3))
    assert resolve_sampling_segment(None, None) is None
    assert resolve_sampling_segment(segment, None) == segment
    assert resolve_sampling_segment(None, segment) == segment
    assert resolve_sampling_segment(segment, segment) == segment
    assert resolve_sampling_segment("null", "null") == "null"


def test_resolve_accepts_path_and_header_that_encode_equal_values_differently() -> None:
    header = b64('{"temperature": 0.3}')
    segment = encode_model_sampling(ModelCallSampling(temperature=0.3))
    assert resolve_sampling_segment(segment, header) == segment


@pytest.mark.parametrize(
    ("path_segment", "header"),
    [
        ("null", encode_model_sampling(ModelCallSampling(temperature=0.3))),
        (encode_model_sampling(ModelCallSampling(temperature=0.3)), encode_model_sampling(ModelCallSampling(temperature=0.4))),
        (encode_model_sampling(ModelCallSampling(temperature=0.3)), "null"),
    ],
)
def test_resolve_refuses_path_and_header_that_differ(path_segment: str, header: str) -> None:
    with pytest.raises(ValueError, match="different values"):
        resolve_sampling_segment(path_segment, header)


def test_resolve_refuses_a_malformed_header() -> None:
    with pytest.raises(ValueError):
        resolve_sampling_segment(None, "e31")


# --- context ------------------------------------------------------------------------------------


def test_context_sets_the_segment_inside_the_block_only() -> None:
    assert current_model_sampling_segment() is None
    with model_sampling_context("null"):
        assert current_model_sampling_segment() == "null"
        with model_sampling_context(None):
            assert current_model_sampling_segment() is None
        assert current_model_sampling_segment() == "null"
    assert current_model_sampling_segment() is None


def test_context_refuses_a_malformed_segment_before_entering() -> None:
    with pytest.raises(ValueError):
        with model_sampling_context("bad segment"):
            pytest.fail("the block must not run")
    assert current_model_sampling_segment() is None


def test_context_is_separate_for_concurrent_tasks() -> None:
    segments = {name: encode_model_sampling(ModelCallSampling(temperature=t)) for name, t in (("a", 0.1), ("b", 0.9))}

    async def call(name: str) -> str | None:
        with model_sampling_context(segments[name]):
            await asyncio.sleep(0)
            return current_model_sampling_segment()

    async def main() -> list[str | None]:
        return list(await asyncio.gather(call("a"), call("b")))

    assert asyncio.run(main()) == [segments["a"], segments["b"]]


# --- config -------------------------------------------------------------------------------------


GLOBAL_CONFIG: dict[str, Any] = {
    "policy_model": {"responses_api_models": {"vllm_model": {"entrypoint": "app.py"}}},
    "judge_model": {"responses_api_models": {"openai_model": {"entrypoint": "app.py"}}},
    "mcqa": {"resources_servers": {"mcqa": {}}},
}


def test_config_is_none_when_the_run_sets_no_block() -> None:
    assert model_call_sampling_config(None) is None
    assert model_call_sampling_config(GLOBAL_CONFIG) is None
    assert model_call_sampling_config({**GLOBAL_CONFIG, "model_call_sampling": None}) is None


def test_config_accepts_required_servers_that_are_model_servers_of_the_run() -> None:
    config = model_call_sampling_config({**GLOBAL_CONFIG, "model_call_sampling": {"required_model_servers": ["policy_model"]}})
    assert config == ModelCallSamplingConfig(required_model_servers=["policy_model"])
    empty = model_call_sampling_config({"model_call_sampling": {}})
    assert empty == ModelCallSamplingConfig()


def test_config_names_a_misspelled_required_server() -> None:
    block = {"model_call_sampling": {"required_model_servers": ["policy_modle"]}}
    with pytest.raises(ValueError, match="'policy_modle'"):
        model_call_sampling_config({**GLOBAL_CONFIG, **block})


def test_config_refuses_a_resources_server_as_a_required_model_server() -> None:
    block = {"model_call_sampling": {"required_model_servers": ["mcqa"]}}
    with pytest.raises(ValueError, match="'mcqa'"):
        model_call_sampling_config({**GLOBAL_CONFIG, **block})


def test_config_checks_against_explicit_model_server_names() -> None:
    config_dict = {"model_call_sampling": {"required_model_servers": ["policy"]}}
    config = model_call_sampling_config(config_dict, model_server_names=["policy", "judge"])
    assert config == ModelCallSamplingConfig(required_model_servers=["policy"])
    with pytest.raises(ValueError, match="'policy'"):
        model_call_sampling_config(config_dict, model_server_names=["judge"])


@pytest.mark.parametrize(
    "block",
    [["policy_model"], "policy_model", {"required_model_servers": "policy_model"}, {"required_model_servers": [1]}, {"extra": 1}],
)
def test_config_refuses_a_malformed_block(block: Any) -> None:
    with pytest.raises(ValueError, match="model_call_sampling"):
        model_call_sampling_config({**GLOBAL_CONFIG, "model_call_sampling": block})


# --- apply_model_sampling -----------------------------------------------------------------------


def test_limit_is_the_smaller_of_the_sent_limit_and_the_values() -> None:
    cap = ModelCallSampling(max_output_tokens=100)
    assert apply_model_sampling({"max_output_tokens": 500}, "responses", cap, None)["max_output_tokens"] == 100
    assert apply_model_sampling({"max_output_tokens": 20}, "responses", cap, None)["max_output_tokens"] == 20
    assert apply_model_sampling({}, "responses", cap, None)["max_output_tokens"] == 100
    assert apply_model_sampling({"max_tokens": 500}, "messages", cap, None)["max_tokens"] == 100


@given(st.integers(min_value=1, max_value=MAX_SAFE), st.integers(min_value=1, max_value=MAX_SAFE))
def test_limit_never_exceeds_either_side(sent: int, cap: int) -> None:
    result = apply_model_sampling({"max_tokens": sent}, "chat", ModelCallSampling(max_output_tokens=cap), None)
    assert result["max_tokens"] == min(sent, cap)


def test_chat_caps_the_limit_key_the_caller_used_and_adds_no_other() -> None:
    cap = ModelCallSampling(max_output_tokens=64)
    assert apply_model_sampling({"max_completion_tokens": 900}, "chat", cap, None) == {"max_completion_tokens": 64}
    assert apply_model_sampling({"max_tokens": 900}, "chat", cap, None) == {"max_tokens": 64}
    both = apply_model_sampling({"max_tokens": 900, "max_completion_tokens": 10}, "chat", cap, None)
    assert both == {"max_tokens": 64, "max_completion_tokens": 10}


def test_chat_without_a_limit_gets_max_tokens_the_key_every_compatible_server_reads() -> None:
    result = apply_model_sampling({"messages": []}, "chat", ModelCallSampling(max_output_tokens=64), None)
    assert result == {"messages": [], "max_tokens": 64}
    assert get_dialect("chat").max_tokens_keys[0] == "max_tokens"


@pytest.mark.parametrize("sent", [None, True, "100", 99.5])
def test_a_limit_that_is_not_an_integer_is_replaced_by_the_cap(sent: Any) -> None:
    result = apply_model_sampling({"max_tokens": sent}, "chat", ModelCallSampling(max_output_tokens=64), None)
    assert result["max_tokens"] == 64


def test_temperature_and_top_p_overwrite_and_unset_fields_leave_the_call_alone() -> None:
    request = {"temperature": 0.0, "top_p": 0.5, "max_output_tokens": 10, "input": "hi"}
    result = apply_model_sampling(request, "responses", ModelCallSampling(temperature=1.0), None)
    assert result == {**request, "temperature": 1.0}
    result = apply_model_sampling(request, "responses", ModelCallSampling(top_p=0.95), None)
    assert result == {**request, "top_p": 0.95}


def test_null_keeps_the_callers_sampling_plus_the_servers_overrides() -> None:
    request = {"model": "judge", "temperature": 0.2, "top_p": 0.8, "max_tokens": 50, "messages": []}
    assert apply_model_sampling(request, "chat", None, None) == request
    result = apply_model_sampling(request, "chat", None, {"temperature": 0.0, "seed": 7})
    assert result == {**request, "temperature": 0.0, "seed": 7}


def test_generic_limit_override_is_written_to_the_dialects_limit_keys() -> None:
    overrides = {"max_output_tokens": 256}
    assert apply_model_sampling({"max_completion_tokens": 10}, "chat", None, overrides) == {"max_completion_tokens": 256}
    assert apply_model_sampling({}, "chat", None, overrides) == {"max_tokens": 256}
    assert apply_model_sampling({}, "messages", None, overrides) == {"max_tokens": 256}
    assert apply_model_sampling({}, "responses", None, overrides) == {"max_output_tokens": 256}


def test_values_win_over_overrides_and_cap_the_overridden_limit() -> None:
    overrides = {"temperature": 0.0, "max_tokens": 4096, "top_k": 20}
    sampling = ModelCallSampling(temperature=1.0, max_output_tokens=512)
    result = apply_model_sampling({"max_tokens": 100, "messages": []}, "messages", sampling, overrides)
    assert result == {"max_tokens": 512, "messages": [], "temperature": 1.0, "top_k": 20}


def test_apply_returns_a_new_dict_and_leaves_the_request_unchanged() -> None:
    request = {"max_tokens": 900, "temperature": 0.1, "messages": [{"role": "user", "content": "x"}]}
    snapshot = json.loads(json.dumps(request))
    result = apply_model_sampling(request, "chat", ModelCallSampling(temperature=1.0, max_output_tokens=5), {"seed": 1})
    assert result is not request
    assert request == snapshot


def test_apply_refuses_an_unknown_dialect() -> None:
    with pytest.raises(KeyError, match="embeddings"):
        apply_model_sampling({}, "embeddings", None, None)


RECORDED_REQUESTS = [f for f in all_fixtures() if isinstance(f.request_json, dict)]


@pytest.mark.parametrize("recorded", RECORDED_REQUESTS, ids=[f.id for f in RECORDED_REQUESTS])
def test_values_on_recorded_requests_change_only_sampling_keys(recorded: Any) -> None:
    request = recorded.request_json
    limit_keys = get_dialect(recorded.dialect).max_tokens_keys
    sampling = ModelCallSampling(temperature=0.6, top_p=0.9, max_output_tokens=37)
    result = apply_model_sampling(request, recorded.dialect, sampling, None)
    changed = {key for key in result if result[key] != request.get(key, object())}
    assert changed <= {"temperature", "top_p", *limit_keys}
    assert result["temperature"] == 0.6 and result["top_p"] == 0.9
    limits = [result[key] for key in limit_keys if key in result]
    assert limits and all(limit <= 37 for limit in limits)
    assert all(result[key] == min(request[key], 37) for key in limit_keys if isinstance(request.get(key), int))
