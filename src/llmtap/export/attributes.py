"""The OpenTelemetry attribute names llmtap's spans carry, pinned in one place.

The GenAI names follow the semantic conventions version `SEMCONV_VERSION` (the one capsules'
`model-calls.jsonl` follows too); the `llmtap.*` names are llmtap's own, for what the conventions
have no name for (the rollout, the call's place in it, the error category).
"""

from __future__ import annotations

from .semconv import SEMCONV_VERSION

__all__ = [
    "CONTENT_SWITCH_ENV",
    "SEMCONV_VERSION",
    "SPAN_ATTRIBUTES",
]

# The ecosystem's switch for message content on spans (off unless exactly "true", any case).
CONTENT_SWITCH_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

OPERATION_NAME = "gen_ai.operation.name"
PROVIDER_NAME = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_TEMPERATURE = "gen_ai.request.temperature"
REQUEST_TOP_P = "gen_ai.request.top_p"
REQUEST_TOP_K = "gen_ai.request.top_k"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
REQUEST_FREQUENCY_PENALTY = "gen_ai.request.frequency_penalty"
REQUEST_PRESENCE_PENALTY = "gen_ai.request.presence_penalty"
REQUEST_SEED = "gen_ai.request.seed"
REQUEST_STOP_SEQUENCES = "gen_ai.request.stop_sequences"
REQUEST_CHOICE_COUNT = "gen_ai.request.choice.count"
RESPONSE_ID = "gen_ai.response.id"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
USAGE_CACHE_CREATION_INPUT_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
USAGE_REASONING_OUTPUT_TOKENS = "gen_ai.usage.reasoning.output_tokens"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
ERROR_TYPE = "error.type"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"

ROLLOUT_ID = "llmtap.rollout_id"
MODEL_CALL_ID = "llmtap.model_call_id"
CALL_INDEX = "llmtap.call_index"
DIALECT = "llmtap.dialect"
ERROR_CATEGORY = "llmtap.error_category"
STREAM = "llmtap.stream"
TTFT_MS = "llmtap.latency_ttft_ms"

# Request keys the conventions name, as export/genai.py reads them (one reader of sampling keys).
SAMPLING_ATTRIBUTES = (
    REQUEST_TEMPERATURE,
    REQUEST_TOP_P,
    REQUEST_TOP_K,
    REQUEST_FREQUENCY_PENALTY,
    REQUEST_PRESENCE_PENALTY,
    REQUEST_SEED,
    REQUEST_MAX_TOKENS,
    REQUEST_STOP_SEQUENCES,
    REQUEST_CHOICE_COUNT,
)

# Every attribute a span may carry, for tests and docs.
SPAN_ATTRIBUTES = (
    OPERATION_NAME,
    PROVIDER_NAME,
    REQUEST_MODEL,
    *SAMPLING_ATTRIBUTES,
    RESPONSE_ID,
    RESPONSE_MODEL,
    RESPONSE_FINISH_REASONS,
    USAGE_INPUT_TOKENS,
    USAGE_OUTPUT_TOKENS,
    USAGE_CACHE_READ_INPUT_TOKENS,
    USAGE_CACHE_CREATION_INPUT_TOKENS,
    USAGE_REASONING_OUTPUT_TOKENS,
    INPUT_MESSAGES,
    OUTPUT_MESSAGES,
    ERROR_TYPE,
    HTTP_RESPONSE_STATUS_CODE,
    ROLLOUT_ID,
    MODEL_CALL_ID,
    CALL_INDEX,
    DIALECT,
    ERROR_CATEGORY,
    STREAM,
    TTFT_MS,
)

# The schema URL of the pinned conventions, carried by the instrumentation scope.
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
