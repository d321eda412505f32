"""The one resampler: PyAV's libswresample (a faster-whisper dependency), for the agent's line audio, the caller's
recordings and the dialer's lines alike. It keeps its filter state between pieces, so a stream cut into 20 ms
frames resamples as one signal; :func:`to_rate` is a whole signal at once.

Samples in are int16 or float32 in [-1, 1] (a mix-down's output), mono; samples out are int16 mono. PyAV (av) is
imported when a rate is actually converted: this module loads without it.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _format(samples: np.ndarray) -> str:
    """PyAV's name for the sample format of ``samples``: float input stays float until libswresample converts it
    (rounding it once, as it does any float PCM)."""
    return "flt" if np.issubdtype(samples.dtype, np.floating) else "s16"


class Resampler:
    """Mono at ``rate_in`` -> int16 mono at ``rate_out``, piece by piece. int16 at the same rate is passed through;
    float input always goes through libswresample, which makes it int16."""

    def __init__(self, rate_in: int, rate_out: int) -> None:
        self.rate_in, self.rate_out = rate_in, rate_out
        self._resampler: Any = None

    def push(self, samples: np.ndarray) -> np.ndarray:
        fmt = _format(samples)
        if len(samples) == 0 or (self.rate_in == self.rate_out and fmt == "s16" and self._resampler is None):
            return samples.astype(np.int16)
        import av

        if self._resampler is None:
            self._resampler = av.AudioResampler(format="s16", layout="mono", rate=self.rate_out)
        dtype = np.float32 if fmt == "flt" else np.int16
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples, dtype).reshape(1, -1), format=fmt,
                                           layout="mono")
        frame.sample_rate = self.rate_in
        return self._collect(self._resampler.resample(frame))

    def flush(self) -> np.ndarray:
        """The samples still in the filter (a few), at the end of the stream."""
        if self._resampler is None:
            return np.zeros(0, np.int16)
        return self._collect(self._resampler.resample(None))

    @staticmethod
    def _collect(frames: list[Any]) -> np.ndarray:
        out = [f.to_ndarray().reshape(-1) for f in frames]
        return np.concatenate(out).astype(np.int16) if out else np.zeros(0, np.int16)


def to_rate(samples: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """A whole mono signal from ``rate_in`` to ``rate_out`` as int16 (the filter flushed at its end)."""
    resampler = Resampler(rate_in, rate_out)
    return np.concatenate([resampler.push(samples), resampler.flush()])
