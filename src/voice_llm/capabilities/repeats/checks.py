"""Checks of the repeats (``--repeat N``): the brief's numbers are the medians of what was kept, and the relations
that hold for every single measurement (token counts, the order of times within one answer) hold in each repeat.

Times compared across requests (12 documents slower than none, a miss slower than a hit) are checked on the
medians by ``voice_llm.core.checks.core``; token counts do not drift with the machine's load, so they are checked per repeat.
Every relation here is an invariant (FAIL when broken) except how far below the miss a hit's token count is,
an expectation (a finding; see CACHE_HIT_TOKENS_SHARE).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from voice_llm.core.checks.base import NotCheckable, expect, unless_missed
from voice_llm.core.checks.base import require as _require
from voice_llm.core.checks.core import CACHE_HIT_TOKENS_SHARE, CACHE_PREFIX_TOKENS_SHARE
from voice_llm.core.run.folder import RunFolder
from voice_llm.core.scenario import brief
from voice_llm.core.util import artifacts as names
from voice_llm.core.util import stats

__all__ = ["CACHE_HIT_TOKENS_SHARE", "CACHE_PREFIX_TOKENS_SHARE", "check_cache_repeats", "check_cancel_repeats",
           "check_prefill_repeats", "check_sentence_repeats"]


def _repeats(doc: Mapping[str, Any], where: str) -> list[Any]:
    repeats = doc.get("repeats")
    if repeats is None:
        raise NotCheckable(f"{where} has no repeats (written before --repeat existed): one measurement")
    _require(isinstance(repeats, list) and len(repeats) >= 1, f"{where}: repeats is not a non-empty list")
    return repeats


def _unknown(doc: Mapping[str, Any], key: str, checked: str) -> None:
    """After what could be checked: NotCheckable naming it and why ``key`` is null (a server without timings)."""
    reason = (doc.get("unknown") or {}).get(key) if isinstance(doc.get("unknown"), Mapping) else None
    raise NotCheckable(f"{checked}; {key} is null in the repeats: {reason or 'no reason recorded'}")


def _medians_right(doc: Mapping[str, Any], repeats: Sequence[Mapping[str, Any]], fields: Sequence[str],
                   where: str) -> None:
    for key in fields:
        values = [r.get(key) for r in repeats]
        if any(v is None for v in values):  # a field the server did not send (cache_n), or an older file
            continue
        _require(doc[key] == stats.median(values), f"{where} {key} {doc[key]} is not the median of {values}")
        for suffix, expected in ((stats.MIN_SUFFIX, min(values)), (stats.MAX_SUFFIX, max(values))):
            if key + suffix in doc:
                _require(doc[key + suffix] == expected, f"{where} {key}{suffix} {doc[key + suffix]} is not {expected}")


def check_prefill_repeats(out: RunFolder | Path) -> str:
    """Invariants: the medians and ranges are those of the repeats (stats.median); the step asked for no cache
    and the server reused none; prompt_n (a token count) grows with the documents in every repeat."""
    rows = RunFolder.of(out).json(names.PREFILL)
    per_row = [_repeats(row, f"prefill {row.get('docs')} docs") for row in rows]
    counts = {len(r) for r in per_row}
    _require(len(counts) == 1, f"the prefill rows hold different numbers of repeats: {sorted(counts)}")
    for row, repeats in zip(rows, per_row):
        _medians_right(row, repeats, ("prompt_n", "prompt_ms", "ttft_ms", "total_ms"), f"prefill {row['docs']} docs")
        _require(all(r.get("cache_n") in (0, None) for r in repeats), f"prefill {row['docs']} docs reused the cache")
    n = counts.pop()
    if any(r.get("prompt_n") is None for repeats in per_row for r in repeats):
        _unknown(rows[0], "prompt_n", f"{n} repeats; medians and ranges of the times right")
    for i in range(n):
        tokens = [repeats[i]["prompt_n"] for repeats in per_row]
        _require(tokens == sorted(set(tokens)), f"repeat {i + 1}: prompt_n does not grow with documents: {tokens}")
    return f"{n} repeats; medians and ranges right; prompt_n grows in every repeat, no cache reuse"


def check_cache_repeats(out: RunFolder | Path) -> str:
    """Invariants: the medians are the repeats'; in every repeat the hit and the changed suffix computed fewer
    tokens than the miss, the changed prefix more than the hit. Expectation (a finding): by the shares."""
    doc = RunFolder.of(out).json(names.CACHE)
    repeats = _repeats(doc, names.CACHE)
    for case in ("first", "second", "changed_suffix", "changed_prefix"):
        _medians_right(doc[case], [r[case] for r in repeats], ("prompt_n", "cache_n", "ttft_ms", "total_ms"), case)
    if any(r[case].get("prompt_n") is None for r in repeats for case in ("first", "second")):
        _unknown(doc, "prompt_n", f"{len(repeats)} repeats; medians of the times right")
    missed: list[str] = []
    for i, r in enumerate(repeats, 1):
        first, second = r["first"]["prompt_n"], r["second"]["prompt_n"]
        suffix, prefix = r["changed_suffix"]["prompt_n"], r["changed_prefix"]["prompt_n"]
        _require(second < first, f"repeat {i}: second prompt_n {second} is not below first {first}: no cache hit")
        _require(suffix < first, f"repeat {i}: changed_suffix prompt_n {suffix} is not below first {first}")
        _require(prefix > second, f"repeat {i}: changed_prefix prompt_n {prefix} is not above the hit's {second}: "
                 "a miss was expected")
        expect(second <= CACHE_HIT_TOKENS_SHARE * first, f"repeat {i}: second prompt_n {second} is more than "
               f"{CACHE_HIT_TOKENS_SHARE:.0%} of first {first}", missed)
        expect(suffix <= CACHE_HIT_TOKENS_SHARE * first, f"repeat {i}: changed_suffix prompt_n {suffix} is more "
               f"than {CACHE_HIT_TOKENS_SHARE:.0%} of first {first}", missed)
        expect(prefix >= CACHE_PREFIX_TOKENS_SHARE * first, f"repeat {i}: changed_prefix prompt_n {prefix} is less "
               f"than {CACHE_PREFIX_TOKENS_SHARE:.0%} of first's {first}", missed)
    return unless_missed(f"{len(repeats)} repeats; medians right; hit, suffix hit and prefix miss in every repeat "
                         "(prompt_n)", missed)


def check_sentence_repeats(out: RunFolder | Path) -> str:
    """Invariants: the medians are the repeats'; ttft <= first sentence <= total in each (one answer, one clock);
    the kept text is the median repeat's."""
    doc = RunFolder.of(out).json(names.SENTENCE)
    repeats = _repeats(doc, names.SENTENCE)
    _medians_right(doc, repeats, ("ttft_ms", "first_sentence_ms", "total_ms", "smart_first_sentence_ms"), "sentence")
    for i, r in enumerate(repeats, 1):
        _require(r["ttft_ms"] <= r["first_sentence_ms"] <= r["total_ms"], f"repeat {i}: not ttft {r['ttft_ms']:.0f} "
                 f"<= first sentence {r['first_sentence_ms']:.0f} <= total {r['total_ms']:.0f}")
        _require(r["text"].strip().startswith(r["first_sentence"]), f"repeat {i}: first_sentence is not the start of text")
    middle = doc.get("median_repeat")
    _require(isinstance(middle, int) and 1 <= middle <= len(repeats), f"median_repeat {middle!r} is not a repeat")
    _require(doc["text"] == repeats[middle - 1]["text"], f"text is not the median repeat's ({middle})")
    return f"{len(repeats)} repeats; medians right; ttft <= first sentence <= total in every repeat"


def check_cancel_repeats(out: RunFolder | Path) -> str:
    """Invariants: the median is the repeats'; each repeat is a cut (fewer tokens than max_tokens, closed after
    the 0.5 s mark) and, where the log is ours, logged. The idle time's bound is check_cancel's expectation."""
    doc = RunFolder.of(out).json(names.CANCEL)
    repeats = _repeats(doc, names.CANCEL)
    if any(r.get("closed_at_ms") is None for r in repeats):  # an answer ended before the cut: nothing was cut
        _unknown(doc, "closed_at_ms", f"{len(repeats)} repeats")
    idle = [r["slot_idle_after_ms"] for r in repeats]
    observed = all(value is not None for value in idle)  # None: the server's stop was not observable
    by = "slot_idle_after_ms" if observed else "closed_at_ms"  # the step picks the median cut by this
    values = [r[by] for r in repeats]
    _require(doc[by] == stats.median(values), f"{by} is not the median of {values}")
    middle = doc.get("median_repeat")
    _require(isinstance(middle, int) and 1 <= middle <= len(repeats), f"median_repeat {middle!r} is not a repeat")
    for key in ("received_tokens", "closed_at_ms"):
        _require(doc[key] == repeats[middle - 1][key], f"{key} is not the median repeat's ({middle})")
    for i, r in enumerate(repeats, 1):
        _require(0 < r["received_tokens"] < r["max_tokens"], f"repeat {i}: received {r['received_tokens']} of "
                 f"{r['max_tokens']} tokens: not a cut")
        _require(r["closed_at_ms"] >= brief.CANCEL_CLOSE_AFTER_MS, f"repeat {i}: closed at {r['closed_at_ms']:.0f} ms")
        _require(r.get("cancel_logged") is not False, f"repeat {i}: the server log shows no 'cancel task'")
    if not observed:
        _unknown(doc, "slot_idle_after_ms", f"{len(repeats)} repeats: each cut the answer")
    return f"{len(repeats)} repeats: each cut the answer; idle {min(idle):.1f}..{max(idle):.1f} ms, median {doc['slot_idle_after_ms']:.1f}"
