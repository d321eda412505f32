"""A Piper voice with its onnxruntime thread count set (``PiperVoice.load`` takes none: onnxruntime then uses every
core, which on 2 cores fights llama-server while the reply is still generating).

Built as ``PiperVoice.load`` builds it (piper-tts 1.8: config from the .onnx.json, a CPU InferenceSession), with
``SessionOptions.intra_op_num_threads`` (the threads of one operator) and ``inter_op_num_threads`` = 1 (Piper's
graph runs sequentially). The Piper engine (voice_llm.engines.speech_out.piper) loads its voice through
:func:`load_piper_voice`; the choice of thread count is measured in benchmarks/floor_bench.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from voice_llm.core.errors import ConfigError


def session_options(intra_op_threads: int | None) -> Any:
    """onnxruntime SessionOptions with ``intra_op_threads`` (None: onnxruntime's default, every core)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if intra_op_threads is not None:
        if intra_op_threads < 1:
            raise ConfigError(f"Piper's thread count must be at least 1, not {intra_op_threads}")
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
    return options


def load_piper_voice(model: Path, config: Path, intra_op_threads: int | None) -> Any:
    """A ``piper.PiperVoice`` for ``model``/``config`` whose onnxruntime session uses ``intra_op_threads``."""
    import onnxruntime
    from piper import PiperVoice
    from piper.config import PiperConfig

    with open(config, encoding="utf-8") as handle:
        config_dict = json.load(handle)
    session = onnxruntime.InferenceSession(str(model), sess_options=session_options(intra_op_threads),
                                           providers=["CPUExecutionProvider"])
    return PiperVoice(config=PiperConfig.from_dict(config_dict), session=session)
