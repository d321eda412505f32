"""Audio as bytes and samples, under speech in (voice_llm.engines.speech_in) and speech out (voice_llm.engines.speech_out): the one WAV
reader and writer (:mod:`voice_llm.engines.audio.wav`) and the one resampler (:mod:`voice_llm.engines.audio.resampling`).

This package's ``__init__`` imports nothing, so the CLI starts without numpy or PyAV.
"""
