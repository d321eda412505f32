"""The caller's lines spoken by Piper for a call: the project's default voice (joe), slower than the assistant
(``length_scale`` 1.1) and with both noise terms off, so the same line gives the same samples every run."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from voice_llm.errors import TTSUnavailableError
from voice_llm.speech.caller import (CALLER_LENGTH_SCALE, CALLER_NOISE_SCALE, CALLER_NOISE_W_SCALE, SAMPLE_RATE,
                                     Utterance, resample, utterance)
from voice_llm.tts import DEFAULT_VOICE_PACKAGE, PIPER_PACKAGE, default_voice




@dataclass(frozen=True)
class CallerVoice:
    """What spoke the caller's lines, for the artifact's engines.caller_tts."""

    engine: str
    voice: str
    length_scale: float
    versions: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "voice": self.voice, "length_scale": self.length_scale,
                "noise_scale": CALLER_NOISE_SCALE, "noise_w_scale": CALLER_NOISE_W_SCALE,
                "sample_rate_in": 22050, "resampled_to": SAMPLE_RATE, "resampler": "av.AudioResampler",
                "versions": self.versions}


def synthesize_lines(lines: Sequence[str], length_scale: float = CALLER_LENGTH_SCALE) -> tuple[list[Utterance],
                                                                                                CallerVoice]:
    """Each line spoken by Piper's default voice at ``length_scale``, resampled to 16 kHz mono."""
    model, config = default_voice()
    try:
        from piper import PiperVoice, SynthesisConfig
    except ImportError as exc:
        raise TTSUnavailableError(f"Piper is not installed: pip install '{PIPER_PACKAGE}>=1.8,<1.9'") from exc
    voice = PiperVoice.load(model, config_path=config)
    rate = int(voice.config.sample_rate)
    syn = SynthesisConfig(length_scale=length_scale, noise_scale=CALLER_NOISE_SCALE, noise_w_scale=CALLER_NOISE_W_SCALE)
    utterances = []
    for index, line in enumerate(lines, start=1):
        pcm = b"".join(chunk.audio_int16_bytes for chunk in voice.synthesize(line, syn_config=syn))
        speech = resample(np.frombuffer(pcm, np.int16), rate)
        utterances.append(utterance(index, line, speech, "synthesized", None, f"the synthesized line {index}"))
    versions = {p: importlib.metadata.version(p) for p in (PIPER_PACKAGE, "onnxruntime", DEFAULT_VOICE_PACKAGE, "av")}
    return utterances, CallerVoice("piper", model.stem, length_scale, versions)


