"""pipecat, the agent's optional extra (``pip install 'voice-llm[pipecat]'``): its package, the version the agent is
written for, the install line a missing extra is told with, and the one figure of its pipeline the agent's settings
must know (its VAD stop: the shortest silence endpoint it can serve). Standard library only: the settings
(voice_llm.capabilities.agent.settings), the smart turn (agent.turn) and pipecat's pipeline (agent.pipecat_agent)
read it without importing pipecat."""

from __future__ import annotations

PIPECAT_PACKAGE = "pipecat-ai"
PIPECAT_VERSION = "1.14.0"
EXTRA_LINE = f"pip install 'voice-llm[pipecat]' (pipecat-ai=={PIPECAT_VERSION} with its websocket, whisper, piper, " \
             "silero and tracing extras)"
# Silence endpointing as the built-in agent's: pipecat's VAD reports a stop after ``stop_secs`` of silence and its
# speech-timeout strategy then waits ``user_speech_timeout`` more; the two add up to the endpoint. pipecat's own
# defaults (0.2 s + 0.6 s) would make its turns 500 ms later than ours for no reason of its own. An endpoint shorter
# than the VAD stop cannot be served (agent.settings refuses it).
VAD_STOP_S = 0.2
