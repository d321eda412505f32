"""Step 8: report.json, copied from the files of the earlier steps (never from memory), and what it means."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voice_llm.analysis import noise
from voice_llm.util.artifacts import CACHE, CANCEL, PREFILL, REPORT, TTFT, read_json
from voice_llm.analysis.keynumbers import build_report
from voice_llm.analysis.metrics import CACHE_NOT_DISABLED, cache_not_disabled
from voice_llm.lab.context import LabContext


def run(ctx: LabContext) -> list[Path]:
    report = build_report(ctx.out)
    # Beside the brief's fields: was the machine quiet enough to trust them (run.json is not saved yet: the
    # run's record in memory holds the load so far).
    report["noise"] = noise.assess(ctx.out, ctx.run.doc if ctx.run is not None else None)
    return [ctx.write_json(REPORT, report)]


@dataclass(frozen=True)
class Finding:
    label: str
    value: str
    meaning: str


def _first_audio(report: dict[str, Any]) -> list[Finding]:
    """The speak step's row, when it ran: what the caller hears, sentence by sentence against the whole answer."""
    if "ttfa_sentences_ms" not in report:
        return []
    return [Finding(
        "first audio (TTS, sentence by sentence, p50)", f"{report['ttfa_sentences_ms']:.0f} ms",
        f"when the caller hears the first sound; first clause {report['ttfa_clauses_ms']:.0f} ms, whole answer "
        f"{report['ttfa_whole_ms']:.0f} ms; silence after the start {report['stall_ms_sentences']:.0f} ms",
    )]


def _ms(value: Any) -> str:
    return f"{value:.0f} ms" if isinstance(value, (int, float)) and not isinstance(value, bool) else "n/a"


def findings(out: Path) -> list[Finding]:
    """The key numbers with one plain sentence each on what they mean for composing a voice prompt.
    A number the server did not expose shows as n/a, and its sentence says why."""
    report = read_json(out / REPORT)
    prefill = read_json(out / PREFILL)
    cache = read_json(out / CACHE)
    cancel = read_json(out / CANCEL)
    bare = prefill[0]
    suffix = cache.get("changed_suffix", {})
    prefix = cache.get("changed_prefix", {})
    tokens = report["prompt_n_12docs"]
    idle_unknown = (cancel.get("unknown") or {}).get("slot_idle_after_ms") if isinstance(cancel, dict) else None
    return [
        # "cache off" only where it held: a server that ignores cache_prompt (ttft.json says so) served hits.
        Finding(f"first token (p50, {CACHE_NOT_DISABLED if cache_not_disabled(read_json(out / TTFT)) else 'cache off'})",
                _ms(report["ttft_p50_ms"]),
                f"the floor for a short prompt; a whole answer took {_ms(report['total_p50_ms'])}"),
        Finding("first sentence", _ms(report["first_sentence_ms"]),
                "when speech can start if the assistant speaks sentence by sentence instead of waiting for the end"),
        *_first_audio(report),
        Finding(f"12 documents ({tokens if tokens is not None else 'n/a'} prompt tokens)", _ms(report["ttft_12docs_ms"]),
                f"before the first word, against {_ms(bare['ttft_ms'])} with none: every attached document is paid "
                "for in prefill"),
        Finding("same long prompt, cached", _ms(report["cache_ttft_ms"]),
                "keep the long fixed part identical and first, and the cache skips its prefill"),
        Finding("time line at the end / at the front",
                f"{_ms(suffix.get('ttft_ms'))} / {_ms(prefix.get('ttft_ms'))}",
                "put what changes per call (time, caller, turn) last; a change at the front recomputes everything"),
        Finding("barge-in: slot idle after close", _ms(report["cancel_idle_ms"]),
                idle_unknown or "closing the connection stops generation almost at once; only stopping reading does not"),
    ]
