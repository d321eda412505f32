"""Audio between the line and the engines: a streaming resampler (PyAV's libswresample, a faster-whisper
dependency; it keeps its filter state between pieces, so a stream cut into 20 ms frames resamples as one signal)
and the framer that cuts the agent's audio into the line's 20 ms frames."""

from __future__ import annotations

import numpy as np


class Resampler:
    """int16 mono at ``rate_in`` -> int16 mono at ``rate_out``, piece by piece (the same rate: passed through)."""

    def __init__(self, rate_in: int, rate_out: int) -> None:
        self.rate_in, self.rate_out = rate_in, rate_out
        self._resampler = None
        if rate_in != rate_out:
            import av

            self._resampler = av.AudioResampler(format="s16", layout="mono", rate=rate_out)

    def push(self, samples: np.ndarray) -> np.ndarray:
        if self._resampler is None or len(samples) == 0:
            return samples.astype(np.int16)
        import av

        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples, np.int16).reshape(1, -1), format="s16",
                                           layout="mono")
        frame.sample_rate = self.rate_in
        return self._collect(self._resampler.resample(frame))

    def flush(self) -> np.ndarray:
        """The samples still in the filter (a few), at the end of the stream."""
        if self._resampler is None:
            return np.zeros(0, np.int16)
        return self._collect(self._resampler.resample(None))

    @staticmethod
    def _collect(frames: list) -> np.ndarray:  # type: ignore[type-arg]
        out = [f.to_ndarray().reshape(-1) for f in frames]
        return np.concatenate(out).astype(np.int16) if out else np.zeros(0, np.int16)


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
