"""The secret scanner: finds credentials in text with the rule pack, fast on text that holds none.

A clean text costs one lowercase copy and one substring search per keyword; a rule's regex runs
only on windows around its keywords' occurrences, never over the whole text. What a rule matches
is then checked against what must never be redacted: ids agents and APIs print everywhere (UUIDs,
git SHAs, digests, ULIDs, `chatcmpl-`/`resp_`/`msg_`/`call_`/`toolu_` ids, integrity strings),
documentation examples (`AKIA...EXAMPLE`), placeholders (`${VAR}`, `{{ secrets.X }}`, `<key>`)
and the scanner's own `[REDACTED:<rule-id>]` markers, so scanning redacted text finds nothing.

Dependency-free, so it can run anywhere llmtap's capture runs.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

from .rules import RULE_PACK_VERSION, RULES, Rule, rule_pack_digest

__all__ = [
    "RULE_PACK_DIGEST",
    "RULE_PACK_VERSION",
    "SCANNER_VERSION",
    "Finding",
    "is_benign",
    "marker",
    "scan_text",
    "scan_value",
    "shannon_entropy",
]

SCANNER_VERSION = "1.0.0"
RULE_PACK_DIGEST = rule_pack_digest()

_RULES_BY_ID = {rule.id: rule for rule in RULES}
_PRIORITY = {rule.id: index for index, rule in enumerate(RULES)}
_GUARD = 64  # characters past a window's longest match, so look-aheads see real text, not the window's end
_SMALL_TEXT = 2048  # below this, a rule whose keyword is present scans the whole text in one call


@dataclass(frozen=True, slots=True)
class Finding:
    """One credential found: its rule and its span `[start, end)` in the scanned text."""

    rule_id: str
    start: int
    end: int


def marker(rule_id: str) -> str:
    """Return the text that replaces a secret: `[REDACTED:<rule-id>]`."""
    return f"[REDACTED:{rule_id}]"


def shannon_entropy(value: str) -> float:
    """Return the Shannon entropy of `value` in bits per character (0.0 for an empty string)."""
    if not value:
        return 0.0
    length = len(value)
    return -sum(count / length * math.log2(count / length) for count in Counter(value).values())


_BENIGN_SHAPES = re.compile(
    r"""(?x)^(?:
        [0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}   # UUID
      | [0-9a-fA-F]{7,40} | [0-9a-fA-F]{64} | [0-9a-fA-F]{96} | [0-9a-fA-F]{128}      # git SHAs, digests
      | (?:sha1|sha256|sha384|sha512|md5)[-:][A-Za-z0-9+/=_-]{16,}                    # integrity strings, digests
      | [0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}                                       # ULID
      | (?:chatcmpl|cmpl|resp|msg|call|toolu|srvtoolu|fc|rs|ws|ci|mcp|mcpr|item|run|asst|thread|file|batch
          |req|evt|ctc|lc|ig|msgbatch|span|trace|step|ft|ftjob|vs|org|proj|user|sess|conv|chatgpt)[-_][A-Za-z0-9_-]+
      | [0-9]+(?:\.[0-9]+)*                                                            # numbers, versions
      | true|false|null|none|undefined
    )$"""
)
_PLACEHOLDER = re.compile(
    r"""(?xi)
        \$\{[^}]*\}? | \$\(|^\$[A-Z_][A-Z0-9_]*$ | \{\{.*?\}\}? | \{%|%\([A-Za-z_]+\)s | ^<.*>?$ | ^\[REDACTED
      | REDACTED | EXAMPLE(?:KEY)?$ | ^x{6,}$ | ^\*{3,} | \*{6,} | ^(.)\1{5,}$
      | your[_-]?(?:api[_-]?)?(?:key|token|secret|password) | changeme | placeholder | dummy | ^(?:my|the)[_-]
      | (?:api[_-]?key|password|secret|token)[_-]?here$ | ^(?:sk|pk)-\.\.\. | \.\.\.$
    """
)


def is_benign(value: str, *, id_shapes: bool = True) -> bool:
    """True for a value that must never be redacted: a placeholder, or (with `id_shapes`) a known
    id or digest shape. Rules for a fixed credential shape pass `id_shapes=False`: a 32-hex Twilio
    token next to its name is a secret even though a bare 32-hex run is not."""
    if _PLACEHOLDER.search(value) is not None:
        return True
    return id_shapes and _BENIGN_SHAPES.match(value) is not None


def _random_enough(rule: Rule, value: str) -> bool:
    """For rules with an entropy floor: above it, and holding a letter and a digit, as generated
    credentials do. A word (`implementation`, a logprobs `"token"`) has neither the digit nor,
    usually, the entropy."""
    if rule.entropy_floor is None:
        return True
    has_letter = any(c.isalpha() for c in value)
    has_digit = any(c.isdigit() for c in value)
    return has_letter and has_digit and shannon_entropy(value) >= rule.entropy_floor


def _occurrences(haystack: str, needle: str) -> list[int]:
    positions = []
    index = haystack.find(needle)
    while index >= 0:
        positions.append(index)
        index = haystack.find(needle, index + 1)
    return positions


def _windows(rule: Rule, positions: list[int], length: int) -> list[tuple[int, int]]:
    """Merge the spans around keyword positions where a match of `rule` could lie."""
    spans: list[tuple[int, int]] = []
    for position in sorted(positions):
        start = max(0, position - rule.back)
        end = min(length, position + rule.max_length + _GUARD)
        if spans and start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((start, end))
    return spans


def _accepted(rule: Rule, match: re.Match[str]) -> tuple[int, int] | None:
    """The span to redact, or None when the match is benign or not random enough."""
    group = "secret" if "secret" in rule.pattern.groupindex else 0
    start, end = match.span(group)
    value = match.string[start:end]
    if rule.generic:
        value = value.rstrip(".")  # a sentence's full stop after an assignment is not part of it
        end = start + len(value)
        if len(value) < 8:
            return None
    if is_benign(value, id_shapes=rule.loose):
        return None
    if not _random_enough(rule, value):
        return None
    return start, end


def _select(found: list[Finding]) -> list[Finding]:
    """Keep one finding per span of text: a format's own rule before a loose one (generic
    assignment, bearer, URL password), then the earliest, then the longest."""
    found.sort(key=lambda f: (_RULES_BY_ID[f.rule_id].loose, f.start, -(f.end - f.start), _PRIORITY[f.rule_id]))
    kept: list[Finding] = []
    for finding in found:
        if any(finding.start < other.end and other.start < finding.end for other in kept):
            continue
        kept.append(finding)
    kept.sort(key=lambda f: f.start)
    return kept


def scan_text(text: str) -> list[Finding]:
    """Return the credentials in `text`, in order, never overlapping.

    >>> [f.rule_id for f in scan_text("key: ghp_" + "a1B2" * 9)]
    ['github-pat-classic']
    """
    if not text:
        return []
    lowered = text.lower()
    lowered_aligned = len(lowered) == len(text)  # some characters lowercase to two (İ): no shared offsets then
    found: list[Finding] = []
    for rule in RULES:
        haystack = lowered if rule.ignore_case else text
        positions: list[int] = []
        for keyword in rule.keywords:
            if keyword in haystack:
                found_at = _occurrences(haystack, keyword)
                tail = rule.after_keyword
                if tail is not None and lowered_aligned:
                    found_at = [p for p in found_at if tail.match(lowered, p + len(keyword)) is not None]
                positions.extend(found_at)
        if not positions:
            continue
        if len(text) <= _SMALL_TEXT or (rule.ignore_case and not lowered_aligned):
            spans = [(0, len(text))]
        else:
            spans = _windows(rule, positions, len(text))
        for start, end in spans:
            for match in rule.pattern.finditer(text, start, end):
                span = _accepted(rule, match)
                if span is not None:
                    found.append(Finding(rule.id, span[0], span[1]))
    return _select(found) if len(found) > 1 else found


def scan_value(value: str, key: str | None = None) -> list[Finding]:
    """Return the credentials in a JSON string `value`, whose object key (if any) is `key`.

    Besides the text's own matches, a whole value counts as a secret when its key names one
    (`"password": "..."`, `"aws_secret_access_key": "..."`) and it has the rule's value shape.
    """
    found = scan_text(value)
    if key is None or found or not value:
        return found
    for rule in RULES:
        if rule.key_pattern is None or rule.value_pattern is None:
            continue
        if rule.key_pattern.fullmatch(key) is None or rule.value_pattern.fullmatch(value) is None:
            continue
        if is_benign(value, id_shapes=rule.loose) or not _random_enough(rule, value):
            continue
        return [Finding(rule.id, 0, len(value))]
    return []


def rule_for(rule_id: str) -> Rule:
    """Return the rule with id `rule_id` (KeyError when the pack has none)."""
    return _RULES_BY_ID[rule_id]


assert RULE_PACK_VERSION  # re-exported: a proof names the pack's version next to the scanner's
