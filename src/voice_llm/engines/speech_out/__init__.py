"""Speech out, beside speech in (voice_llm.engines.speech_in): the TTS engines (Piper in this process, espeak-ng as a program)
behind one interface (:mod:`voice_llm.engines.speech_out.engine`), the segmenting strategies, the live pipeline that speaks
an answer while it streams and the stoppable one an agent cuts on a barge-in, and the caller's playback model.
Engines only: no step, no artifact (the lab's speak step is the tts capability; the agent and the dialer speak
through this package directly).

The engines' own libraries (piper, onnxruntime) are imported when a voice is loaded, and this package's ``__init__``
imports nothing, so the CLI starts without them.
"""
