"""The endpointer on hand-made probability sequences: pure, no audio, no clock."""

from __future__ import annotations

import pytest

from voice_llm.converse.step import breakdown
from voice_llm.speech.vad import (ENDPOINT, PREEMPTIVE, RESUMED, SPEECH_END, SPEECH_START, Endpointer, Event)
from voice_llm.errors import ConfigError


def run(probs: list[float], **kw: float) -> list[tuple[str, int]]:
    ep = Endpointer(**kw)  # type: ignore[arg-type]
    return [(e.kind, e.frame) for p in probs for e in ep.push(p)]


S, Q = 0.9, 0.1  # a speech frame and a silent frame


def test_endpoint_after_ten_silent_frames_at_300_ms() -> None:
    probs = [Q] * 3 + [S] * 5 + [Q] * 12
    assert run(probs, endpoint_ms=300) == [(SPEECH_START, 3), (SPEECH_END, 8), (ENDPOINT, 17)]


def test_threshold_is_inclusive() -> None:
    assert run([0.5, 0.49], endpoint_ms=32) == [(SPEECH_START, 0), (SPEECH_END, 1), (ENDPOINT, 1)]


def test_short_pause_resumes_without_endpoint() -> None:
    probs = [S] * 4 + [Q] * 9 + [S] * 2 + [Q] * 10
    assert run(probs, endpoint_ms=300) == [(SPEECH_START, 0), (SPEECH_END, 4), (RESUMED, 13), (SPEECH_END, 15),
                                           (ENDPOINT, 24)]


def test_preemptive_fires_once_per_pause_before_the_endpoint() -> None:
    probs = [S] * 3 + [Q] * 6 + [S] + [Q] * 10
    events = run(probs, endpoint_ms=300, preemptive_ms=150)
    assert events == [(SPEECH_START, 0), (SPEECH_END, 3), (PREEMPTIVE, 7), (RESUMED, 9), (SPEECH_END, 10),
                      (PREEMPTIVE, 14), (ENDPOINT, 19)]


def test_without_preemptive_no_preemptive_event() -> None:
    assert PREEMPTIVE not in [k for k, _ in run([S] * 3 + [Q] * 12, endpoint_ms=300)]


def test_silence_only_and_a_new_turn_after_the_endpoint() -> None:
    assert run([Q] * 20) == []
    probs = [S] * 2 + [Q] * 10 + [Q] * 5 + [S] * 2 + [Q] * 10
    assert run(probs, endpoint_ms=300) == [(SPEECH_START, 0), (SPEECH_END, 2), (ENDPOINT, 11),
                                           (SPEECH_START, 17), (SPEECH_END, 19), (ENDPOINT, 28)]


def test_event_carries_silence_counted_in_audio() -> None:
    ep = Endpointer(endpoint_ms=200)
    events = [e for p in [S] + [Q] * 7 for e in ep.push(p)]
    assert events[-1] == Event(ENDPOINT, 7, 7 * 32.0)


@pytest.mark.parametrize("kw", [{"endpoint_ms": 0}, {"endpoint_ms": 300, "preemptive_ms": 300},
                                {"endpoint_ms": 300, "threshold": 1.0}])
def test_bad_settings_are_config_errors(kw: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        Endpointer(**kw)  # type: ignore[arg-type]


def test_breakdown_sums_to_the_gap_and_needs_every_event() -> None:
    events = {"speech_end": 1000.0, "turn_detected": 1390.5, "stt_end": 1800.25, "first_token": 1900.0,
              "first_segment_text": 2010.0, "first_audio_ready": 2100.125, "playback_start": 2100.125}
    parts = breakdown(events)
    assert parts is not None and list(parts) == ["endpoint_wait", "stt", "request_to_first_token",
                                                 "first_token_to_first_segment", "segment_to_first_audio",
                                                 "audio_to_playback"]
    assert sum(parts.values()) == pytest.approx(events["playback_start"] - events["speech_end"], abs=1e-6)
    assert breakdown({**events, "stt_end": None}) is None
