"""What the agent takes as heard (voice_llm.capabilities.agent.heard): pure, on a clock the test sets."""

from __future__ import annotations

import pytest

from voice_llm.capabilities.agent.heard import SentSegment, heard_prefix, played_s, playing_until, words_heard


def test_segments_play_one_after_another_from_their_first_frame() -> None:
    segments = [SentSegment(first_sent=10.0, audio_s=2.0), SentSegment(first_sent=10.5, audio_s=1.0)]
    assert played_s(segments, 9.0) == [0.0, 0.0]
    assert played_s(segments, 11.0) == [1.0, 0.0]
    assert played_s(segments, 12.5) == [2.0, 0.5]  # the second starts when the first has played (12.0)
    assert playing_until(segments) == 13.0


def test_an_echoed_mark_fixes_when_the_next_segment_started() -> None:
    # the caller's jitter delayed the first segment: its mark came back at 12.3, not 12.0
    segments = [SentSegment(10.0, 2.0, echoed=12.3), SentSegment(10.5, 1.0)]
    # before the echo the estimate has the second segment start at 12.0 (an upper bound of what was heard)
    assert played_s(segments, 12.2) == [2.0, pytest.approx(0.2)]
    # after it, the second started at the echo
    assert played_s(segments, 12.8) == [2.0, pytest.approx(0.5)]
    assert playing_until(segments) == pytest.approx(13.3)


def test_an_echo_after_the_moment_does_not_count() -> None:
    segments = [SentSegment(10.0, 2.0, echoed=15.0)]
    assert played_s(segments, 11.0) == [1.0]


def test_words_heard_share_the_samples_by_length_and_count_whole_words() -> None:
    text = "Sure, I can help"  # 4 words: 5 + 1 + 3 + 4 = 13 characters
    assert words_heard(text, 1300, 0) == 0
    assert words_heard(text, 1300, 499) == 0
    assert words_heard(text, 1300, 500) == 1
    assert words_heard(text, 1300, 900) == 3
    assert words_heard(text, 1300, 1300) == 4


def test_heard_prefix_is_always_a_prefix_of_the_reply() -> None:
    reply = "Sure, I can help. Anything else?"
    assert heard_prefix(reply, ["Sure, I can help.", "Anything else?"], [4, 1]) == "Sure, I can help. Anything"
    assert heard_prefix(reply, ["Sure, I can help.", "Anything else?"], [2, 0]) == "Sure, I"
    assert heard_prefix(reply, ["Sure, I can help.", "Anything else?"], [0, 0]) == ""
