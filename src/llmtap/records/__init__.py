"""Records: what one captured call becomes, from the bytes that passed to the record consumers read.

    categories.py      error categories: what a status or an exception means
    content_coding.py  gzip, br and zstd response bodies decoded, within a size bound
    line.py            the persisted raw line, and the stream tracker that reads a stream as it passes
    model_call.py      ModelCallRecord: one line normalized
    metrics.py         a rollout's calls summed

Pure functions, no I/O: the store persists the lines and its readers turn them into records.
"""

from llmtap.records.categories import (
    ERROR_CATEGORIES,
    category_for_exception,
    category_for_status,
    status_from_exception,
)
from llmtap.records.line import SCHEMA_VERSION, StreamTracker, decode_raw_field, raw_line_from_exchange, recorded_chunks
from llmtap.records.metrics import aggregate_metrics
from llmtap.records.model_call import PAYLOAD_FIELDS, RECORD_FIELDS, ModelCallRecord

__all__ = [
    "ERROR_CATEGORIES",
    "PAYLOAD_FIELDS",
    "RECORD_FIELDS",
    "SCHEMA_VERSION",
    "ModelCallRecord",
    "StreamTracker",
    "aggregate_metrics",
    "category_for_exception",
    "category_for_status",
    "decode_raw_field",
    "raw_line_from_exchange",
    "recorded_chunks",
    "status_from_exception",
]
