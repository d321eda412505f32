"""The key numbers of a run: report.json's fields, where each is copied from, and what it is called.

One table read by the report step (which writes report.json), by ``check`` (which re-derives report.json from the
same sources) and by the HTML report and the summary (labels and units). The brief's seven fields come first and
are always present; fields of optional steps are added beside them when their artifact exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voice_llm.util import artifacts as names
from voice_llm.util.artifacts import read_json
from voice_llm.errors import ArtifactError
from voice_llm.analysis.metrics import CACHE_NOT_DISABLED, cache_not_disabled
from voice_llm.tts.segmenting import STRATEGY_LABELS


@dataclass(frozen=True)
class KeyNumber:
    key: str
    label: str
    unit: str
    source: str
    path: tuple[str | int, ...]  # keys / list indexes into the source document
    optional: bool = False  # only when the source artifact exists (a step outside the brief)
    cache_off: bool = False  # measured with cache_prompt false (see metrics.CACHE_NOT_DISABLED)


KEY_NUMBERS: tuple[KeyNumber, ...] = (
    KeyNumber("ttft_p50_ms", "median time to first token", "ms", names.TTFT, ("ttft_p50",), cache_off=True),
    KeyNumber("total_p50_ms", "median time to the whole answer", "ms", names.TTFT, ("total_p50",), cache_off=True),
    KeyNumber("ttft_12docs_ms", "time to first token with 12 documents", "ms", names.PREFILL, (-1, "ttft_ms"),
              cache_off=True),
    KeyNumber("prompt_n_12docs", "prompt size with 12 documents", "tokens", names.PREFILL, (-1, "prompt_n"),
              cache_off=True),
    KeyNumber("cache_ttft_ms", "time to first token, cached prompt", "ms", names.CACHE, ("second", "ttft_ms")),
    KeyNumber("first_sentence_ms", "time to the first sentence", "ms", names.SENTENCE, ("first_sentence_ms",)),
    KeyNumber("cancel_idle_ms", "slot idle after cancel", "ms", names.CANCEL, ("slot_idle_after_ms",)),
    # The speak step (voice_llm.tts): time to first audio and silence after it, medians per strategy.
    *(KeyNumber(f"ttfa_{s}_ms", f"first audio, {label} (median)", "ms", names.AUDIO,
                ("strategies", s, "summary", "ttfa_ms", "median"), optional=True) for s, label in STRATEGY_LABELS.items()),
    *(KeyNumber(f"stall_ms_{s}", f"silence after first audio, {label} (median)", "ms", names.AUDIO,
                ("strategies", s, "summary", "stall_ms", "median"), optional=True) for s, label in STRATEGY_LABELS.items()),
)

LABELS: dict[str, tuple[str, str]] = {k.key: (k.label, k.unit) for k in KEY_NUMBERS}


def labels(out: Path) -> dict[str, tuple[str, str]]:
    """LABELS for the run in ``out``: a number measured with the cache off on a server that may have ignored
    that says "cache not disabled" in its label (a condition that did not hold is not claimed)."""
    found = dict(LABELS)
    docs: dict[str, Any] = {}
    for number in KEY_NUMBERS:
        if not number.cache_off:
            continue
        if number.source not in docs:
            try:
                docs[number.source] = read_json(out / number.source)
            except ArtifactError:
                docs[number.source] = None
        if cache_not_disabled(docs[number.source]):
            found[number.key] = (f"{number.label} ({CACHE_NOT_DISABLED})", number.unit)
    return found


def _follow(doc: Any, path: Sequence[str | int], source: str) -> Any:
    value = doc
    for step in path:
        try:
            value = value[step]
        except (KeyError, IndexError, TypeError) as exc:
            where = ".".join(str(p) for p in path)
            raise ArtifactError(f"{source} has no {where!r}; rerun its step") from exc
    return value


def build_report(out: Path) -> dict[str, Any]:
    """report.json's values, read from the files of the earlier steps (never from memory)."""
    report: dict[str, Any] = {}
    docs: dict[str, Any] = {}
    for number in KEY_NUMBERS:
        if number.source not in docs:
            if number.optional and not (out / number.source).is_file():
                continue
            docs[number.source] = read_json(out / number.source)
        if number.source == names.PREFILL and (not isinstance(docs[number.source], list) or not docs[number.source]):
            raise ArtifactError(f"{names.PREFILL} is not a non-empty list; rerun `voice-llm prefill`")
        report[number.key] = _follow(docs[number.source], number.path, number.source)
    return report
