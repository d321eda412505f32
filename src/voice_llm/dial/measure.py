"""What the caller heard, measured on the two channels of the recording only (issue 27 item 3, LINE.md "What the
dialer measures"): left = the samples sent, right = what left the playout buffer, both at the line's rate with
sample 0 = call-clock 0.

One noise-floor rule for both channels: a sample is sound when its magnitude is above the channel's floor,
voice_llm.speech.caller.noise_floor of that channel (FLOOR_MIN = 100 of 32768, -50.3 dBFS, unless the channel's
quietest frames need more). The caller's floor is each line's own (its samples as sent); the heard floor is the
whole heard channel's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from voice_llm.speech.caller import FLOOR_MAX, FLOOR_MIN, NOISE_FACTOR, noise_floor
from voice_llm.util.stats import median, percentile

SILENT_AFTER_MS = 200.0  # a barge-in's heard silence: the heard channel stays silent at least this long
FALSE_BARGE_IN_RULE = ("the agent cut its own reply with no caller speech (the caller's lines' true spans; an echo "
                       "is none) from the reply's first arrival after the caller's speech end to the cut, before the "
                       "next line's speech start: a clear that dropped audio, or the agent's audio stopping (the "
                       f"playout buffer ran dry) with the heard reply silent >= {SILENT_AFTER_MS:g} ms, then sounding "
                       "again")

CUT_OFF_RULE = ("the agent talked while the caller was mid-utterance: the first heard sound inside the caller's own "
                "speech span of a line [speech_start, speech_end) (the line's true span from its samples as sent, "
                "pauses inside it included; an echo is on the uplink only, the heard channel is what the caller "
                "heard), looked for from the span's start or, on a line that barges in on the previous reply (a "
                "planned barge-in), from that reply's heard silence (the previous turn's barge_in.heard_silent_ms): "
                "the reply cut into, still playing under the caller, is the barge-in's, not a cut-off; "
                "caller_speech_left_ms = speech_end - that sound. Unknown (null, with why) where the heard channel "
                "cannot show it: the reply cut into never went silent, or went silent only after the line's end, or "
                "the recording ended before the line did")

FLOOR_RULE = (f"a sample is sound when |sample| > the channel's floor: speech.caller.noise_floor = min(max({FLOOR_MIN} "
              f"(-50.3 dBFS), {NOISE_FACTOR:g} x the peak of the channel's quietest 512-sample frame), {FLOOR_MAX} "
              "(-30.3 dBFS)); the caller's floor per line (its samples as sent), the heard floor over the whole heard "
              "channel; a 20 ms frame is sound when its peak is above the floor")


def ms(samples: int, rate: int) -> float:
    return round(samples * 1000.0 / rate, 3)


@dataclass(frozen=True)
class Heard:
    """The heard channel and where it sounds."""

    samples: np.ndarray
    rate: int
    floor: int

    @classmethod
    def of(cls, samples: np.ndarray, rate: int) -> Heard:
        return cls(samples, rate, noise_floor(samples))

    def loud(self, start: int, end: int) -> np.ndarray:
        """Indices (absolute) of the samples above the floor in [start, end)."""
        start, end = max(0, start), min(len(self.samples), end)
        if end <= start:
            return np.zeros(0, np.int64)
        return np.flatnonzero(np.abs(self.samples[start:end].astype(np.int32)) > self.floor) + start

    def first_sound(self, start: int, end: int) -> int | None:
        loud = self.loud(start, end)
        return int(loud[0]) if loud.size else None

    def last_sound(self, start: int, end: int) -> int | None:
        loud = self.loud(start, end)
        return int(loud[-1]) + 1 if loud.size else None

    def silent_from(self, start: int, end: int, hold: int) -> int | None:
        """The first moment at or after ``start`` from which the channel stays silent for ``hold`` samples (the end
        of the last loud sample before such a stretch; ``start`` itself when nothing sounds); None when the
        recording ends before the silence has lasted ``hold``."""
        loud = self.loud(start, end)
        edges = np.concatenate([[start - 1], loud, [len(self.samples) + hold]])
        gaps = np.diff(edges) - 1  # silent samples after each edge
        for i, gap in enumerate(gaps):
            if gap >= hold:
                moment = int(edges[i]) + 1
                return moment if moment + hold <= len(self.samples) else None
        return None


def frame_peaks(samples: np.ndarray, frame: int) -> np.ndarray:
    whole = len(samples) // frame
    return np.abs(samples[:whole * frame].astype(np.int32)).reshape(whole, frame).max(axis=1)


def summary_of(values: Sequence[float]) -> dict[str, float | int | None]:
    return {"median": round(median(values), 3) if values else None,
            "p90": round(p, 3) if (p := percentile(list(values), 90)) is not None else None, "n": len(values)}
