"""`voice-llm agent`: the command's flags (added through the registry, ``commands=``), derived from the agent's
settings (voice_llm.capabilities.agent.settings: each declared there once), its settings file, and the dispatch to
the engine that serves: the built-in pipeline (voice_llm.capabilities.agent.server) or pipecat's
(voice_llm.capabilities.agent.pipecat_agent, an optional extra: resolved by name only when chosen, so neither
`voice-llm agent` nor any other command imports pipecat unless asked)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from voice_llm.core import registry
from voice_llm.capabilities.agent import server
from voice_llm.capabilities.agent.settings import AgentSettings
from voice_llm.core.run import flags
from voice_llm.core.server.config import api_key_from_env
from voice_llm.core.util.progress import Progress

PIPECAT_SERVE = "voice_llm.capabilities.agent.pipecat_agent:serve"
AGENT_FLAGS = flags.flags_of(AgentSettings)  # every setting with a flag of its own, in declaration order


def listen_address(text: str) -> tuple[str, int]:
    """--listen HOST:PORT, as the host and the port (the port's range is the settings' rule)."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {text!r}")
    return host, flags.whole(port)


def add_commands(sub: Any) -> None:
    help_text = "serve voice-llm's own voice pipeline (or pipecat's) as an agent on a line (WebSocket)"
    p = sub.add_parser("agent", help=help_text, description=help_text)
    p.add_argument("--listen", type=listen_address, default=None, metavar="HOST:PORT",
                   help=f"where the agent listens (default {AgentSettings.host}:{AgentSettings.port}; port 0: any "
                        "free one)")
    AGENT_FLAGS.add(p)
    p.add_argument("--settings", type=Path, default=None, metavar="FILE",
                   help="start from these settings, a JSON object of AgentSettings' fields by name (what the lab's "
                        "converse step hands its agent); each flag given beside it wins over the file")
    p.set_defaults(run_command=main, settings_of=settings_from)


def settings_from(values: Mapping[str, Any]) -> AgentSettings:
    """The agent's settings: its declared defaults, then the settings file (--settings), then the flags given;
    the API key from --api-key or the environment, never from a file."""
    given = AGENT_FLAGS.given(values)
    if values.get("listen") is not None:
        given["host"], given["port"] = values["listen"]
    given["api_key"] = api_key_from_env(given.get("api_key"))
    file = values.get("settings")
    return flags.build(AgentSettings, flags.read_settings(AgentSettings, file) if file is not None else {}, given)


def main(settings: AgentSettings, progress: Progress) -> int:
    if settings.engine == "pipecat":
        return int(registry.resolve(PIPECAT_SERVE)(settings) or 0)
    return server.serve(settings)
