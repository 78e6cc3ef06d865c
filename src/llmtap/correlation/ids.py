"""Rollout ids and the URL prefixes that carry them: the two id rules, the file stem, the fixed names.

Two rules, the reference system's two, so llmtap accepts exactly the ids it does:

- **An id a capture point files** (`validate_rollout_id`): a `/ng-rollout/<id>` prefix, the store,
  `rollout_context`. One to 212 ASCII letters, digits, `.`, `_` and `-`, in any order, except `.`
  and `..`: those are dot segments, which an HTTP client removes from a URL, so a call made under
  them would silently lose its prefix.
- **An explicit id a run body sets** (`validate_explicit_rollout_id`): `_ng_rollout_id` on a row or
  run request. The same, and it must start with a letter or digit (`ROLLOUT_ID_PATTERN`), as the
  reference system's helpers require; derived ids (`3-1`, `3-1-a2`) always do.

The length bound is the file-name limit. Every name the store makes for an id is `<stem><suffix>`,
and the longest is the marker's temporary file, `.<stem>.capture.incomplete.<pid>.<8 hex>.tmp`:
41 bytes around the stem with a 7-digit pid (Linux's largest), so a 214-byte stem keeps every name
within the 255 bytes a file name may have. The stem is the id itself, except that an id starting
with `.` (which would make hidden files, and names like llmtap's own temporary files) is stored
with that dot written `%2E`: `.hidden` is `%2Ehidden.capture.jsonl`. `%` is not an id character,
so the stem is reversible and never another id's. That costs 2 bytes, hence 212, not 214.

The reference system files ids of up to 241 characters (its longest name is the data file's) and
a leading dot as a hidden file; llmtap refuses 213 and more, and does not read such a hidden file
that the reference wrote (rename `.x.capture.jsonl` to `%2Ex.capture.jsonl`).

This module imports nothing heavy: an agent that only validates an id or builds a prefix never
loads the store, asyncio or pydantic.
"""

from __future__ import annotations

import re

from llmtap.errors import InvalidRolloutIdError

__all__ = [
    "CAPTURED_ROLLOUT_ID_PATTERN",
    "MAX_ROLLOUT_ID_LENGTH",
    "MODEL_SAMPLING_PREFIX",
    "ROLLOUT_ID_PATTERN",
    "ROLLOUT_PREFIX",
    "TRAINING_TOKEN_CAPTURE_FIELD",
    "TRAINING_TOKEN_CAPTURE_SEGMENT",
    "rollout_file_stem",
    "rollout_id_from_file_stem",
    "validate_explicit_rollout_id",
    "validate_rollout_id",
]

ROLLOUT_PREFIX = "/ng-rollout/"
MODEL_SAMPLING_PREFIX = "/ng-sampling/"
# After `/ng-rollout/<id>`: the call is also one whose token ids a training framework captures.
TRAINING_TOKEN_CAPTURE_SEGMENT = "/training-token-capture"
# The record's mark of such a call (kept on the record's `extra`); absent, not false, on every other call.
TRAINING_TOKEN_CAPTURE_FIELD = "training_token_capture"

# Use fullmatch (or the validate functions): with `match`, "$" would also accept a trailing newline.
ROLLOUT_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", re.ASCII)
CAPTURED_ROLLOUT_ID_PATTERN = re.compile(r"^[A-Za-z0-9._-]+$", re.ASCII)
MAX_ROLLOUT_ID_LENGTH = 212  # see the module docstring: every file name within 255 bytes

_DOT_SEGMENTS = frozenset({".", ".."})
# A leading dot's stand-in in a file stem: its URL encoding, and never a character of an id.
_ESCAPED_DOT = "%2E"

# Ids already found valid: every append checks its id, and a rollout makes many calls.
_VALID_IDS: set[str] = set()
_VALID_IDS_KEPT = 65536


def validate_rollout_id(rollout_id: object) -> str:
    """Return `rollout_id` if a capture point may file it, else raise InvalidRolloutIdError.

    The id check of everything that files or routes a call: 1 to 212 ASCII letters, digits, '.',
    '_' and '-', and neither "." nor "..". That rules out separators, escapes from the directory,
    spaces and non-ASCII characters; a leading dot is stored escaped (`rollout_file_stem`).
    """
    if type(rollout_id) is str and rollout_id in _VALID_IDS:
        return rollout_id
    if not isinstance(rollout_id, str):
        raise InvalidRolloutIdError(rollout_id, f"it is a {type(rollout_id).__name__}, not a string")
    if not rollout_id:
        raise InvalidRolloutIdError(rollout_id, "it is empty")
    if len(rollout_id) > MAX_ROLLOUT_ID_LENGTH:
        raise InvalidRolloutIdError(
            rollout_id, f"it has {len(rollout_id)} characters, more than {MAX_ROLLOUT_ID_LENGTH}"
        )
    if CAPTURED_ROLLOUT_ID_PATTERN.fullmatch(rollout_id) is None:
        raise InvalidRolloutIdError(rollout_id)
    if rollout_id in _DOT_SEGMENTS:
        raise InvalidRolloutIdError(rollout_id, "it is a dot segment, which a URL would drop")
    if type(rollout_id) is str:
        if len(_VALID_IDS) >= _VALID_IDS_KEPT:
            _VALID_IDS.clear()
        _VALID_IDS.add(rollout_id)
    return rollout_id


def validate_explicit_rollout_id(rollout_id: object) -> str:
    """Return an explicit `_ng_rollout_id` if it is valid, else raise InvalidRolloutIdError.

    `validate_rollout_id`, and the first character must be a letter or digit (`ROLLOUT_ID_PATTERN`).
    """
    validate_rollout_id(rollout_id)
    assert isinstance(rollout_id, str)
    if ROLLOUT_ID_PATTERN.fullmatch(rollout_id) is None:
        raise InvalidRolloutIdError(rollout_id, "an explicit id must start with an ASCII letter or digit")
    return rollout_id


def rollout_file_stem(rollout_id: str) -> str:
    """Return the stem of a valid id's file names: the id, with a leading '.' written `%2E`.

    The id must already be valid (`validate_rollout_id`); the stem is at most 214 bytes.

    >>> rollout_file_stem(".hidden"), rollout_file_stem("3-1")
    ('%2Ehidden', '3-1')
    """
    return rollout_id if rollout_id[:1] != "." else _ESCAPED_DOT + rollout_id[1:]


def rollout_id_from_file_stem(stem: str) -> str | None:
    """Return the id whose file names have this stem, or None when no valid id has it.

    The inverse of `rollout_file_stem`: a listing of the capture directory reads ids back through
    it, so a planted or foreign name (`.x`, `a%2Eb`, a 300-character stem) is never taken for one.
    """
    rollout_id = "." + stem[len(_ESCAPED_DOT) :] if stem.startswith(_ESCAPED_DOT) else stem
    if rollout_id[:1] == "." and not stem.startswith(_ESCAPED_DOT):
        return None  # a hidden name: not one the store writes
    try:
        return validate_rollout_id(rollout_id)
    except InvalidRolloutIdError:
        return None
