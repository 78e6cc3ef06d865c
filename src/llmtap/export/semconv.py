"""The OpenTelemetry semantic conventions version capsules follow, in one place.

The last core semantic-conventions release that carried the GenAI documents (before they moved
to open-telemetry/semantic-conventions-genai): `gen_ai.provider.name`, the cache read/creation
input tokens and the reasoning output tokens all exist there. Kept apart from `genai` so that
writing a manifest never loads the dialects.
"""

SEMCONV_NAME = "OpenTelemetry semantic conventions for generative AI"
SEMCONV_VERSION = "1.41.0"
