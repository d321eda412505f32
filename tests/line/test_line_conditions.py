"""The line's conditions, pure (voice_llm.engines.line.conditions): seeded loss per direction and per 20 ms, the echo mix."""

from __future__ import annotations

import numpy as np

from voice_llm.engines.line import conditions


def test_the_same_seed_loses_the_same_frames() -> None:
    one, two, other = (conditions.Loss(20, 7, conditions.UP), conditions.Loss(20, 7, conditions.UP),
                       conditions.Loss(20, 8, conditions.UP))
    # The sequences are made outside the asserts: pytest's assertion rewriting records every call inside an assert
    # statement for its message, which made this test take 12-45 s instead of a fraction of one.
    down = conditions.Loss(20, 7, conditions.DOWN)
    none = conditions.Loss(0, 7, conditions.UP)
    first, again, seeded_8, downlink = ([loss.lost(k) for k in range(5000)] for loss in (one, two, other, down))
    nothing = [none.lost(k) for k in range(1000)]
    assert first == again
    assert first != seeded_8
    assert first != downlink  # each way its own
    assert 0.17 < sum(first) / 5000 < 0.23
    assert not any(nothing)
    # downlink: per 20 ms of received audio, however it was chunked
    whole = conditions.DownlinkLoss(50, 3, 160).take(np.arange(1600, dtype=np.int16))[0]
    split = conditions.DownlinkLoss(50, 3, 160)
    pieces = [split.take(np.arange(i, min(i + 80, 1600), dtype=np.int16))[0] for i in range(0, 1600, 80)]
    assert np.array_equal(whole, np.concatenate(pieces)) and len(whole) % 160 == 0 and 0 < len(whole) < 1600


def test_the_echo_mix_is_the_heard_audio_attenuated_rounded_and_clipped() -> None:
    said = np.array([0, 100, -100, 32000, -32000], np.int16)
    heard = np.array([1000, 1000, 15, 10000, -10000], np.int16)
    mixed = conditions.echo_mix(said, heard, -20.0)
    assert mixed.dtype == np.int16
    assert mixed.tolist() == [100, 200, -98, 32767, -32768]  # 1.5 -> 2 (rint), clipped at both ends
    assert np.array_equal(conditions.echo_mix(said, np.zeros(5, np.int16), -20.0), said)
    assert conditions.echo_gain(-20.0) == 0.1 or abs(conditions.echo_gain(-20.0) - 0.1) < 1e-12
