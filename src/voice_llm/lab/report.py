"""Step 8: report.json, copied from the files of the earlier steps (never from memory), and what it means."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voice_llm.artifacts import CACHE, CANCEL, PREFILL, REPORT, SENTENCE, TTFT, read_json, write_json
from voice_llm.errors import ArtifactError
from voice_llm.lab.context import LabContext


def _field(doc: Any, key: str, source: str) -> Any:
    try:
        return doc[key]
    except (KeyError, IndexError, TypeError) as exc:
        raise ArtifactError(f"{source} has no {key!r}; rerun its step") from exc


def build_report(out: Path) -> dict[str, Any]:
    ttft = read_json(out / TTFT)
    prefill = read_json(out / PREFILL)
    cache = read_json(out / CACHE)
    sentence = read_json(out / SENTENCE)
    cancel = read_json(out / CANCEL)
    if not isinstance(prefill, list) or not prefill:
        raise ArtifactError(f"{PREFILL} is not a non-empty list; rerun `voice-llm prefill`")
    last = prefill[-1]
    return {
        "ttft_p50_ms": _field(ttft, "ttft_p50", TTFT),
        "total_p50_ms": _field(ttft, "total_p50", TTFT),
        "ttft_12docs_ms": _field(last, "ttft_ms", PREFILL),
        "prompt_n_12docs": _field(last, "prompt_n", PREFILL),
        "cache_ttft_ms": _field(_field(cache, "second", CACHE), "ttft_ms", CACHE),
        "first_sentence_ms": _field(sentence, "first_sentence_ms", SENTENCE),
        "cancel_idle_ms": _field(cancel, "slot_idle_after_ms", CANCEL),
    }


def run(ctx: LabContext) -> list[Path]:
    return [write_json(ctx.path(REPORT), build_report(ctx.out))]


@dataclass(frozen=True)
class Finding:
    label: str
    value: str
    meaning: str


def findings(out: Path) -> list[Finding]:
    """The key numbers with one plain sentence each on what they mean for composing a voice prompt."""
    report = read_json(out / REPORT)
    prefill = read_json(out / PREFILL)
    cache = read_json(out / CACHE)
    bare = prefill[0]
    suffix = cache.get("changed_suffix", {})
    prefix = cache.get("changed_prefix", {})
    return [
        Finding("first token (p50, cache off)", f"{report['ttft_p50_ms']:.0f} ms",
                f"the floor for a short prompt; a whole answer took {report['total_p50_ms']:.0f} ms"),
        Finding("first sentence", f"{report['first_sentence_ms']:.0f} ms",
                "when speech can start if the assistant speaks sentence by sentence instead of waiting for the end"),
        Finding(f"12 documents ({report['prompt_n_12docs']} prompt tokens)", f"{report['ttft_12docs_ms']:.0f} ms",
                f"before the first word, against {bare['ttft_ms']:.0f} ms with none: every attached document is paid "
                "for in prefill"),
        Finding("same long prompt, cached", f"{report['cache_ttft_ms']:.0f} ms",
                "keep the long fixed part identical and first, and the cache skips its prefill"),
        Finding("time line at the end / at the front",
                f"{suffix.get('ttft_ms', float('nan')):.0f} / {prefix.get('ttft_ms', float('nan')):.0f} ms",
                "put what changes per call (time, caller, turn) last; a change at the front recomputes everything"),
        Finding("barge-in: slot idle after close", f"{report['cancel_idle_ms']:.0f} ms",
                "closing the connection stops generation almost at once; only stopping reading does not"),
    ]
