"""audio.json helpers on hand-made answers: the heard WAV puts stalls in as silence, medians and the median run."""

from __future__ import annotations

import pytest

from voice_llm.core.sse import Chunk, StreamResult
from voice_llm.capabilities.speak.artifact import heard_pcm, median_run, run_dict, spread, summary
from voice_llm.engines.speech_out.live import SpokenSegment, SpokenAnswer, pieces
from voice_llm.engines.speech_out.timeline import playback

RATE = 1000  # one frame per ms keeps the arithmetic visible


def _segment(index: int, ready: float, frames: list[int], start: float) -> SpokenSegment:
    audio = []
    t = start
    for n in frames:
        t += 10
        audio.append((t, float(n)))
    pcm = tuple(bytes([index + 1, 0]) * n for n in frames)
    return SpokenSegment(index, f"segment {index}.", ready, start, audio[0][0], t, tuple(audio), pcm)


def _answer() -> SpokenAnswer:
    # Segment 0: two pieces of 100 and 50 ms ready at 110 and 120 ms. Segment 1: 40 ms ready at 400 ms, while
    # playback ran dry at 110 + 150 = 260 ms: a 140 ms stall.
    segments = (_segment(0, 50, [100, 50], 100), _segment(1, 300, [40], 390))
    stream = StreamResult((Chunk(20.0, "segment 0."), Chunk(300.0, " segment 1.")), 320.0, None, 20.0, "stop",
                          None, {}, 0, True, False)
    return SpokenAnswer("sentences", stream, segments, playback(pieces(segments)))


def test_heard_audio_is_the_pieces_with_each_stall_as_silence() -> None:
    answer = _answer()
    assert answer.playback.ttfa_ms == 110 and answer.playback.stall_ms == 140 and answer.playback.end_ms == 440
    heard = heard_pcm(answer, RATE)
    assert heard == b"\x01\x00" * 150 + b"\x00\x00" * 140 + b"\x02\x00" * 40
    assert len(heard) // 2 == answer.playback.end_ms - answer.playback.ttfa_ms


def test_run_dict_overhead_and_summary() -> None:
    row = run_dict(1, "raw/speak-sentences-1.sse", _answer(), alone_ms=30.0)
    assert row["first_text_ms"] == 50 and row["ttft_ms"] == 20.0
    assert row["overhead_ms"] == pytest.approx(110 - (50 + 30))
    assert row["handoff_ms"] == 100 - 50
    assert row["segments"][1]["audio"] == [{"ready_ms": 400.0, "audio_ms": 40.0}]
    rows = [dict(row, ttfa_ms=t) for t in (300.0, 100.0, 200.0)]
    assert summary(rows)["ttfa_ms"] == spread([100.0, 200.0, 300.0]) == {"median": 200.0, "min": 100.0, "max": 300.0}
    assert median_run(rows) == 2
    assert median_run(rows[:2]) == 0  # even count: the upper middle (300 ms), the one median rule (util.stats.median)
    assert spread([300.0, 100.0])["median"] == 300.0  # a value a run measured, not the mean of the two
