"""Medians and spread over repeated measurements: the one rule every step, ``check`` and ``compare`` share.

The median is the middle of the sorted values, and for an even count the upper of the two middle ones (the
brief's "third of five" rule for ttft.json, extended): always a value that was really measured, so a step can
point at the repeat it came from and ``check`` can recompute it exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Fields added beside a median: ``<field>_min`` and ``<field>_max``.
MIN_SUFFIX = "_min"
MAX_SUFFIX = "_max"


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no values")
    return sorted(values)[len(values) // 2]


def median_index(values: Sequence[float]) -> int:
    """The position (in measuring order) of the repeat whose value is the median; the first such on ties."""
    target = median(values)
    return next(i for i, value in enumerate(values) if value == target)


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
