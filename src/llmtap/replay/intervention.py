"""Intervention replay: a mocked replay with one recorded call's response replaced from a file.

The override file is JSON (read as JSON only, bounded in size; it is input from outside):

    {"rollout_id": "0-0", "call_index": 3, "response": {...}}            # a JSON response body
    {"rollout_id": "0-0", "call_index": 3, "response_raw": "data: ..."}  # a raw body or event stream

optionally with "status_code". The replaced call answers with that body; every other call is
served from the recording as in mocked mode. The agent's next requests then usually differ
from the recording: they are misses, or with `--on-miss passthrough` go to the live model.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import orjson

from ..errors import LlmtapError

__all__ = ["MAX_OVERRIDE_BYTES", "InterventionError", "load_override"]

MAX_OVERRIDE_BYTES = 16 * 1024 * 1024


class InterventionError(LlmtapError):
    """Raised when an intervention file cannot be used: missing, a link, too large, or not the expected JSON."""


def _read_bounded(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise InterventionError(
            f"Could not open the intervention file '{path}' ({exc.strerror}); pass a regular JSON file, not a link."
        ) from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InterventionError(f"Could not read the intervention file '{path}': it is not a regular file.")
        if info.st_size > MAX_OVERRIDE_BYTES:
            raise InterventionError(
                f"Could not read the intervention file '{path}': {info.st_size} bytes is over {MAX_OVERRIDE_BYTES}."
            )
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read(MAX_OVERRIDE_BYTES + 1)
    finally:
        os.close(fd)


def load_override(path: Path) -> tuple[str, int, dict[str, Any]]:
    """Read an intervention file: (rollout id, call index, the line fields that replace the recorded answer)."""
    data = _read_bounded(path)
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InterventionError(f"Could not read the intervention file '{path}': it is not JSON ({exc}).") from exc
    if not isinstance(value, dict):
        raise InterventionError(f"The intervention file '{path}' must hold a JSON object.")
    rollout_id, call_index = value.get("rollout_id", "default"), value.get("call_index")
    if not isinstance(rollout_id, str) or isinstance(call_index, bool) or not isinstance(call_index, int):
        raise InterventionError(
            f"The intervention file '{path}' must name 'rollout_id' (a string) and 'call_index' (an integer)."
        )
    fields: dict[str, Any] = {}
    if isinstance(value.get("response_raw"), str):
        fields.update({"response_raw": value["response_raw"], "response": None})
    elif isinstance(value.get("response"), dict):
        fields.update({"response": value["response"], "response_raw": None, "response_raw_base64": None, "stream": False})
    else:
        raise InterventionError(
            f"The intervention file '{path}' must hold 'response' (a JSON object) or 'response_raw' (a string)."
        )
    status = value.get("status_code")
    if isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599:
        fields["status_code"] = status
    return rollout_id, call_index, fields
