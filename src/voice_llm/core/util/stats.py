"""The statistics every step, ``check``, ``compare`` and ``load`` share: one median rule, percentiles, the spread
over repeats, and the rank test of ``compare``. Standard library only (the Locust caller imports it too).

The median rule (decision 0007): the middle of the sorted values, and for an even count the UPPER of the two middle ones
(``sorted(values)[len(values) // 2]``). Why this and not the mean of the two middles (``statistics.median``):

* it is always a value that was really measured, so a step can point at the repeat it came from (the texts,
  chunks and WAVs it keeps are that repeat's), and ``check`` can recompute it from the raw evidence and compare
  it exactly, with no float rounding in between;
* the brief's "third of five" rule for ttft.json is this rule for an odd count; for an even count the upper
  middle is the pessimistic one for a latency, so a median never flatters the server by a value between two
  measurements that no caller waited;
* a p50 of :func:`percentile` is this same number (nearest rank alone would give the LOWER middle), so load.json's
  p50 and every other artifact's median of the same samples agree.

Percentiles other than the 50th are nearest rank: the smallest value with at least q % of the values at or
below it, again always a measured value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# Fields added beside a median: ``<field>_min`` and ``<field>_max``.
MIN_SUFFIX = "_min"
MAX_SUFFIX = "_max"


def median(values: Sequence[float]) -> float:
    """The one median rule (module docstring): the upper middle of the sorted values. ValueError for none."""
    if not values:
        raise ValueError("median of no values")
    return sorted(values)[len(values) // 2]


def median_index(values: Sequence[float]) -> int:
    """The position (in measuring order) of the repeat whose value is the median; the first such on ties."""
    target = median(values)
    return next(i for i, value in enumerate(values) if value == target)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100), None for no values: always one of the values, so it can be checked
    against them. The 50th is :func:`median` (the upper middle for an even count), not the nearest rank's lower
    middle, so a p50 is the same number as every other median of the same samples."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"a percentile is between 0 and 100, not {q}")
    if q == 50:
        return median(values)
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def gaps_ms(times_ms: Sequence[float]) -> list[float]:
    """The gaps between consecutive times (an answer's inter-token gaps: the time between its content chunks)."""
    return [later - earlier for earlier, later in zip(times_ms, times_ms[1:])]


def relative_spread(values: Sequence[float]) -> float | None:
    """(max - min) / median; None for fewer than two values or a zero median."""
    if len(values) < 2:
        return None
    mid = median(values)
    return (max(values) - min(values)) / abs(mid) if mid else None


def summarize(repeats: Sequence[Mapping[str, Any]], medians: Sequence[str], ranges: Sequence[str]) -> dict[str, Any]:
    """One document from several repeats of the same measurement: each field in ``medians`` becomes the median
    of its repeats (None stays None when any repeat lacks it), and each field in ``ranges`` also gets its min and
    max beside it. The caller adds ``repeats`` itself, so it chooses what each repeat keeps."""
    doc: dict[str, Any] = {}
    for key in medians:
        values = [row.get(key) for row in repeats]
        if any(value is None for value in values):
            doc[key] = values[0] if len(set(map(repr, values))) == 1 else None
            continue
        doc[key] = median(values)
        if key in ranges:
            doc[key + MIN_SUFFIX] = min(values)
            doc[key + MAX_SUFFIX] = max(values)
    return doc


def repeat_suffix(number: int) -> str:
    """Raw stream names: repeat 1 keeps the plain name (``raw/prefill-12docs.sse``), later ones get ``-r2``..."""
    return "" if number == 1 else f"-r{number}"


# --- the rank test of ``compare`` ----------------------------------------------------------------------------------

# The exact distribution is counted while the pooled values have at most this many splits C(n1 + n2, n1) (about
# ten samples a side); above it, the normal approximation.
EXACT_SPLITS_MAX = 200_000


def _ranked(a: Sequence[float], b: Sequence[float]) -> tuple[int, list[int], list[int]]:
    """One sort of the pooled values: (twice the rank sum of ``a``, twice every value's midrank, the size of every
    group of ties). Midranks doubled are whole numbers, so the exact distribution can count them."""
    pooled = sorted([(value, 0) for value in a] + [(value, 1) for value in b], key=lambda pair: pair[0])
    doubled: list[int] = []
    ties: list[int] = []
    sum_a = 0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        rank = i + j + 2  # twice the mean of positions i+1 .. j+1
        ties.append(j - i + 1)
        for k in range(i, j + 1):
            doubled.append(rank)
            if pooled[k][1] == 0:
                sum_a += rank
        i = j + 1
    return sum_a, doubled, ties


def _exact_tail(doubled: Sequence[int], n1: int, observed: int, mean: int) -> float:
    """The share of the C(n, n1) splits whose doubled U is at least ``observed`` from ``mean``: a count of the
    subsets of size n1 by their rank sum (dynamic programming over the ranks, no enumeration of splits)."""
    counts: list[dict[int, int]] = [{0: 1}] + [{} for _ in range(n1)]
    for rank in doubled:
        for size in range(n1, 0, -1):
            below, here = counts[size - 1], counts[size]
            for total, ways in below.items():
                here[total + rank] = here.get(total + rank, 0) + ways
    offset = n1 * (n1 + 1)
    extreme = sum(ways for total, ways in counts[n1].items() if abs(total - offset - mean) >= observed)
    return extreme / math.comb(len(doubled), n1)


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test (ties as midranks): exact while there are at most
    EXACT_SPLITS_MAX splits of the pooled values (no table, no scipy), else the normal approximation with tie and
    continuity correction. One sort of the pooled samples, so O(n log n) on the sample counts."""
    n1, n2 = len(a), len(b)
    if not n1 or not n2:
        raise ValueError("the rank test needs samples on both sides")
    sum_a, doubled, ties = _ranked(a, b)
    # Everything doubled, so that midranks stay whole numbers: U = R1 - n1 (n1 + 1) / 2, its mean n1 n2 / 2.
    mean = n1 * n2
    observed = abs(sum_a - n1 * (n1 + 1) - mean)
    if math.comb(n1 + n2, n1) <= EXACT_SPLITS_MAX:
        return _exact_tail(doubled, n1, observed, mean)
    total = n1 + n2
    tie_term = sum(t ** 3 - t for t in ties)
    sigma = math.sqrt(n1 * n2 / 12 * ((total + 1) - tie_term / (total * (total - 1))))
    if sigma == 0:
        return 1.0
    return math.erfc(max(observed / 2 - 0.5, 0.0) / sigma / math.sqrt(2))
