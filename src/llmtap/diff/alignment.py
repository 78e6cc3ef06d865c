"""Pairing the calls of one rollout in two runs, so an inserted or removed call does not shift the rest.

Each call is reduced to a `CallSignature`: endpoint, model, a hash of its conversation prefix
(system/instructions and the first user message: the task), per-item hashes of the rest of the
conversation, a hash of its other settings (tools, format, sampling), its request match key and
a hash of everything compared. The alignment is the heaviest common subsequence under
`similarity`: calls pair in order, only when similar enough (`PAIR_THRESHOLD`), maximizing the
summed similarity above a baseline just under the threshold (so two weak pairs never outweigh
one strong one),
identical calls weighing most. Removed calls that face added ones at the
same place were replaced in place and pair at a lower bar (`REPLACE_THRESHOLD`). Cost is bounded: identical heads and tails are
trimmed first, a full dynamic programme runs only up to `MAX_CELLS` cells, and longer middles are
cut at calls that occur once in each run (patience anchors) or, failing that, aligned in
proportional windows of `CHUNK` calls.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MAX_CELLS", "PAIR_THRESHOLD", "CallSignature", "align", "signature", "similarity"]

PAIR_THRESHOLD = 0.55
# A pair scores its similarity less (threshold - PAIR_MARGIN): weak pairs add little.
PAIR_MARGIN = 0.1
# Calls replaced in place (removed ones facing added ones between two pairs) pair from this score.
REPLACE_THRESHOLD = 0.1
MAX_CELLS = 250_000
CHUNK = 400
_IDENTICAL = 2.0
_SAME_REQUEST = 1.5


@dataclass(frozen=True, slots=True)
class CallSignature:
    """What the alignment knows of one call. `items` and `prefix` are None when the request payload is absent."""

    endpoint: str | None
    model: str | None
    prefix: str | None
    items: tuple[str, ...] | None
    settings: str | None
    request_key: str | None
    exact: str
    counts: Counter[str] | None = None  # `items` as a multiset, built once


def signature(
    endpoint: str | None,
    model: str | None,
    items: Sequence[str] | None,
    *,
    prefix_length: int,
    settings: str | None,
    request_key: str | None,
    exact: str,
) -> CallSignature:
    """Build a call's signature from its conversation item hashes; the first `prefix_length` items are its task."""
    if items is None:
        return CallSignature(endpoint, model, None, None, settings, request_key, exact)
    prefix = "|".join(items[:prefix_length])
    rest = tuple(items[prefix_length:])
    return CallSignature(endpoint, model, prefix, rest, settings, request_key, exact, Counter(rest))


def _overlap(a: CallSignature, b: CallSignature) -> float:
    items_a, items_b = a.items or (), b.items or ()
    if not items_a and not items_b:
        return 1.0
    counts_a = a.counts if a.counts is not None else Counter(items_a)
    counts_b = b.counts if b.counts is not None else Counter(items_b)
    return sum((counts_a & counts_b).values()) / max(len(items_a), len(items_b))


def similarity(a: CallSignature, b: CallSignature) -> float:
    """Score how alike two calls are: 2.0 identical, 1.5 same request, else 0..1 from task, model, settings, conversation.

    Calls to different endpoints never pair (0.0).
    """
    if a.endpoint != b.endpoint:
        return 0.0
    if a.exact == b.exact:
        return _IDENTICAL
    if a.request_key is not None and a.request_key == b.request_key:
        return _SAME_REQUEST
    score = 0.15 * (a.model == b.model) + 0.1 * (a.settings == b.settings)
    if a.items is None or b.items is None:
        # No payloads: nothing tells calls apart but model and position, so same-model calls may pair.
        return score + (0.75 if a.items is None and b.items is None else 0.0)
    score += 0.45 * (a.prefix == b.prefix)
    if a.items or b.items:  # two empty remainders say nothing about each other
        score += 0.15 * _overlap(a, b)
        score += 0.15 * min(len(a.items), len(b.items)) / max(len(a.items), len(b.items))
    return score


Pair = tuple[int | None, int | None]


def align(a: Sequence[CallSignature], b: Sequence[CallSignature]) -> list[Pair]:
    """Return the alignment of two call sequences as pairs in order: (i, j) paired, (i, None) removed, (None, j) added."""
    head = 0
    while head < len(a) and head < len(b) and a[head].exact == b[head].exact:
        head += 1
    tail = 0
    while tail < len(a) - head and tail < len(b) - head and a[len(a) - 1 - tail].exact == b[len(b) - 1 - tail].exact:
        tail += 1
    pairs: list[Pair] = [(i, i) for i in range(head)]
    pairs.extend(_align_middle(a, b, head, len(a) - tail, head, len(b) - tail))
    pairs.extend((len(a) - tail + k, len(b) - tail + k) for k in range(tail))
    return pairs


def _align_middle(
    a: Sequence[CallSignature], b: Sequence[CallSignature], a0: int, a1: int, b0: int, b1: int
) -> list[Pair]:
    n, m = a1 - a0, b1 - b0
    if n == 0 or m == 0:
        return [(i, None) for i in range(a0, a1)] + [(None, j) for j in range(b0, b1)]
    if n * m <= MAX_CELLS:
        return _heaviest(a, b, a0, a1, b0, b1)
    anchors = _patience_anchors(a, b, a0, a1, b0, b1)
    if not anchors:
        return _chunked(a, b, a0, a1, b0, b1)
    pairs: list[Pair] = []
    previous_a, previous_b = a0, b0
    for i, j in anchors:
        pairs.extend(_align_middle(a, b, previous_a, i, previous_b, j))
        pairs.append((i, j))
        previous_a, previous_b = i + 1, j + 1
    pairs.extend(_align_middle(a, b, previous_a, a1, previous_b, b1))
    return pairs


def _patience_anchors(
    a: Sequence[CallSignature], b: Sequence[CallSignature], a0: int, a1: int, b0: int, b1: int
) -> list[tuple[int, int]]:
    """Calls identical in both runs and unique in each, as the longest increasing chain (patience diff)."""
    count_a = Counter(a[i].exact for i in range(a0, a1))
    count_b = Counter(b[j].exact for j in range(b0, b1))
    position_b = {b[j].exact: j for j in range(b0, b1) if count_b[b[j].exact] == 1}
    candidates = [
        (i, position_b[a[i].exact]) for i in range(a0, a1) if count_a[a[i].exact] == 1 and a[i].exact in position_b
    ]
    # Longest increasing subsequence of the b positions, in a order.
    tails: list[int] = []
    tail_index: list[int] = []
    previous: list[int] = [-1] * len(candidates)
    for index, (_, j) in enumerate(candidates):
        place = bisect_left(tails, j)
        if place == len(tails):
            tails.append(j)
            tail_index.append(index)
        else:
            tails[place] = j
            tail_index[place] = index
        previous[index] = tail_index[place - 1] if place else -1
    chain: list[tuple[int, int]] = []
    index = tail_index[-1] if tail_index else -1
    while index >= 0:
        chain.append(candidates[index])
        index = previous[index]
    return chain[::-1]


def _chunked(a: Sequence[CallSignature], b: Sequence[CallSignature], a0: int, a1: int, b0: int, b1: int) -> list[Pair]:
    """A middle too long for one programme and without anchors: proportional windows, each aligned in full."""
    n, m = a1 - a0, b1 - b0
    chunks = -(-max(n, m) // CHUNK)
    pairs: list[Pair] = []
    for k in range(chunks):
        pairs.extend(
            _heaviest(
                a, b, a0 + n * k // chunks, a0 + n * (k + 1) // chunks, b0 + m * k // chunks, b0 + m * (k + 1) // chunks
            )
        )
    return pairs


def _heaviest(
    a: Sequence[CallSignature],
    b: Sequence[CallSignature],
    a0: int,
    a1: int,
    b0: int,
    b1: int,
    threshold: float = PAIR_THRESHOLD,
) -> list[Pair]:
    """The heaviest common subsequence by dynamic programming (pairing preferred on ties)."""
    n, m = a1 - a0, b1 - b0
    if n == 0 or m == 0:
        return [(i, None) for i in range(a0, a1)] + [(None, j) for j in range(b0, b1)]
    baseline = threshold - PAIR_MARGIN
    score = [[0.0] * (m + 1) for _ in range(n + 1)]
    move = [[0] * (m + 1) for _ in range(n + 1)]  # 0 skip a call of a, 1 skip one of b, 2 pair them
    for j in range(1, m + 1):
        move[0][j] = 1
    for i in range(1, n + 1):
        row, above = score[i], score[i - 1]
        left = a[a0 + i - 1]
        for j in range(1, m + 1):
            best, step = above[j], 0
            if row[j - 1] > best:
                best, step = row[j - 1], 1
            weight = similarity(left, b[b0 + j - 1])
            # Scored by the excess over a baseline, so two weak pairs never outweigh one strong pair.
            if weight >= threshold and above[j - 1] + weight - baseline >= best:
                best, step = above[j - 1] + weight - baseline, 2
            row[j] = best
            move[i][j] = step
    pairs: list[Pair] = []
    i, j = n, m
    while i > 0 or j > 0:
        step = move[i][j]
        if step == 2:
            pairs.append((a0 + i - 1, b0 + j - 1))
            i, j = i - 1, j - 1
        elif step == 0:
            pairs.append((a0 + i - 1, None))
            i -= 1
        else:
            pairs.append((None, b0 + j - 1))
            j -= 1
    pairs.reverse()
    if threshold > REPLACE_THRESHOLD:
        pairs = _pair_replacements(a, b, pairs)
    return _removals_before_additions(pairs)


def _pair_replacements(a: Sequence[CallSignature], b: Sequence[CallSignature], pairs: list[Pair]) -> list[Pair]:
    """Between two paired calls, removed calls facing added ones were replaced in place: pair them at a lower bar.

    A prompt template edit changes every call's task prefix; its calls are still the same calls.
    """
    result: list[Pair] = []
    block: list[Pair] = []
    for pair in [*pairs, (-1, -1)]:
        if pair[0] is None or pair[1] is None:
            block.append(pair)
            continue
        removed = [i for i, _ in block if i is not None]
        added = [j for _, j in block if j is not None]
        if removed and added and len(removed) * len(added) <= MAX_CELLS:
            result.extend(_heaviest(a, b, removed[0], removed[-1] + 1, added[0], added[-1] + 1, REPLACE_THRESHOLD))
        else:
            result.extend(block)
        block = []
        if pair != (-1, -1):
            result.append(pair)
    return result


def _removals_before_additions(pairs: list[Pair]) -> list[Pair]:
    """Within each run of unpaired calls, list removals first: a stable, readable order."""
    result: list[Pair] = []
    pending_removed: list[Pair] = []
    pending_added: list[Pair] = []
    for pair in pairs:
        if pair[0] is not None and pair[1] is not None:
            result.extend(pending_removed + pending_added)
            pending_removed, pending_added = [], []
            result.append(pair)
        elif pair[1] is None:
            pending_removed.append(pair)
        else:
            pending_added.append(pair)
    result.extend(pending_removed + pending_added)
    return result
