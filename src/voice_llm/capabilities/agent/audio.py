"""The framer that cuts the agent's audio into the line's 20 ms frames (the resampler between the line and the
engines is voice_llm.engines.audio.resampling's, the project's one)."""

from __future__ import annotations

import numpy as np


class Framer:
    """Samples in, whole frames of ``frame_samples`` out; the rest is carried to the next push. ``flush`` pads the
    carried rest with silence to one last frame (the end of a segment: the mark after it follows its audio)."""

    def __init__(self, frame_samples: int) -> None:
        self.frame_samples = frame_samples
        self._carry = np.zeros(0, np.int16)

    def push(self, samples: np.ndarray) -> list[np.ndarray]:
        data = np.concatenate([self._carry, samples.astype(np.int16)]) if len(self._carry) else samples.astype(np.int16)
        whole = len(data) // self.frame_samples * self.frame_samples
        self._carry = data[whole:]
        return [data[i:i + self.frame_samples] for i in range(0, whole, self.frame_samples)]

    def flush(self) -> list[np.ndarray]:
        if not len(self._carry):
            return []
        frame = np.zeros(self.frame_samples, np.int16)
        frame[:len(self._carry)] = self._carry
        self._carry = np.zeros(0, np.int16)
        return [frame]
