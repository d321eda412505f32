"""The ear's measurements on a channel (voice_llm.capabilities.dial.measure), sample-exact."""

from __future__ import annotations

import numpy as np

from voice_llm.capabilities.dial.measure import Heard, summary_of

RATE = 8000


def channel(*spans: tuple[int, int], length: int = 8000) -> Heard:
    samples = np.zeros(length, np.int16)
    for start, end in spans:
        samples[start:end] = 3000
    return Heard.of(samples, RATE)


def test_first_and_last_sound_in_a_window():
    heard = channel((1000, 2000), (3000, 3500))
    assert heard.floor == 100
    assert heard.first_sound(0, 8000) == 1000 and heard.first_sound(2000, 8000) == 3000
    assert heard.last_sound(0, 2500) == 2000 and heard.last_sound(0, 8000) == 3500
    assert heard.first_sound(4000, 8000) is None and heard.last_sound(4000, 8000) is None


def test_silent_from_needs_the_whole_hold():
    hold = 1600  # 200 ms
    heard = channel((1000, 2000), (3000, 3500))  # 1000 samples of silence between: shorter than the hold
    assert heard.silent_from(1500, 8000, hold) == 3500
    assert heard.silent_from(4000, 8000, hold) == 4000  # nothing sounds after the start: silent at once
    assert channel((0, 7000)).silent_from(0, 8000, hold) is None  # the recording ends before 200 ms of silence


def test_a_noisy_channel_raises_its_floor():
    rng = np.random.default_rng(1)
    samples = (rng.standard_normal(8000) * 200).astype(np.int16)
    samples[4000:5000] = 6000
    heard = Heard.of(samples, RATE)
    assert heard.floor > 100 and heard.first_sound(0, 8000) == 4000


def test_summary_uses_the_one_median_rule():
    assert summary_of([3.0, 1.0, 2.0, 4.0]) == {"median": 3.0, "p90": 4.0, "n": 4}
    assert summary_of([]) == {"median": None, "p90": None, "n": 0}


def test_a_sound_lasts_a_frame_and_near_samples_are_one_sound():
    samples = np.zeros(8000, np.int16)
    samples[1000] = 3000  # a click
    samples[2000:2100:50] = 3000  # three samples 50 apart: one run of 101 samples, shorter than a frame
    samples[4000:4400:100] = 3000  # four samples 100 apart: one run of 301 samples
    heard = Heard(samples, RATE, 100, min_sound=160)
    assert heard.first_sound(0, 8000) == 4000 and heard.last_sound(0, 8000) == 4301
    assert Heard(samples, RATE, 100).first_sound(0, 8000) == 1000  # without the rule the click would start it


def test_the_floor_is_taken_over_the_frames_that_carried_received_audio():
    from voice_llm.capabilities.dial.measure import carried_spans, heard_channel

    events = [{"t_ms": 100.2, "event": "playout_start", "frame": 5},
              {"t_ms": 300.2, "event": "playout_idle", "frame": 15},
              {"t_ms": 400.2, "event": "playout_start", "frame": 20},
              {"t_ms": 611.0, "dir": "down", "event": "clear", "frame": 31}]
    assert carried_spans(events, 160, 20.0, 8000) == [(800, 2560), (3200, 4960)]
    samples = np.zeros(8000, np.int16)
    samples[800:2560] = np.where(np.arange(1760) % 2, 300, -300)  # received comfort noise at 300
    samples[3200:4960] = 6000
    assert heard_channel(samples, RATE, events, 160, 20.0).floor == 600  # 2 x the quietest carried frame
    assert Heard.of(samples, RATE).floor == 100  # over every frame: the digital zero around the audio holds it
