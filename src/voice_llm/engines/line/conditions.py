"""Line conditions on the caller's side (issue 29 item 4): frames lost both ways, seeded, and a speakerphone's echo.

Pure, no clock: the dialer asks per frame. Both are the caller's line, not the agent's: what the agent receives
and what the caller hears are changed, and dial.json's ``line`` block says how (``loss_pct``, ``seed``,
``echo_db``, ``echo_delay_ms``).

Loss. Each direction has its own seeded stream of decisions (numpy's PCG64 seeded with ``[seed, direction]``), one
decision per 20 ms frame in order: uplink frame k (the tick's frame), downlink frame j (the j-th 20 ms of audio
received, counted on the received samples, so an agent sending 10 ms chunks loses 20 ms at a time). The same seed
gives the same drops in each direction whatever the other direction did. A lost uplink frame was numbered by the
sender and lost in transit: the agent sees the gap in sequenceNumber / chunk / timestamp (Twilio) or in time (pcm).

Echo. A speakerphone with no echo canceller: what the caller hears comes back into its microphone ``delay_ms``
later (60 ms), attenuated by ``echo_db`` dB, added to what the caller says, clipped to 16 bits, then through the
line's codec (the samples the agent decodes). :func:`echo_mix` is the one rule, used by the dialer and stated in
the artifact so a check recomputes it from the recording.
"""

from __future__ import annotations

import numpy as np

ECHO_DELAY_MS = 60.0
UP, DOWN = 0, 1


class Loss:
    """Seeded frame loss for one direction: ``lost(index)`` for indices asked in order (0, 1, 2, ...)."""

    def __init__(self, pct: float, seed: int, direction: int) -> None:
        if not 0 <= pct <= 100:
            raise ValueError(f"loss must be 0-100 %, not {pct:g}")
        self.pct = float(pct)
        self._rng = np.random.default_rng([int(seed), direction])
        self._decided: list[bool] = []

    def lost(self, index: int) -> bool:
        if self.pct == 0:
            return False
        while len(self._decided) <= index:
            self._decided.append(bool(self._rng.random() * 100.0 < self.pct))
        return self._decided[index]


class DownlinkLoss:
    """Downlink loss per 20 ms of received audio: ``take(samples)`` -> (what the playout buffer receives, the
    pieces lost as (received-frame index, samples))."""

    def __init__(self, pct: float, seed: int, frame_samples: int) -> None:
        self.loss = Loss(pct, seed, DOWN)
        self.frame_samples = frame_samples
        self.position = 0  # samples received so far (the grid the 20 ms units are cut on)

    def take(self, samples: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
        if self.loss.pct == 0 or len(samples) == 0:
            self.position += len(samples)
            return samples, []
        kept: list[np.ndarray] = []
        lost: list[tuple[int, int]] = []
        at = 0
        while at < len(samples):
            index = self.position // self.frame_samples
            n = min(len(samples) - at, (index + 1) * self.frame_samples - self.position)
            if self.loss.lost(index):
                lost.append((index, n))
            else:
                kept.append(samples[at:at + n])
            at += n
            self.position += n
        return (np.concatenate(kept) if kept else np.zeros(0, np.int16)), lost


def echo_gain(echo_db: float) -> float:
    return float(10.0 ** (echo_db / 20.0))


def echo_mix(said: np.ndarray, heard_before: np.ndarray, echo_db: float) -> np.ndarray:
    """What the caller's microphone picks up: ``said`` plus ``heard_before`` (the heard samples ``delay`` earlier,
    the same length) times the echo gain, each echo sample rounded to the nearest integer (numpy's rint: half to
    even), the sum clipped to int16."""
    echo = np.rint(heard_before.astype(np.float64) * echo_gain(echo_db)).astype(np.int32)
    return np.clip(said.astype(np.int32) + echo, -32768, 32767).astype(np.int16)
