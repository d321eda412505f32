"""The engines the capabilities drive: audio (the one WAV reader/writer and resampler), speech in (VAD, STT),
speech out (TTS), the line (the wire a caller and an agent speak). They build on the core's bottom floor only
(errors, util, sse, sentences) and know nothing of runs, checks or the lab."""
