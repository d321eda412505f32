"""The agent's own voice coming back is not the caller: a gate against the audio the agent itself sent.

A speakerphone, or a handset's leak, sends what the caller hears back up the line some tens of milliseconds later and
attenuated (measured phone echo return loss is 20 dB or more; the dialer's ``--echo-db -20`` models it). Silero hears
speech in it, and an agent that takes that for a barge-in cuts its own reply (the line matrix, BENCHMARKS.md: 4 of 4
turns at -20 dB with no gate).

The agent knows what it sent and when the caller plays it (frames back to back from their arrival, as the caller's
playout does: the same estimate as agent.heard). A caller frame whose level is ``margin_db`` or more below the loudest
audio the caller heard in the last ``window_s`` is taken as that audio's echo, and the VAD's verdict on it is set to
silence before the endpointer sees it. A caller talking over the reply speaks at about the reply's level (both are
speech at the phone's level), far above its echo, and is heard as ever. What the gate cannot tell apart: an echo
louder than ``-margin_db`` (no echo canceller can be replaced by a level rule there), and a caller who speaks
``margin_db`` below the reply (a far-off, quiet voice): both are said in docs/agent.md.

Why levels and not a canceller (decision 0006): the registry's canceller bindings (WebRTC's audio processing, speexdsp) need a build
step or a native library this project does not ship; a level gate needs only the samples the agent already has, runs
in microseconds per frame, and its one number is measured in the line matrix.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

DEFAULT_MARGIN_DB = 10.0  # halfway between a caller at the reply's level (0 dB) and a phone's echo (-20 dB)
DEFAULT_WINDOW_S = 0.6  # the round trip: line, caller jitter buffer, echo path, uplink frame, with room to spare


def rms(samples: np.ndarray) -> float:
    """Root mean square of int16 samples (0.0 for none)."""
    if len(samples) == 0:
        return 0.0
    x = samples.astype(np.float64)
    return float(math.sqrt(float(np.mean(x * x))))


class EchoGate:
    """What the caller heard, frame by frame on the agent's clock, and whether a caller frame is only its echo.

    ``margin_db`` 0 turns it off (no frame is ever taken as echo)."""

    def __init__(self, rate: int, margin_db: float = DEFAULT_MARGIN_DB, window_s: float = DEFAULT_WINDOW_S) -> None:
        self.rate, self.margin_db, self.window_s = rate, margin_db, window_s
        self.ratio = 10 ** (-margin_db / 20.0)
        self.play_end = 0.0
        self.heard: deque[tuple[float, float, float]] = deque()  # (play start, play end, level) per frame sent
        self.gated = 0  # caller frames taken as echo, over the call

    @property
    def enabled(self) -> bool:
        return self.margin_db > 0

    def sent(self, frame: np.ndarray, now: float) -> None:
        """One frame of the agent's audio left at ``now``: the caller plays it after what was sent before it."""
        if not self.enabled or len(frame) == 0:
            return
        start = max(now, self.play_end)
        self.play_end = start + len(frame) / self.rate
        self.heard.append((start, self.play_end, rms(frame)))
        while self.heard and self.heard[0][1] < now - 2 * self.window_s:
            self.heard.popleft()

    def cleared(self, now: float) -> None:
        """A clear (a barge-in): the caller's playout dropped what it had not played."""
        while self.heard and self.heard[-1][0] > now:
            self.heard.pop()
        self.play_end = min(self.play_end, now)

    def reference(self, now: float) -> float:
        """The loudest frame the caller heard in the last ``window_s`` (0.0: nothing played)."""
        since = now - self.window_s
        return max((level for start, end, level in self.heard if end >= since and start <= now), default=0.0)

    def is_echo(self, frame: np.ndarray, now: float) -> bool:
        """Whether the caller frame arriving at ``now`` is no louder than an echo of what the caller just heard."""
        if not self.enabled:
            return False
        reference = self.reference(now)
        if reference <= 0.0:
            return False
        echo = rms(frame) < reference * self.ratio
        self.gated += echo
        return echo
