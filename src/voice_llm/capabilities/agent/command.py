"""`voice-llm agent`: the command (added through the registry, ``commands=``), whose flags and settings are the
agent's settings' (voice_llm.capabilities.agent.settings: each declared there once, the flags derived), and the
dispatch to the engine that serves: the built-in pipeline (voice_llm.capabilities.agent.server) or pipecat's
(voice_llm.capabilities.agent.pipecat_agent, an optional extra: resolved by name only when chosen, so neither
`voice-llm agent` nor any other command imports pipecat unless asked)."""

from __future__ import annotations

from typing import Any

from voice_llm.core import registry
from voice_llm.capabilities.agent import server
from voice_llm.capabilities.agent.settings import AgentSettings, add_flags, settings_from
from voice_llm.core.util.progress import Progress

PIPECAT_SERVE = "voice_llm.capabilities.agent.pipecat_agent:serve"


def add_commands(sub: Any) -> None:
    help_text = "serve voice-llm's own voice pipeline (or pipecat's) as an agent on a line (WebSocket)"
    p = sub.add_parser("agent", help=help_text, description=help_text)
    add_flags(p)
    p.set_defaults(run_command=main, settings_of=settings_from)


def main(settings: AgentSettings, progress: Progress) -> int:
    if settings.engine == "pipecat":
        return int(registry.resolve(PIPECAT_SERVE)(settings) or 0)
    return server.serve(settings)
