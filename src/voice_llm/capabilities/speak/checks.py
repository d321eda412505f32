"""check relations for the speak step's audio.json and WAVs, from the saved files alone.

Nothing is taken on trust: the segments are re-derived from each run's recorded chunks with the same
segmenter, the chunks from the raw stream, the timeline from the segments' audio, the medians from the runs,
and each WAV is decoded to compare its length with what audio.json states.

Every relation is an invariant (FAIL when broken: times of one run on one clock, files equal to what they were
derived from) except which strategy is heard first, an expectation about the machine (a finding).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from voice_llm.core.util.artifacts import AUDIO, loads_json, read_artifact_bytes
from voice_llm.core.checks.base import NotCheckable, expect, unless_missed
from voice_llm.core.checks.base import finite_number as _num
from voice_llm.core.checks.base import require as _require
from voice_llm.core.errors import ArtifactError
from voice_llm.core.run.folder import RunFolder
from voice_llm.core.sse import DONE_DATA, SSEDecoder
from voice_llm.capabilities.speak.artifact import summary
from voice_llm.engines.speech_out.segmenting import DEFAULT_CLAUSE_WORDS, segment_stream
from voice_llm.engines.speech_out.timeline import AudioPiece, playback
from voice_llm.engines.audio.wav import read_wav

TOLERANCE_MS = 1e-6  # numbers recomputed from the same floats


# Registered as CheckEntry items in voice_llm.capabilities.speak.CAPABILITY (run when the run ran the speak step).


def _close(a: float, b: float, tolerance: float = TOLERANCE_MS) -> bool:
    return abs(a - b) <= tolerance


def _runs(doc: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    strategies = doc.get("strategies")
    _require(isinstance(strategies, dict) and bool(strategies), f"{AUDIO} has no strategies")
    for strategy, entry in strategies.items():
        _require(bool(entry.get("runs")), f"{strategy}: no runs")
        for run in entry["runs"]:
            yield strategy, run


def _where(strategy: str, run: Mapping[str, Any]) -> str:
    return f"{strategy} run {run.get('run')}"


def check_first_audio_order(out: RunFolder | Path) -> str:
    """Invariant: ttft <= first segment's text <= first audio, for every strategy and run (one run, one clock)."""
    doc = RunFolder.of(out).json(AUDIO)
    count = 0
    for strategy, run in _runs(doc):
        where = _where(strategy, run)
        ttft, text = _num(run["ttft_ms"], f"{where} ttft_ms"), _num(run["first_text_ms"], f"{where} first_text_ms")
        ttfa = _num(run["ttfa_ms"], f"{where} ttfa_ms")
        _require(ttft <= text <= ttfa, f"{where}: not ttft {ttft:.1f} <= first segment text {text:.1f} <= first audio {ttfa:.1f} ms")
        count += 1
    return f"{count} runs: ttft <= first segment text <= first audio"


def check_segments_follow_stream(out: RunFolder | Path) -> str:
    """Invariant: each run's chunks are its raw stream's content, and its segments are what the strategy makes
    of them (derived files equal their source)."""
    doc = RunFolder.of(out).json(AUDIO)
    clause_words = int(doc.get("clause_words", DEFAULT_CLAUSE_WORDS))
    count = 0
    for strategy, run in _runs(doc):
        where = _where(strategy, run)
        chunks = [(_num(c["t_ms"], f"{where} chunk t_ms"), c["text"]) for c in run["chunks"]]
        _require(bool(chunks) and _close(chunks[0][0], _num(run["ttft_ms"], "ttft_ms")), f"{where}: ttft_ms is not the first chunk's time")
        folder = RunFolder.of(out)
        raw_text = _raw_content(folder.file(run["raw"]), folder)  # never a file outside OUT
        _require("".join(t for _, t in chunks) == raw_text == run["text"], f"{where}: chunks differ from {run['raw']}")
        derived = segment_stream(strategy, chunks, _num(run["total_ms"], "total_ms"), clause_words)
        recorded = [(s["text"], s["text_ready_ms"]) for s in run["segments"]]
        _require(recorded == [(s.text, s.ready_ms) for s in derived],
                 f"{where}: the segments are not what {strategy} cuts from the chunks")
        count += 1
    return f"{count} runs: chunks equal the raw streams, segments re-derived from them"


def _raw_content(path: Path, folder: RunFolder | None = None) -> str:
    """The content of a saved raw stream; read through ``folder`` (once per command) when given."""
    if not path.exists():
        raise ArtifactError(f"the raw stream {path} is missing")
    raw = folder.bytes(path.relative_to(folder.path).as_posix()) if folder else read_artifact_bytes(path)
    text = ""
    for event in SSEDecoder().feed(raw):
        if event.data == DONE_DATA:
            continue
        choices = loads_json(event.data, path.name).get("choices") or [{}]
        text += (choices[0].get("delta") or {}).get("content") or ""
    return text


def check_timeline(out: RunFolder | Path) -> str:
    """Invariant: per segment text ready <= synthesis start <= first audio <= synthesis end, synthesis in order
    (one clock), and the playback (TTFA, stalls, end) and medians recomputed from the segments' audio equal the
    stated ones."""
    doc = RunFolder.of(out).json(AUDIO)
    for strategy, run in _runs(doc):
        where = _where(strategy, run)
        previous_end = -math.inf
        for seg in run["segments"]:
            times = [_num(seg[k], f"{where} {k}") for k in ("text_ready_ms", "synth_start_ms", "first_audio_ms", "synth_end_ms")]
            _require(times == sorted(times) and times[1] >= previous_end,
                     f"{where} segment {seg['index']}: text/synthesis times out of order {times}")
            previous_end = times[3]
            _require(_close(sum(a["audio_ms"] for a in seg["audio"]), _num(seg["audio_ms"], "audio_ms")),
                     f"{where} segment {seg['index']}: audio_ms is not the sum of its pieces")
        heard = playback([AudioPiece(s["index"], a["ready_ms"], a["audio_ms"]) for s in run["segments"] for a in s["audio"]])
        for key, value in (("ttfa_ms", heard.ttfa_ms), ("end_ms", heard.end_ms), ("stall_ms", heard.stall_ms)):
            _require(_close(_num(run[key], key), value, 1e-3), f"{where}: {key} {run[key]} but the segments give {value}")
        _require(run["stall_count"] == heard.stall_count, f"{where}: {run['stall_count']} stalls stated, {heard.stall_count} found")
        first = run["segments"][0]
        for key, value in (("overhead_ms", run["ttfa_ms"] - (first["text_ready_ms"] + run["first_segment_alone_ms"])),
                           ("handoff_ms", first["synth_start_ms"] - first["text_ready_ms"])):
            _require(_close(_num(run[key], key), value, 1e-3), f"{where}: {key} {run[key]} but the times give {value}")
    for strategy, entry in doc["strategies"].items():
        _require(entry["summary"] == summary(entry["runs"]), f"{strategy}: the medians are not those of its runs")
        _require(doc["ttfa_ms"][strategy] == entry["summary"]["ttfa_ms"]["median"], f"ttfa_ms[{strategy}] is not its median")
    return "segment times in order; TTFA, stalls, end and medians recomputed from the audio"


def check_first_text_before_whole(out: RunFolder | Path) -> str:
    """Invariant, on text: in every run the first segment's text is ready no later than the whole answer (its
    last chunk, total_ms, on the same clock), and the `whole` strategy's first segment is the whole answer."""
    doc = RunFolder.of(out).json(AUDIO)
    count = 0
    for strategy, run in _runs(doc):
        where = _where(strategy, run)
        text, total = _num(run["first_text_ms"], f"{where} first_text_ms"), _num(run["total_ms"], f"{where} total_ms")
        _require(text <= total, f"{where}: first segment text {text:.1f} ms after the whole answer {total:.1f} ms")
        if strategy == "whole":
            _require(_close(text, total), f"{where}: the whole answer's segment is ready at {text:.1f} ms, "
                                          f"not at its end {total:.1f} ms")
        count += 1
    return f"{count} runs: first segment text <= the whole answer's, whole ready at the answer's end"


def check_whole_after_sentences(out: RunFolder | Path) -> str:
    """Expectation, a finding when it does not hold: speaking sentence by sentence is heard no later than
    waiting for the whole answer. Not a law: `sentences` synthesizes its first sentence while the LLM still
    generates the rest on the same cores, `whole` synthesizes with the CPU to itself; on a machine with few
    cores the second can win. Which does is a fact about this machine (the text order is the invariant above)."""
    doc = RunFolder.of(out).json(AUDIO)
    medians = {s: doc["strategies"][s]["summary"] for s in ("whole", "sentences")}
    whole, sentences = (_num(medians[s]["ttfa_ms"]["median"], f"{s} TTFA") for s in ("whole", "sentences"))
    text_whole, text_sentences = (_num(medians[s]["first_text_ms"]["median"], f"{s} first text")
                                  for s in ("whole", "sentences"))
    if _close(text_whole, text_sentences, 1.0):
        raise NotCheckable("the answer is one sentence: whole and sentences speak the same segment at the same time")
    missed: list[str] = []
    expect(whole >= sentences, f"whole heard first: TTFA whole {whole:.0f} ms < sentences {sentences:.0f} ms, "
           "synthesis beside the still generating LLM was slower here than waiting for the whole answer", missed)
    return unless_missed(f"TTFA whole {whole:.0f} ms, sentences {sentences:.0f} ms; first text whole "
                         f"{text_whole:.0f} ms, sentences {text_sentences:.0f} ms (medians)", missed)


def check_wavs(out: RunFolder | Path) -> str:
    """Invariant: every WAV exists, decodes, is mono 16-bit at the stated rate, and lasts what audio.json states: the first
    segment its audio_ms, the heard answer its end - TTFA (stalls as silence, one frame of rounding each)."""
    doc = RunFolder.of(out).json(AUDIO)
    rate = int(_num(doc["sample_rate"], "sample_rate"))
    frame_ms = 1000.0 / rate
    count = 0
    for strategy, entry in doc["strategies"].items():
        for kind, wav in entry["wavs"].items():
            info = read_wav(RunFolder.of(out).file(wav["path"]))  # never a file outside OUT
            where = f"{wav['path']}"
            _require((info.channels, info.sample_width, info.sample_rate) == (1, 2, rate),
                     f"{where}: {info.channels} ch, {8 * info.sample_width} bit, {info.sample_rate} Hz; expected mono 16-bit {rate} Hz")
            _require(info.frames == wav["frames"] and _close(info.duration_ms, _num(wav["duration_ms"], "duration_ms"), 1e-3),
                     f"{where}: {info.duration_ms:.1f} ms in the file, {wav['duration_ms']} ms stated")
            run = entry["runs"][wav["run"] - 1]
            if kind == "first_segment":
                expected, slack = run["segments"][0]["audio_ms"], frame_ms
            else:
                expected, slack = run["end_ms"] - run["ttfa_ms"], frame_ms * (run["stall_count"] + 1)
            _require(abs(info.duration_ms - expected) <= slack,
                     f"{where}: lasts {info.duration_ms:.1f} ms, run {wav['run']} says {expected:.1f} ms")
            count += 1
    return f"{count} WAVs decode and last what audio.json states"
