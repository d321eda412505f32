"""What the caller heard, measured on the two channels of the recording only (issue 27 item 3, docs/line.md "What the
dialer measures"): left = the samples sent, right = what left the playout buffer, both at the line's rate with
sample 0 = call-clock 0.

One noise-floor rule for both channels (FLOOR_RULE, issue 41 item 3): a sample is sound when its magnitude is above
the channel's floor and its run of such samples lasts at least a frame (a click is no sound);
the floor is voice_llm.engines.speech_in.caller_audio.noise_floor over the audio the channel carried (FLOOR_MIN = 100 of 32768,
-50.3 dBFS, unless its quietest frames need more): on the heard channel the frames the playout buffer played from
received audio (the events' playout stretches), on a caller line its own audio after the lead-in. The digital
silence around the audio is no background: taken with it the floor never left FLOOR_MIN, and comfort noise or one
click was the reply.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from voice_llm.engines.line.playout import jitter_frames
from voice_llm.engines.speech_in.caller_audio import (FLOOR_MAX, FLOOR_MIN, FRAME_SAMPLES, NOISE_FACTOR, audible_span, lead_samples,
                                     noise_floor, sound_mask)
from voice_llm.core.util.stats import median, percentile

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

FLOOR_RULE = (f"a sample is sound when |sample| > the channel's floor and it lasts: its run of such samples (less "
              "than a frame apart) spans at least one frame (a click or a spike shorter than a frame is no sound); "
              f"the floor is speech.caller.noise_floor = min(max({FLOOR_MIN} (-50.3 dBFS), {NOISE_FACTOR:g} x the "
              f"peak of the quietest whole {FRAME_SAMPLES}-sample frame of the audio the channel carried), "
              f"{FLOOR_MAX} (-30.3 dBFS)): the heard channel's frames the playout buffer played from received audio "
              "(each stretch from its events.jsonl playout_start frame to its playout_idle frame, or to a clear's "
              "frame), a caller line's own audio after the lead-in silence put before it (speech.caller.LEAD_MS); "
              "the digital silence around the audio (a lead-in, an idle buffer's padding) is no background. The "
              "caller's floor per line (its samples as sent), the heard floor one for the call; both channels by the "
              "one rule")


TALKED_OVER_RULE = ("a turn is talked over when the heard channel sounds both in the caller's last frame of speech "
                    "[speech_end - 1 frame, speech_end) and in the frame after it [speech_end, speech_end + 1 frame): "
                    "the agent's audio was still playing as the caller stopped, so the first heard sound after the "
                    "speech end is that audio, not a reply to the line. Its heard.gap_ms is null (heard.talked_over "
                    "true, the reason in unknown), it is left out of summary.heard_gap_ms and counted in its "
                    "talked_over; the headline says how many turns were talked over")


LATE_TICK_RULE = ("a tick is late when it started more than a frame after its deadline (t0 + k frames); the dialer "
                  "logs each late tick as it happens (events.jsonl: a `late_tick` with its frame and late_ms; "
                  "playout.late_frames counts them) and the recording still holds its frame at its nominal place, so "
                  "near a late tick the recording is not when things happened: a turn's heard.gap_ms is null "
                  "(heard.late_tick true, the reason in unknown, left out of summary.heard_gap_ms and counted in its "
                  "late_tick) when a late tick lies within a tick of the one that sent the uplink frame holding the "
                  "caller's last sound of speech (the agent heard the end late), or from the tick before the reply's "
                  "first sound could have arrived (its frame less the jitter delay's frames) to the tick that played "
                  "it (audio that came during a late tick is played a frame early on the recording)")


BARGE_SILENCE_RULE = (f"a barged-in reply's heard silence (barge_in.heard_silent_ms) is the first moment after the "
                      f"onset from which the heard channel stays silent >= {SILENT_AFTER_MS:g} ms and that reply does "
                      "not sound again: a silence the channel sounds again after before the barge-in line's speech "
                      "end (the earliest a reply to that line can begin), with no clear from a frame before the "
                      "silence to that sound (audio after a clear is new audio), is a pause of the same reply, listed "
                      "in barge_in.resumed_ms [[silent_ms, resumed_ms], ...] and passed over")


def at_sample(t_ms: float, rate: int) -> int:
    """The sample an event's call-clock time falls on (the one rounding both the dialer and check use)."""
    return round(t_ms * rate / 1000)


def ms(samples: int, rate: int) -> float:
    return round(samples * 1000.0 / rate, 3)


@dataclass(frozen=True)
class Heard:
    """The heard channel and where it sounds."""

    samples: np.ndarray
    rate: int
    floor: int
    min_sound: int = 1  # samples a sound lasts at least (FLOOR_RULE: a frame)

    @classmethod
    def of(cls, samples: np.ndarray, rate: int, carried: Sequence[tuple[int, int]] | None = None,
           min_sound: int = 1) -> Heard:
        return cls(samples, rate, noise_floor(samples, carried), min_sound)

    @cached_property
    def mask(self) -> np.ndarray:
        """Per sample: is it sound (FLOOR_RULE), over the whole channel (a window's edge never changes it)."""
        return sound_mask(self.samples, self.floor, self.min_sound)

    def loud(self, start: int, end: int) -> np.ndarray:
        """Indices (absolute) of the samples that are sound in [start, end)."""
        start, end = max(0, start), min(len(self.samples), end)
        if end <= start:
            return np.zeros(0, np.int64)
        return np.flatnonzero(self.mask[start:end]) + start

    def first_sound(self, start: int, end: int) -> int | None:
        loud = self.loud(start, end)
        return int(loud[0]) if loud.size else None

    def last_sound(self, start: int, end: int) -> int | None:
        loud = self.loud(start, end)
        return int(loud[-1]) + 1 if loud.size else None

    def talked_over(self, end: int, frame: int) -> bool:
        """TALKED_OVER_RULE: the channel sounds in the frame before ``end`` (the caller's speech end) and in the
        frame from it: audio playing across the caller's end, whose gap would be ~0 and no reply's."""
        return self.first_sound(end - frame, end) is not None and self.first_sound(end, end + frame) is not None

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


def reply_silent_from(heard: Heard, onset: int, answer_from: int, hold: int, clears: Sequence[int],
                      frame: int) -> tuple[int | None, tuple[tuple[int, int], ...]]:
    """BARGE_SILENCE_RULE: (the barged-in reply's heard silence, or None when the channel never stays silent
    ``hold`` samples after ``onset`` with that reply over; the pauses it resumed after, [(silent, resumed)]).
    ``answer_from``: the barge-in line's speech end; ``clears``: the samples clears arrived at."""
    total = len(heard.samples)
    loud = heard.loud(onset, total)
    edges = np.concatenate([[onset - 1], loud]).astype(np.int64)
    nexts = np.concatenate([loud, [total + hold]]).astype(np.int64)
    resumed: list[tuple[int, int]] = []
    for i in np.flatnonzero(nexts - edges - 1 >= hold):
        moment, again = int(edges[i]) + 1, int(nexts[i])
        if moment + hold > total:
            break  # the recording ends before the silence has lasted
        if again < min(answer_from, total) and not any(moment - frame <= c < again for c in clears):
            resumed.append((moment, again))  # the same reply, paused: not its end
            continue
        return moment, tuple(resumed)
    return None, tuple(resumed)


def late_tick_frames(events: Sequence[Mapping[str, Any]]) -> frozenset[int]:
    """The ticks the dialer logged as late (LATE_TICK_RULE), by frame."""
    return frozenset(int(e["frame"]) for e in events if e.get("event") == "late_tick"
                     and isinstance(e.get("frame"), int) and not isinstance(e.get("frame"), bool))


def near_late_tick(late: Collection[int], speech_end: int, first_sound: int, frame: int, jitter_frames: int) -> bool:
    """LATE_TICK_RULE for one turn (sample indices: ``speech_end`` one past the caller's last sound of speech,
    ``first_sound`` the reply's first heard sample): is a late tick near either end (the dialer's and check's one
    function)."""
    if not late:
        return False
    sent = (speech_end - 1) // frame + 1  # frame k leaves at tick k + 1 (docs/line.md "Clocks")
    played = first_sound // frame
    return any(sent - 1 <= k <= sent + 1 or played - jitter_frames - 1 <= k <= played for k in late)


def carried_spans(events: Sequence[Mapping[str, Any]], frame: int, frame_ms: float,
                  total: int) -> list[tuple[int, int]]:
    """The [start, end) samples of the heard channel the playout buffer played from received audio (FLOOR_RULE):
    each stretch from a playout_start's frame through the playout_idle frame after which it ran dry, or up to the
    frame a clear emptied it at (the clear's ``frame``: the frames popped before it), or the recording's end. An
    event without its frame is placed by its time (a frame holds its tick's time)."""
    def frame_of(event: Mapping[str, Any]) -> int:
        at = event.get("frame")
        return int(at) if isinstance(at, int) and not isinstance(at, bool) else int(event["t_ms"] // frame_ms)

    spans: list[tuple[int, int]] = []
    start: int | None = None
    for event in events:
        kind = event.get("event")
        if kind == "playout_start":
            start = frame_of(event)
        elif start is not None and (kind == "playout_idle" or (kind == "clear" and event.get("dir") == "down")):
            end = frame_of(event) + 1 if kind == "playout_idle" else frame_of(event)
            if end > start:
                spans.append((start * frame, min(total, end * frame)))
            start = None
    if start is not None and start * frame < total:
        spans.append((start * frame, total))
    return spans


def heard_channel(samples: np.ndarray, rate: int, events: Sequence[Mapping[str, Any]], frame: int,
                  frame_ms: float) -> Heard:
    """The heard channel by FLOOR_RULE: its floor over the frames that carried received audio, a sound a frame
    long at least (the dialer's and check's one function)."""
    return Heard.of(samples, rate, carried_spans(events, frame, frame_ms, len(samples)), frame)


def caller_sound(samples: np.ndarray, rate: int, frame: int) -> tuple[int, tuple[int, int] | None]:
    """A caller line's floor by FLOOR_RULE (over its own audio, after the lead-in put before it) and its true
    speech span: the first and last sample of sound, a sound a frame long at least (the dialer's and check's one
    function)."""
    floor = noise_floor(samples, [(lead_samples(rate), len(samples))])
    return floor, audible_span(samples, floor, frame)


def frame_peaks(samples: np.ndarray, frame: int) -> np.ndarray:
    whole = len(samples) // frame
    return np.abs(samples[:whole * frame].astype(np.int32)).reshape(whole, frame).max(axis=1)


def summary_of(values: Sequence[float]) -> dict[str, float | int | None]:
    return {"median": round(median(values), 3) if values else None,
            "p90": round(p, 3) if (p := percentile(list(values), 90)) is not None else None, "n": len(values)}
