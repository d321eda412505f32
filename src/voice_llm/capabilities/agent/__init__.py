"""voice-llm's own voice agent behind a real line: ``voice-llm agent --listen HOST:PORT`` serves the pipeline
(Silero VAD and the endpointer, faster-whisper tiny.en, the LLM server through the one stream reader, Piper) over
Twilio Media Streams or binary PCM, sends audio as it is synthesized and ``clear`` on a barge-in, and reports its
own per-turn breakdown (OpenTelemetry spans with ``--otlp``). ``--engine pipecat`` serves a pipecat pipeline instead.

Importing this package is cheap: websockets and OpenTelemetry are imported when the agent serves. Its public
face: the agent's settings (AgentSettings), which the lab's converse step hands the agent it starts.
"""

from __future__ import annotations

from voice_llm.core.registry import Capability

# What this capability contributes to the core (voice_llm.core.registry).
CAPABILITY = Capability(
    name="agent",
    summary="voice-llm's own voice agent (or a pipecat one) served over the line",
    commands="voice_llm.capabilities.agent.command:add_commands",
    requires=("tts",),
)


# The public face another capability may use: what the agent is asked to serve (the converse step builds it from its
# flags and hands it to the agent whole; load reads a running agent's from its command line). Imported last: voice_llm.capabilities.agent.settings loads with this package.
from voice_llm.capabilities.agent.settings import AgentSettings, settings_of_command_line  # noqa: E402

__all__ = ["CAPABILITY", "AgentSettings", "settings_of_command_line"]
