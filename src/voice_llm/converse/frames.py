"""The caller's line, fed like a microphone: 512-sample (32 ms) frames on the real-time clock.

Frame k holds samples [512 k, 512 (k+1)) of the line and is delivered when its last sample has "arrived": at
``t0 + (k+1) x 32 ms`` by ``time.perf_counter``. The feeder sleeps until then, so nothing downstream can see a
sample before the time a microphone would have delivered it. The line is silence (zeros) except where an
utterance has been scheduled; an utterance is scheduled at a frame boundary from the conversation's own events
(after the assistant's reply, or a set time into it for a barge-in), never ahead of the frame being fed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from voice_llm.speech.caller import FRAME_SAMPLES, SAMPLE_RATE

FRAME_S = FRAME_SAMPLES / SAMPLE_RATE


@dataclass
class CallerLine:
    """What the caller's channel carries: scheduled utterances (sample offset, samples) on silence."""

    placed: list[tuple[int, np.ndarray]] = field(default_factory=list)

    def schedule(self, offset: int, samples: np.ndarray) -> None:
        self.placed.append((offset, samples))

    def frame(self, k: int) -> np.ndarray:
        start, end = k * FRAME_SAMPLES, (k + 1) * FRAME_SAMPLES
        out = np.zeros(FRAME_SAMPLES, np.int32)
        for offset, samples in self.placed:
            lo, hi = max(start, offset), min(end, offset + len(samples))
            if lo < hi:
                out[lo - start:hi - start] += samples[lo - offset:hi - offset]
        return np.clip(out, -32768, 32767).astype(np.int16)

    def busy_until(self) -> int:
        """One past the last scheduled sample (0 when nothing is scheduled)."""
        return max((offset + len(samples) for offset, samples in self.placed), default=0)


class FrameClock:
    """The call's clock: 0 = the start of frame 0 (sample 0 of the line). ``wait(k)`` sleeps until frame k is
    due; ``ms(t)`` puts a ``perf_counter`` reading on the call clock."""

    def __init__(self, t0: float | None = None) -> None:
        self.t0 = time.perf_counter() if t0 is None else t0
        self.late_frames = 0  # frames processed more than one frame after they were due (the loop fell behind)

    def due(self, k: int) -> float:
        return self.t0 + (k + 1) * FRAME_S

    def wait(self, k: int) -> None:
        due = self.due(k)
        now = time.perf_counter()
        if now < due:
            time.sleep(due - now)
        elif now - due > FRAME_S:
            self.late_frames += 1

    def now_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1000.0

    def ms(self, t: float) -> float:
        return (t - self.t0) * 1000.0


def frame_ms(k: int) -> float:
    """Where frame k starts on the call clock (its samples' time, not its delivery)."""
    return k * FRAME_S * 1000.0
