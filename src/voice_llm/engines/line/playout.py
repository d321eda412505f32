"""The phone's ear: a playout buffer drained one frame per tick, as a handset (or Twilio's media edge) plays what
the agent sent.

Pure: it has no clock of its own. The dialer calls :meth:`Playout.pop` once per 20 ms tick (tick k at call time
k * frame_ms) and :meth:`Playout.push` / :meth:`Playout.mark` / :meth:`Playout.clear` whenever something arrives; the
tick count is the buffer's only notion of time, so a test drives it exactly.

What it models (docs/line.md "The phone's ear", issue 27 item 2; why: decision 0003):
- Jitter delay. When audio arrives at an idle buffer (empty and not playing), playout begins ``jitter_ms`` after
  that arrival: a phone's fixed jitter delay (default 40 ms = 2 frames). Audio pushed after pop k (tick k's frame
  already played) arrives in tick k+1's interval; with 2 frames of jitter it is first heard in the frame of tick
  k+3, i.e. 40 to 60 ms after it arrived (the rest is the frame boundary). ``jitter_ms`` is rounded up to whole
  frames (the only granularity a 20 ms tick has).
- Real-time pacing. While playing, one frame per tick leaves the buffer, however fast the audio came: a burst of
  3 s sent in 10 ms is heard over 3 s. A partial last frame is padded with silence. When the buffer runs dry the
  ear goes idle again (an underrun) and the next audio waits ``jitter_ms`` again.
- Marks. ``mark(name)`` queues a mark at the current end of the buffered audio; it is returned by the first pop
  after the frame that played that position out, i.e. when the audio before it has been heard to its end (Twilio
  echoes a mark "when the audio before it has been played"), or by ``clear``.
  https://www.twilio.com/docs/voice/media-streams/websocket-messages#mark-message
- Clear. ``clear()`` drops every buffered sample at once and returns the pending marks (Twilio echoes them).
- A cap on buffered audio (default 120 s): samples beyond it are dropped and counted, so an agent that floods the
  line costs bounded memory and the artifact says how much was thrown away.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

DEFAULT_JITTER_MS = 40
DEFAULT_CAP_S = 120.0

IDLE = "idle"  # empty and not playing
WAITING = "waiting"  # audio arrived at an idle buffer; playout begins after the jitter delay
PLAYING = "playing"


@dataclass(frozen=True)
class Popped:
    """What one tick plays: the frame (int16, always frame_samples long), the marks whose audio has fully played
    before this frame, whether this tick's frame carried buffered audio, and the state changes it caused."""

    frame: np.ndarray
    marks: tuple[str, ...]
    audio_samples: int  # how many samples of the frame came from the buffer (the rest is padding silence)
    started: bool  # this frame is the first of a stretch of playout (idle/waiting -> playing)
    ran_dry: bool  # after this frame the buffer is empty: the ear went idle (an underrun, or the reply's end)


@dataclass(frozen=True)
class Cleared:
    """What a ``clear`` dropped: samples and the pending marks (returned, as Twilio does)."""

    dropped_samples: int
    marks: tuple[str, ...]


@dataclass(frozen=True)
class PlayoutCounts:
    frames: int  # pops so far (ticks)
    audio_frames: int  # pops that played some buffered audio
    underruns: int  # times the buffer ran dry while playing
    max_buffered_samples: int
    dropped_samples: int  # beyond the cap
    cleared_samples: int  # thrown away by clears
    marks_returned: int
    clears: int
    pushed_samples: int  # accepted into the buffer


def jitter_frames(jitter_ms: float, frame_ms: float) -> int:
    """The jitter delay in whole frames, rounded up (40 ms at 20 ms frames is 2: a fraction of a frame cannot be
    played on a tick)."""
    return math.ceil(jitter_ms / frame_ms - 1e-9)


class Playout:
    """The playout buffer of one call at the line's rate. Not thread-safe: one event loop (or one thread) drives it.
    ``jitter_ms`` is what the call's settings hold, already refused there when out of range (--jitter-ms: the dial
    capability's DialOptions declares its rule, the one check of it)."""

    def __init__(self, frame_samples: int, rate: int, jitter_ms: float = DEFAULT_JITTER_MS,
                 cap_s: float = DEFAULT_CAP_S) -> None:
        if frame_samples <= 0 or rate <= 0:
            raise ValueError("frame_samples and rate must be positive")
        self.frame_samples = frame_samples
        self.rate = rate
        self.frame_ms = frame_samples * 1000.0 / rate
        self.jitter_ms = float(jitter_ms)
        # Whole frames of delay: 40 ms at 20 ms frames is 2 (a fraction of a frame cannot be played on a tick).
        self.jitter_frames = jitter_frames(self.jitter_ms, self.frame_ms)
        self.cap_samples = int(cap_s * rate)
        self._chunks: deque[np.ndarray] = deque()
        self._head = 0  # samples already consumed from _chunks[0]
        self._buffered = 0
        self._pushed = 0  # absolute position of the buffer's end (samples ever accepted)
        self._played = 0  # absolute position of the buffer's start (samples played or cleared)
        self._marks: deque[tuple[int, str]] = deque()  # (absolute end position of the audio before it, name)
        self._state = IDLE
        self._start_tick = 0
        self._ticks = 0
        self._audio_frames = 0
        self._underruns = 0
        self._max_buffered = 0
        self._dropped = 0
        self._cleared = 0
        self._marks_returned = 0
        self._clears = 0

    # --- what arrives -----------------------------------------------------------------------------------------

    def push(self, samples: np.ndarray) -> int:
        """Append received audio (int16 at the line's rate). Returns how many samples were dropped by the cap."""
        count = len(samples)
        if count == 0:
            return 0
        room = max(0, self.cap_samples - self._buffered)
        dropped = max(0, count - room)
        if dropped:
            self._dropped += dropped
            samples = samples[:room]
            count = room
        if count:
            self._chunks.append(np.asarray(samples, dtype=np.int16))
            self._buffered += count
            self._pushed += count
            self._max_buffered = max(self._max_buffered, self._buffered)
            if self._state == IDLE:
                # The first sample arrived during the interval of tick self._ticks (pops 0..ticks-1 are done):
                # it is first heard jitter_frames ticks later.
                self._state = WAITING
                self._start_tick = self._ticks + self.jitter_frames
        return dropped

    def mark(self, name: str) -> None:
        """Queue a mark at the current end of the buffered audio."""
        self._marks.append((self._pushed, name))

    def clear(self) -> Cleared:
        """Drop every buffered sample at once; the pending marks are returned (echoed by the caller)."""
        dropped = self._buffered
        self._chunks.clear()
        self._head = 0
        self._buffered = 0
        self._played = self._pushed
        self._cleared += dropped
        self._clears += 1
        marks = tuple(name for _, name in self._marks)
        self._marks.clear()
        self._marks_returned += len(marks)
        self._state = IDLE
        return Cleared(dropped, marks)

    # --- one tick -----------------------------------------------------------------------------------------------

    def pop(self) -> Popped:
        """The frame this tick plays (silence while idle or inside the jitter delay) and the marks now played."""
        tick = self._ticks
        self._ticks += 1
        # The marks whose audio has fully played: before this frame starts, frames 0..tick-1 have been heard to
        # their end (a mark after this frame's audio is returned by the next pop, when this frame has played).
        marks: list[str] = []
        while self._marks and self._marks[0][0] <= self._played:
            marks.append(self._marks.popleft()[1])
        self._marks_returned += len(marks)
        frame = np.zeros(self.frame_samples, np.int16)
        started = False
        taken = 0
        if self._state == WAITING and tick >= self._start_tick:
            self._state = PLAYING
            started = True
        if self._state == PLAYING:
            taken = self._take_into(frame)
        ran_dry = False
        if self._state == PLAYING and self._buffered == 0:
            self._state = IDLE
            self._underruns += 1
            ran_dry = True
        if taken:
            self._audio_frames += 1
        return Popped(frame, tuple(marks), taken, started, ran_dry)

    def _take_into(self, frame: np.ndarray) -> int:
        taken = 0
        while taken < len(frame) and self._chunks:
            chunk = self._chunks[0]
            n = min(len(frame) - taken, len(chunk) - self._head)
            frame[taken:taken + n] = chunk[self._head:self._head + n]
            taken += n
            self._head += n
            if self._head == len(chunk):
                self._chunks.popleft()
                self._head = 0
        self._buffered -= taken
        self._played += taken
        return taken

    # --- what it holds ------------------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        return self._state

    @property
    def idle(self) -> bool:
        return self._state == IDLE

    def holds_sound(self, floor: int) -> bool:
        """Whether any buffered sample is above ``floor``: a buffer of silence is no reply still to be heard (a
        WebRTC agent, pipecat's SmallWebRTC, sends silence when it has nothing to say, so its buffer never runs
        dry). Scans the buffer: called only once the heard channel has been quiet a reply's end."""
        first = True
        for chunk in self._chunks:
            part = chunk[self._head:] if first else chunk
            first = False
            if part.size and int(np.abs(part.astype(np.int32)).max()) > floor:
                return True
        return False

    @property
    def buffered_samples(self) -> int:
        return self._buffered

    @property
    def buffered_ms(self) -> float:
        return self._buffered * 1000.0 / self.rate

    @property
    def pending_marks(self) -> int:
        return len(self._marks)

    @property
    def ticks(self) -> int:
        return self._ticks

    def counts(self) -> PlayoutCounts:
        return PlayoutCounts(frames=self._ticks, audio_frames=self._audio_frames, underruns=self._underruns,
                             max_buffered_samples=self._max_buffered, dropped_samples=self._dropped,
                             cleared_samples=self._cleared, marks_returned=self._marks_returned,
                             clears=self._clears, pushed_samples=self._pushed)
