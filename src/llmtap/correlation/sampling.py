"""The `/ng-sampling/<segment>` path segment: a training framework's sampling values for a call.

A framework that trains an agent puts its sampling values on each rollout's row under
`_ng_model_sampling`. They travel in the URL of every model call the agent makes, as
`/ng-sampling/<segment>` after any `/ng-rollout/<id>` prefix (or in the `x-ng-sampling` header,
with the same encoding), and the model server writes them into the request. The segment is the
unpadded base64url of compact, key-sorted JSON; `null` marks a call the framework does not train
(a verifier's judge), which keeps its caller's sampling and its server's `sampling_overrides`.

Client side: `encode_model_sampling`, `model_sampling_from_run_body`, `with_model_sampling_segment`,
`model_sampling_context`. Server side, pure functions over dicts: `split_sampling_segment`,
`resolve_sampling_segment`, `decode_model_sampling`, `apply_model_sampling`.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmtap.correlation.ids import (
    MODEL_SAMPLING_PREFIX,
    ROLLOUT_PREFIX,
    TRAINING_TOKEN_CAPTURE_SEGMENT,
    validate_rollout_id,
)
from llmtap.correlation.run_body import run_body_value
from llmtap.errors import InvalidRolloutIdError

__all__ = [
    "MODEL_SAMPLING_HEADER",
    "MODEL_SAMPLING_KEY",
    "MODEL_SAMPLING_NULL",
    "MODEL_SAMPLING_PREFIX",
    "ModelCallSampling",
    "ModelCallSamplingConfig",
    "apply_model_sampling",
    "current_model_sampling_segment",
    "decode_model_sampling",
    "encode_model_sampling",
    "model_call_sampling_config",
    "model_sampling_context",
    "model_sampling_from_run_body",
    "model_sampling_path_segment",
    "resolve_sampling_segment",
    "run_body_value",
    "split_sampling_segment",
    "with_model_sampling_segment",
]

MODEL_SAMPLING_HEADER = "x-ng-sampling"
MODEL_SAMPLING_NULL = "null"
# The row key a framework sets its values under.
MODEL_SAMPLING_KEY = "_ng_model_sampling"

_ENCODED = re.compile(r"[A-Za-z0-9_-]+")
# Values fit in about 100 characters; the bound keeps a hostile segment from costing anything.
_MAX_ENCODED_LENGTH = 1024
_GENERATION_API_PATHS = frozenset({"/v1/chat/completions", "/v1/responses", "/v1/messages"})
_MAX_SAFE_INTEGER = 2**53 - 1

_MODEL_SAMPLING_SEGMENT: ContextVar[Optional[str]] = ContextVar("llmtap_model_sampling_segment", default=None)


class ModelCallSampling(BaseModel):
    """Sampling values for the model calls of an agent that a training framework trains.

    The model server sends the smaller of `max_output_tokens` and the call's own limit, so a
    harness that reserves fewer tokens (near the end of its context, or for a summary) keeps its
    limit; `temperature` and `top_p` replace the call's values. An unset field leaves the call's
    own value. Numbers are strict: a bool, a string or a non-finite float is refused, so a value
    is never guessed. `temperature` may be 0 because validation rollouts often decode greedily.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    temperature: Optional[float] = Field(default=None, ge=0)
    top_p: Optional[float] = Field(default=None, gt=0, le=1)
    max_output_tokens: Optional[int] = Field(default=None, gt=0, le=_MAX_SAFE_INTEGER)


class ModelCallSamplingConfig(BaseModel):
    """The global `model_call_sampling` block; a training framework sets it when its rows carry values.

    Its presence marks the run: resources servers then send `null` with the model calls they make
    while handling a request, so their judges keep their own sampling. A model server named in
    `required_model_servers` refuses a generation call that carries no segment at all.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    required_model_servers: list[str] = Field(default_factory=list)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Build a JSON object, refusing a repeated key (two readers could pick different values)."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"Sampling segment repeats the key {key!r}: send each value once.")
        result[key] = value
    return result


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"Sampling segment holds {name}, which is not a number: send finite values.")


def _describe_validation_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "values"
    return f"{where}={first.get('input')!r} ({first['msg']})"


def encode_model_sampling(sampling: ModelCallSampling | None) -> str:
    """Encode values as the segment's unpadded base64url JSON, and None as `null`.

    Unset fields are omitted and keys are sorted, so equal values always encode to equal text.

    >>> encode_model_sampling(ModelCallSampling(temperature=0.5))
    'eyJ0ZW1wZXJhdHVyZSI6MC41fQ'
    """
    if sampling is None:
        return MODEL_SAMPLING_NULL
    values = sampling.model_dump(exclude_none=True)
    text = json.dumps(values, separators=(",", ":"), sort_keys=True, allow_nan=False)
    return base64.urlsafe_b64encode(text.encode("utf-8")).rstrip(b"=").decode("ascii")


def decode_model_sampling(encoded: str) -> ModelCallSampling | None:
    """Decode a segment value: `null` to None, anything else to values.

    Raises ValueError for a malformed or ambiguous value (characters outside base64url, padding,
    over 1024 characters, a non-canonical encoding, bytes that are not UTF-8 JSON, JSON that is not
    an object, a repeated key, an unknown field, a bad value), so a call never runs with values
    it did not send.
    """
    if not isinstance(encoded, str):
        raise ValueError(f"Sampling segment {encoded!r} is not a string: send the encoded text.")
    if encoded == MODEL_SAMPLING_NULL:
        return None
    if len(encoded) > _MAX_ENCODED_LENGTH:
        raise ValueError(
            f"Sampling segment is {len(encoded)} characters long, over the limit of "
            f"{_MAX_ENCODED_LENGTH}: send only temperature, top_p and max_output_tokens."
        )
    if not _ENCODED.fullmatch(encoded):
        raise ValueError(
            f"Sampling segment {encoded!r} is not unpadded base64url: use only A-Z, a-z, 0-9, '-' "
            "and '_', without '=' padding (or send 'null')."
        )
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except (binascii.Error, ValueError):
        raise ValueError(f"Sampling segment {encoded!r} has an impossible base64 length.") from None
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") != encoded:
        raise ValueError(
            f"Sampling segment {encoded!r} is not canonical base64url (stray bits in its last "
            "character): encode it with encode_model_sampling."
        )
    try:
        values = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_refuse_constant)
    except UnicodeDecodeError:
        raise ValueError(f"Sampling segment {encoded!r} does not decode to UTF-8 text.") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"Sampling segment {encoded!r} does not decode to JSON: {error.msg}.") from None
    if not isinstance(values, dict):
        raise ValueError(
            f"Sampling segment {encoded!r} decodes to {type(values).__name__}, not a JSON object: "
            "send an object such as {\"temperature\": 1.0}."
        )
    try:
        return ModelCallSampling.model_validate(values)
    except ValidationError as error:
        raise ValueError(
            f"Sampling segment {encoded!r} holds an invalid value, {_describe_validation_error(error)}: "
            "send only temperature (>= 0), top_p (0 < p <= 1) and max_output_tokens (a positive integer)."
        ) from None


def model_sampling_from_run_body(body: BaseModel | Mapping[str, Any] | None) -> ModelCallSampling | None:
    """Return the values a run request or row carries under `_ng_model_sampling`, or None.

    Raises ValueError when the values are invalid, so a rollout never runs with sampling its
    framework did not ask for.
    """
    value = run_body_value(body, MODEL_SAMPLING_KEY)
    if value is None or isinstance(value, ModelCallSampling):
        return value
    if isinstance(value, BaseModel):
        value = value.model_dump(exclude_none=True)
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{MODEL_SAMPLING_KEY} is {type(value).__name__} {value!r}, not an object: set it to "
            "values such as {\"temperature\": 1.0}, or leave it out."
        )
    try:
        return ModelCallSampling.model_validate(dict(value))
    except ValidationError as error:
        raise ValueError(
            f"{MODEL_SAMPLING_KEY} holds an invalid value, {_describe_validation_error(error)}: set only "
            "temperature (>= 0), top_p (0 < p <= 1) and max_output_tokens (a positive integer)."
        ) from None


def model_sampling_path_segment(segment: str | None) -> str:
    """Return `/ng-sampling/<segment>`, or "" for no segment; a malformed segment raises ValueError."""
    if segment is None:
        return ""
    decode_model_sampling(segment)
    return f"{MODEL_SAMPLING_PREFIX}{segment}"


def with_model_sampling_segment(url_path: str, segment: str | None) -> str:
    """Insert `/ng-sampling/<segment>` into a model server generation path, after its rollout prefix
    (and its `/training-token-capture` segment).

    Only the three generation paths get a segment; other paths, paths that already carry a
    segment, and paths with a malformed rollout prefix are returned unchanged. A query string
    stays at the end.

    >>> with_model_sampling_segment("/ng-rollout/3-1/v1/responses", "null")
    '/ng-rollout/3-1/ng-sampling/null/v1/responses'
    """
    if segment is None:
        return url_path
    path, mark, query = url_path.partition("?")
    prefix, rest = "", path
    if path.startswith(ROLLOUT_PREFIX):
        rollout_id, slash, rest = path[len(ROLLOUT_PREFIX) :].partition("/")
        try:
            validate_rollout_id(rollout_id)
        except InvalidRolloutIdError:
            return url_path
        if not slash:
            return url_path
        prefix, rest = f"{ROLLOUT_PREFIX}{rollout_id}", f"/{rest}"
        if rest.startswith(TRAINING_TOKEN_CAPTURE_SEGMENT + "/"):
            prefix, rest = prefix + TRAINING_TOKEN_CAPTURE_SEGMENT, rest[len(TRAINING_TOKEN_CAPTURE_SEGMENT) :]
    if rest not in _GENERATION_API_PATHS:
        return url_path
    return f"{prefix}{model_sampling_path_segment(segment)}{rest}{mark}{query}"


@contextmanager
def model_sampling_context(segment: str | None) -> Iterator[None]:
    """Give the model calls made inside the block the segment value `segment` (None: no segment).

    A malformed segment raises ValueError on entry, before any call is made.
    """
    if segment is not None:
        decode_model_sampling(segment)
    token = _MODEL_SAMPLING_SEGMENT.set(segment)
    try:
        yield
    finally:
        _MODEL_SAMPLING_SEGMENT.reset(token)


def current_model_sampling_segment() -> str | None:
    """Return the segment value for this request's model calls, or None when they carry no segment."""
    return _MODEL_SAMPLING_SEGMENT.get()


def model_call_sampling_config(
    global_config_dict: Mapping[str, Any] | None,
    *,
    model_server_names: Iterable[str] | None = None,
) -> ModelCallSamplingConfig | None:
    """Return the run's `model_call_sampling` block, or None when the run sets none.

    `model_server_names` are the run's model servers; when omitted they are the top-level config
    entries that hold a `responses_api_models` block. Raises ValueError when
    `required_model_servers` names a server that is not one of them: a misspelled name would
    otherwise leave the trained agent's model server unenforced, without an error.
    """
    if global_config_dict is None:
        return None
    block = global_config_dict.get("model_call_sampling")
    if block is None:
        return None
    if not isinstance(block, Mapping):
        raise ValueError(
            f"model_call_sampling is {type(block).__name__} {block!r}, not a mapping: set it to a block "
            "such as {required_model_servers: [policy_model]}."
        )
    try:
        config = ModelCallSamplingConfig.model_validate(dict(block))
    except ValidationError as error:
        raise ValueError(
            f"model_call_sampling is invalid, {_describe_validation_error(error)}: its only key is "
            "required_model_servers, a list of model server names."
        ) from None
    if model_server_names is None:
        model_server_names = [
            name
            for name, entry in global_config_dict.items()
            if isinstance(entry, Mapping) and "responses_api_models" in entry
        ]
    known = set(model_server_names)
    for name in config.required_model_servers:
        if name not in known:
            raise ValueError(
                f"model_call_sampling.required_model_servers names {name!r}, which is not a model server "
                f"of this run (model servers: {sorted(known)}): fix the name."
            )
    return config


def split_sampling_segment(path: str) -> tuple[str | None, str]:
    """Split a leading `/ng-sampling/<segment>` off a path (its rollout prefix already removed).

    Returns `(segment, rest)`, or `(None, path)` for a path without one. A malformed segment
    raises ValueError, so the server answers with a clear 4xx instead of running the call with
    values it was not sent.
    """
    if not path.startswith(MODEL_SAMPLING_PREFIX):
        return None, path
    path_only, mark, query = path.partition("?")
    segment, slash, rest = path_only[len(MODEL_SAMPLING_PREFIX) :].partition("/")
    if not segment:
        raise ValueError(f"Path {path!r} has an empty sampling segment: put the encoded values after /ng-sampling/.")
    decode_model_sampling(segment)
    rest = f"/{rest}" if slash else "/"
    return segment, f"{rest}{mark}{query}"


def resolve_sampling_segment(path_segment: str | None, header_value: str | None) -> str | None:
    """Return the one segment a call carries, from its path or its `x-ng-sampling` header.

    Raises ValueError when either is malformed, or when both are present and carry different
    values: the call must not guess which one its sender meant.
    """
    path_sampling = decode_model_sampling(path_segment) if path_segment is not None else None
    if header_value is None:
        return path_segment
    header_sampling = decode_model_sampling(header_value)
    if path_segment is None:
        return header_value
    if path_sampling != header_sampling:
        raise ValueError(
            f"The path's sampling segment {path_segment!r} and the {MODEL_SAMPLING_HEADER} header "
            f"{header_value!r} carry different values: send the values once."
        )
    return path_segment


def _limit_keys(dialect_name: str) -> tuple[str, ...]:
    """The request keys that limit output length for a dialect, the default first.

    Imported here, not at module level, so agents that only build URLs never load the dialects.
    """
    from llmtap.dialects import get_dialect

    return tuple(get_dialect(dialect_name).max_tokens_keys)


def apply_model_sampling(
    request: Mapping[str, Any],
    dialect_name: str,
    sampling: ModelCallSampling | None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Return a copy of a generation request with the server's overrides and the call's values written in.

    The order is fixed, so the result never depends on who set what first:

    1. The model server's `sampling_overrides` overwrite the request's keys (they are the
       server's policy). The generic key `max_output_tokens` is written to the dialect's limit
       keys: each one the request set, or the dialect's default key when it set none.
    2. The call's values (`sampling`), when not None: `temperature` and `top_p` overwrite;
       `max_output_tokens` caps every limit key the request now holds at the smaller of the two,
       and sets the dialect's default key when it holds none. A limit that is not an integer
       (such as chat's `null`, "no limit") is replaced by the cap.

    `sampling=None` (the `null` segment, or no segment) therefore keeps the sampling the caller
    chose plus the server's overrides. Limit keys per dialect come from the dialect registry:
    `max_output_tokens` (responses), `max_tokens` (messages); for chat both `max_tokens` and
    `max_completion_tokens` are capped when sent, and `max_tokens` is the default when neither
    is: llama-cpp-python's server reads only `max_tokens`, and servers that host a trained policy
    (vLLM-style) read both. Nested values are shared with `request`, not copied.
    """
    result = dict(request)
    limit_keys = _limit_keys(dialect_name)
    if overrides:
        for key, value in overrides.items():
            if key == "max_output_tokens" and key not in limit_keys:
                for limit_key in [k for k in limit_keys if k in result] or [limit_keys[0]]:
                    result[limit_key] = value
            else:
                result[key] = value
    if sampling is None:
        return result
    if sampling.temperature is not None:
        result["temperature"] = sampling.temperature
    if sampling.top_p is not None:
        result["top_p"] = sampling.top_p
    cap = sampling.max_output_tokens
    if cap is not None:
        present = [key for key in limit_keys if key in result]
        for key in present or [limit_keys[0]]:
            sent = result.get(key)
            if isinstance(sent, int) and not isinstance(sent, bool):
                result[key] = min(sent, cap)
            else:
                result[key] = cap
    return result
