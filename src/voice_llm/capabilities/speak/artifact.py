"""audio.json and the WAVs under audio/: built from the spoken answers, read back by check and report."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from voice_llm.core.util import stats as _stats
from voice_llm.core.util.artifacts import AUDIO, AUDIO_DIR
from voice_llm.engines.speech_out.live import SpokenAnswer
from voice_llm.engines.speech_out.timeline import Playback
from voice_llm.engines.audio.wav import silence

__all__ = ["AUDIO", "AUDIO_DIR", "PLAYBACK_MODEL", "heard_pcm", "median_run", "run_dict", "spread", "summary", "wav_entry"]

PLAYBACK_MODEL = (
    "chunk level: each piece of audio the engine yields (Piper: one per sentence of the segment) plays as soon "
    "as it is ready and the audio before it has finished; playback starts at the first piece (TTFA); every "
    "silence after that is a stall"
)
# The per-run numbers summarised as median/min/max for each strategy.
SUMMARY_FIELDS = ("ttfa_ms", "stall_count", "stall_ms", "end_ms", "first_text_ms", "ttft_ms", "overhead_ms",
                  "handoff_ms")


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median (the project's one rule, voice_llm.core.util.stats.median: a value some run measured), min and max."""
    return {"median": _stats.median(values), "min": min(values), "max": max(values)}


def run_dict(run: int, raw: str, answer: SpokenAnswer, alone_ms: float) -> dict[str, Any]:
    """One live run of one strategy. ``alone_ms``: the first segment's time to first audio synthesized alone;
    the pipeline overhead is what TTFA adds beyond text-ready + that. Of it, ``handoff_ms`` (text ready to
    synthesis start: queue and thread wake-up) is the pipeline's own part; the rest is synthesis slowed down by
    sharing the CPU with the LLM that is still generating."""
    stream = answer.stream
    first = answer.segments[0]
    return {
        "run": run,
        "raw": raw,
        "ttft_ms": stream.ttft_ms,
        "total_ms": stream.total_ms,
        "first_text_ms": first.text_ready_ms,
        "first_segment_alone_ms": alone_ms,
        "overhead_ms": answer.playback.ttfa_ms - (first.text_ready_ms + alone_ms),
        "handoff_ms": first.synth_start_ms - first.text_ready_ms,
        **answer.playback.as_dict(),
        "text": stream.text,
        "chunks": [chunk.as_dict() for chunk in stream.chunks],
        "segments": [segment.as_dict() for segment in answer.segments],
    }


def summary(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    return {name: spread([run[name] for run in runs]) for name in SUMMARY_FIELDS}


def median_run(runs: Sequence[Mapping[str, Any]]) -> int:
    """The index of the run whose TTFA is the median (voice_llm.core.util.stats's rule: the upper middle for an even
    count), so the WAVs are of the run whose TTFA audio.json states as the median."""
    return _stats.median_index([run["ttfa_ms"] for run in runs])


def heard_pcm(answer: SpokenAnswer, sample_rate: int) -> bytes:
    """The answer as the caller hears it from the first sound on: the audio in order, stalls as silence."""
    return _with_gaps(answer.playback, [pcm for segment in answer.segments for pcm in segment.pcm], sample_rate)


def _with_gaps(heard: Playback, pcms: Sequence[bytes], sample_rate: int) -> bytes:
    parts: list[bytes] = []
    previous_end = heard.ttfa_ms
    for played, pcm in zip(heard.played, pcms, strict=True):
        parts.append(silence(played.start_ms - previous_end, sample_rate))
        parts.append(pcm)
        previous_end = played.end_ms
    return b"".join(parts)


def wav_entry(path: str, run: int, frames: int, sample_rate: int) -> dict[str, Any]:
    return {"path": path, "run": run, "frames": frames, "duration_ms": frames * 1000.0 / sample_rate}
