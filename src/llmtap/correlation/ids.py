"""Rollout ids and the URL prefixes that carry them: the one pattern, the one check, the fixed names.

Everything that files, routes or builds a URL for a rollout checks its id here, so an id accepted
anywhere is one the store can use as a file-name stem. This module imports nothing heavy: an agent
that only validates an id or builds a prefix never loads the store, asyncio or pydantic.
"""

from __future__ import annotations

import re

from llmtap.errors import InvalidRolloutIdError

__all__ = [
    "MAX_ROLLOUT_ID_LENGTH",
    "MODEL_SAMPLING_PREFIX",
    "ROLLOUT_ID_PATTERN",
    "ROLLOUT_PREFIX",
    "validate_rollout_id",
]

ROLLOUT_PREFIX = "/ng-rollout/"
MODEL_SAMPLING_PREFIX = "/ng-sampling/"

# Use fullmatch (or validate_rollout_id): with `match`, "$" would also accept a trailing newline.
ROLLOUT_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", re.ASCII)
MAX_ROLLOUT_ID_LENGTH = 200  # the longest file name (id + ".capture.cleared.tmp") stays under 255

# Ids already found valid: every append checks its id, and a rollout makes many calls.
_VALID_IDS: set[str] = set()
_VALID_IDS_KEPT = 65536


def validate_rollout_id(rollout_id: object) -> str:
    """Return `rollout_id` if it is a safe file-name stem, else raise InvalidRolloutIdError.

    The one id check in llmtap: ASCII letters, digits, '.', '_' and '-', starting with a letter or
    digit, at most 200 characters. That rules out separators, "..", hidden files and spaces.
    """
    if type(rollout_id) is str and rollout_id in _VALID_IDS:
        return rollout_id
    if not isinstance(rollout_id, str):
        raise InvalidRolloutIdError(rollout_id, f"it is a {type(rollout_id).__name__}, not a string")
    if not rollout_id:
        raise InvalidRolloutIdError(rollout_id, "it is empty")
    if len(rollout_id) > MAX_ROLLOUT_ID_LENGTH:
        raise InvalidRolloutIdError(rollout_id, f"it has {len(rollout_id)} characters, more than 200")
    if ROLLOUT_ID_PATTERN.fullmatch(rollout_id) is None:
        raise InvalidRolloutIdError(rollout_id)
    if type(rollout_id) is str:
        if len(_VALID_IDS) >= _VALID_IDS_KEPT:
            _VALID_IDS.clear()
        _VALID_IDS.add(rollout_id)
    return rollout_id
