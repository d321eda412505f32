"""The playback timeline on hand-made timelines: TTFA, stalls and the end the caller hears."""

from __future__ import annotations

import pytest

from voice_llm.engines.speech_out.timeline import AudioPiece, Played, Stall, playback


def test_audio_ready_before_it_is_needed_plays_without_a_gap() -> None:
    heard = playback([AudioPiece(0, 300, 1000), AudioPiece(1, 800, 500)])
    assert heard.ttfa_ms == 300
    assert heard.played == (Played(0, 300, 1300), Played(1, 1300, 1800))
    assert heard.stalls == () and heard.stall_count == 0 and heard.stall_ms == 0
    assert heard.end_ms == 1800


def test_late_audio_is_a_stall_from_the_end_of_the_previous_audio() -> None:
    heard = playback([AudioPiece(0, 300, 400), AudioPiece(1, 900, 500), AudioPiece(2, 1500, 200)])
    assert heard.stalls == (Stall(700, 200, 1), Stall(1400, 100, 2))
    assert heard.stall_count == 2 and heard.stall_ms == pytest.approx(300)
    assert heard.end_ms == 1700


def test_audio_ready_exactly_when_the_previous_ends_is_no_stall() -> None:
    assert playback([AudioPiece(0, 100, 100), AudioPiece(1, 200, 50)]).stalls == ()


def test_pieces_of_one_segment_can_stall_too() -> None:
    """Chunk level: the second sentence of one segment may come after the first has been played."""
    heard = playback([AudioPiece(0, 100, 50), AudioPiece(0, 400, 50)])
    assert heard.stalls == (Stall(150, 250, 0),)


def test_silent_pieces_are_skipped_and_no_sound_at_all_is_an_error() -> None:
    heard = playback([AudioPiece(0, 50, 0), AudioPiece(1, 120, 30)])
    assert heard.ttfa_ms == 120 and heard.played == (Played(1, 120, 150),)
    with pytest.raises(ValueError):
        playback([AudioPiece(0, 50, 0)])


def test_as_dict_carries_the_summary() -> None:
    doc = playback([AudioPiece(0, 10, 5), AudioPiece(1, 20, 5)]).as_dict()
    assert doc["ttfa_ms"] == 10 and doc["end_ms"] == 25 and doc["stall_count"] == 1 and doc["stall_ms"] == 5
    assert doc["stalls"] == [{"at_ms": 15, "ms": 5, "segment": 1}]
