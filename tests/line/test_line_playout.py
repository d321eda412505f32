"""The phone's ear (voice_llm.engines.line.playout): driven tick by tick, so every relation is exact in frames."""

from __future__ import annotations

import numpy as np
import pytest

from voice_llm.engines.line.playout import IDLE, PLAYING, WAITING, Playout

FRAME = 160  # 20 ms at 8 kHz
RATE = 8000


def tone(frames: int, value: int = 1000) -> np.ndarray:
    return np.full(frames * FRAME, value, np.int16)


def heard(playout: Playout, ticks: int) -> list[int]:
    """The audio samples of each of the next ``ticks`` frames."""
    return [playout.pop().audio_samples for _ in range(ticks)]


def test_idle_buffer_plays_silence():
    playout = Playout(FRAME, RATE)
    popped = playout.pop()
    assert popped.frame.shape == (FRAME,) and not popped.frame.any()
    assert popped.audio_samples == 0 and playout.state == IDLE


def test_jitter_delay_from_idle_then_one_frame_per_tick():
    playout = Playout(FRAME, RATE, jitter_ms=40)
    playout.pop()  # tick 0 played silence; the audio arrives in tick 1's interval
    playout.push(tone(3))
    assert playout.state == WAITING
    # Ticks 1 and 2 are the 40 ms jitter delay; tick 3 plays the first frame.
    assert heard(playout, 2) == [0, 0]
    first = playout.pop()
    assert first.started and first.audio_samples == FRAME and (first.frame == 1000).all()
    assert heard(playout, 2) == [FRAME, FRAME]
    assert playout.state == IDLE and playout.counts().underruns == 1


def test_zero_jitter_plays_on_the_next_tick():
    playout = Playout(FRAME, RATE, jitter_ms=0)
    playout.push(tone(1))
    assert playout.pop().audio_samples == FRAME


def test_jitter_rounds_up_to_whole_frames():
    assert Playout(FRAME, RATE, jitter_ms=30).jitter_frames == 2
    assert Playout(FRAME, RATE, jitter_ms=40).jitter_frames == 2
    assert Playout(FRAME, RATE, jitter_ms=41).jitter_frames == 3


def test_a_burst_is_heard_over_its_real_length():
    # 3 s of audio arriving at once (an agent sending faster than real time) is heard over 3 s: 150 frames.
    playout = Playout(FRAME, RATE, jitter_ms=40)
    playout.push(tone(150))
    samples = heard(playout, 2 + 150 + 5)
    assert samples[:2] == [0, 0]
    assert samples[2:152] == [FRAME] * 150
    assert samples[152:] == [0] * 5


def test_partial_frame_is_padded_with_silence():
    playout = Playout(FRAME, RATE, jitter_ms=0)
    playout.push(np.full(100, 7, np.int16))
    popped = playout.pop()
    assert popped.audio_samples == 100 and popped.ran_dry
    assert (popped.frame[:100] == 7).all() and not popped.frame[100:].any()


def test_pushes_while_playing_keep_playing_without_a_new_delay():
    playout = Playout(FRAME, RATE, jitter_ms=40)
    playout.push(tone(2))
    assert heard(playout, 3) == [0, 0, FRAME]
    playout.push(tone(2))  # arrives while one frame is still buffered: no gap, no new delay
    assert playout.state == PLAYING
    assert heard(playout, 2) == [FRAME, FRAME]
    assert playout.counts().underruns == 0
    assert heard(playout, 2) == [FRAME, 0]
    assert playout.counts().underruns == 1


def test_after_running_dry_the_next_audio_waits_the_jitter_again():
    playout = Playout(FRAME, RATE, jitter_ms=40)
    playout.push(tone(1))
    assert heard(playout, 3) == [0, 0, FRAME]
    assert playout.state == IDLE
    playout.push(tone(1))
    assert heard(playout, 3) == [0, 0, FRAME]
    assert playout.counts().underruns == 2


def test_mark_is_returned_when_its_audio_has_played():
    playout = Playout(FRAME, RATE, jitter_ms=40)
    playout.push(tone(3))
    playout.mark("m1")
    playout.push(tone(2))
    playout.mark("m2")
    marks = [playout.pop().marks for _ in range(2 + 5 + 1)]
    # m1's audio ends with the 3rd audio frame (tick 4): returned at tick 5, when that frame has played; m2 after
    # the 5th (tick 6) at tick 7; never earlier.
    assert marks == [(), (), (), (), (), ("m1",), (), ("m2",)]
    assert playout.counts().marks_returned == 2


def test_mark_on_an_empty_buffer_is_returned_at_the_next_tick():
    playout = Playout(FRAME, RATE)
    playout.mark("alone")
    assert playout.pop().marks == ("alone",)


def test_clear_drops_everything_and_returns_pending_marks():
    playout = Playout(FRAME, RATE, jitter_ms=40)
    playout.push(tone(10))
    playout.mark("m1")
    playout.push(tone(10))
    playout.mark("m2")
    assert heard(playout, 4) == [0, 0, FRAME, FRAME]
    cleared = playout.clear()
    assert cleared.dropped_samples == 18 * FRAME and cleared.marks == ("m1", "m2")
    assert playout.state == IDLE and playout.buffered_samples == 0
    assert heard(playout, 3) == [0, 0, 0]  # silent from the very next tick
    counts = playout.counts()
    assert counts.clears == 1 and counts.cleared_samples == 18 * FRAME and counts.marks_returned == 2
    # Audio after the clear starts from idle again (jitter delay).
    playout.push(tone(1))
    assert heard(playout, 3) == [0, 0, FRAME]


def test_clear_during_the_jitter_delay_plays_nothing():
    playout = Playout(FRAME, RATE, jitter_ms=40)
    playout.push(tone(5))
    playout.pop()
    playout.clear()
    assert heard(playout, 5) == [0] * 5


def test_cap_drops_and_counts_a_flood():
    playout = Playout(FRAME, RATE, jitter_ms=0, cap_s=0.1)  # 800 samples = 5 frames
    assert playout.push(tone(3)) == 0
    assert playout.push(tone(4)) == 2 * FRAME
    assert playout.buffered_samples == 800
    counts = playout.counts()
    assert counts.dropped_samples == 2 * FRAME and counts.max_buffered_samples == 800
    assert heard(playout, 6) == [FRAME] * 5 + [0]
    assert playout.push(tone(1)) == 0  # room again once played


def test_samples_leave_in_order_across_chunks():
    playout = Playout(FRAME, RATE, jitter_ms=0)
    ramp = np.arange(500, dtype=np.int16)
    for piece in np.array_split(ramp, 7):  # odd-sized pieces, as an agent's 10 ms chunks might be
        playout.push(piece)
    out = np.concatenate([playout.pop().frame for _ in range(4)])
    assert (out[:500] == ramp).all() and not out[500:].any()


def test_state_reports_playing_while_buffered():
    playout = Playout(FRAME, RATE, jitter_ms=0)
    playout.push(tone(2))
    playout.pop()
    assert playout.state == PLAYING and playout.buffered_ms == pytest.approx(20.0)


def test_bad_arguments_are_refused():
    # (a bad jitter delay is refused once, by the settings that give it: tests/dial/test_dial_settings.py)
    with pytest.raises(ValueError):
        Playout(0, RATE)
