"""Checks of the repeats (``--repeat N``): the brief's numbers are the medians of what was kept, and the relations
that hold for every single measurement (token counts, the order of times within one answer) hold in each repeat.

Times compared across requests (12 documents slower than none, a miss slower than a hit) are checked on the
medians by ``check.py``; token counts do not drift with the machine's load, so they are checked per repeat.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from voice_llm import artifacts as names
from voice_llm import brief, spread
from voice_llm.artifacts import read_json


def _require(condition: bool, detail: str) -> None:
    from voice_llm.check import _require as require  # check.py lists these checks: import it when they run

    require(condition, detail)


def _repeats(doc: Mapping[str, Any], where: str) -> list[Any]:
    from voice_llm.check import NotCheckable

    repeats = doc.get("repeats")
    if repeats is None:
        raise NotCheckable(f"{where} has no repeats (written before --repeat existed): one measurement")
    _require(isinstance(repeats, list) and len(repeats) >= 1, f"{where}: repeats is not a non-empty list")
    return repeats


def _unknown(doc: Mapping[str, Any], key: str, checked: str) -> None:
    """After what could be checked: NotCheckable naming it and why ``key`` is null (a server without timings)."""
    from voice_llm.check import NotCheckable

    reason = (doc.get("unknown") or {}).get(key) if isinstance(doc.get("unknown"), Mapping) else None
    raise NotCheckable(f"{checked}; {key} is null in the repeats: {reason or 'no reason recorded'}")


def _medians_right(doc: Mapping[str, Any], repeats: Sequence[Mapping[str, Any]], fields: Sequence[str],
                   where: str) -> None:
    for key in fields:
        values = [r.get(key) for r in repeats]
        if any(v is None for v in values):  # a field the server did not send (cache_n), or an older file
            continue
        _require(doc[key] == spread.median(values), f"{where} {key} {doc[key]} is not the median of {values}")
        for suffix, expected in ((spread.MIN_SUFFIX, min(values)), (spread.MAX_SUFFIX, max(values))):
            if key + suffix in doc:
                _require(doc[key + suffix] == expected, f"{where} {key}{suffix} {doc[key + suffix]} is not {expected}")


def check_prefill_repeats(out: Path) -> str:
    rows = read_json(out / names.PREFILL)
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


def check_cache_repeats(out: Path) -> str:
    doc = read_json(out / names.CACHE)
    repeats = _repeats(doc, "cache.json")
    for case in ("first", "second", "changed_suffix", "changed_prefix"):
        _medians_right(doc[case], [r[case] for r in repeats], ("prompt_n", "cache_n", "ttft_ms", "total_ms"), case)
    if any(r[case].get("prompt_n") is None for r in repeats for case in ("first", "second")):
        _unknown(doc, "prompt_n", f"{len(repeats)} repeats; medians of the times right")
    for i, r in enumerate(repeats, 1):
        first = r["first"]["prompt_n"]
        _require(r["second"]["prompt_n"] <= first / 10, f"repeat {i}: second prompt_n {r['second']['prompt_n']} "
                 f"is not far below first {first}: no cache hit")
        _require(r["changed_suffix"]["prompt_n"] <= first / 10, f"repeat {i}: changed_suffix prompt_n "
                 f"{r['changed_suffix']['prompt_n']} is not far below first {first}")
        _require(r["changed_prefix"]["prompt_n"] >= 0.9 * first, f"repeat {i}: changed_prefix prompt_n "
                 f"{r['changed_prefix']['prompt_n']} is not about first's {first}: a miss was expected")
    return f"{len(repeats)} repeats; medians right; hit, suffix hit and prefix miss in every repeat (prompt_n)"


def check_sentence_repeats(out: Path) -> str:
    doc = read_json(out / names.SENTENCE)
    repeats = _repeats(doc, "sentence.json")
    _medians_right(doc, repeats, ("ttft_ms", "first_sentence_ms", "total_ms", "smart_first_sentence_ms"), "sentence")
    for i, r in enumerate(repeats, 1):
        _require(r["ttft_ms"] <= r["first_sentence_ms"] <= r["total_ms"], f"repeat {i}: not ttft {r['ttft_ms']:.0f} "
                 f"<= first sentence {r['first_sentence_ms']:.0f} <= total {r['total_ms']:.0f}")
        _require(r["text"].strip().startswith(r["first_sentence"]), f"repeat {i}: first_sentence is not the start of text")
    middle = doc.get("median_repeat")
    _require(isinstance(middle, int) and 1 <= middle <= len(repeats), f"median_repeat {middle!r} is not a repeat")
    _require(doc["text"] == repeats[middle - 1]["text"], f"text is not the median repeat's ({middle})")
    return f"{len(repeats)} repeats; medians right; ttft <= first sentence <= total in every repeat"


def check_cancel_repeats(out: Path) -> str:
    doc = read_json(out / names.CANCEL)
    repeats = _repeats(doc, "cancel.json")
    idle = [r["slot_idle_after_ms"] for r in repeats]
    observed = all(value is not None for value in idle)  # None: the server's stop was not observable
    by = "slot_idle_after_ms" if observed else "closed_at_ms"  # the step picks the median cut by this
    values = [r[by] for r in repeats]
    _require(doc[by] == spread.median(values), f"{by} is not the median of {values}")
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
