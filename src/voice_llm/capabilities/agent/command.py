"""`voice-llm agent`: the command's flags (added through the registry, ``commands=``), their settings, and the
dispatch to the engine that serves: the built-in pipeline (voice_llm.capabilities.agent.server) or pipecat's
(voice_llm.capabilities.agent.pipecat_agent, an optional extra: resolved by name only when chosen, so neither `voice-llm agent`
nor any other command imports pipecat unless asked)."""

from __future__ import annotations

import argparse
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from voice_llm.core import registry
from voice_llm.capabilities.agent import server
from voice_llm.capabilities.agent.settings import (DEFAULT_ENDPOINT_MS, DEFAULT_ENGINE, DEFAULT_HOST, DEFAULT_MAX_CALLS,
                                      DEFAULT_MAX_TOKENS, DEFAULT_PORT, DEFAULT_ECHO_GATE_DB, DEFAULT_PREEMPTIVE,
                                      DEFAULT_SPECULATIVE_STT, DEFAULT_STRATEGY,
                                      DEFAULT_STT_WINDOW_S, DEFAULT_TTS_THREADS, ENGINES, TURNS, AgentSettings)
from voice_llm.capabilities.agent.turn import SMART_FALLBACK_MS, SMART_SILENCE_MS
from voice_llm.core.errors import ConfigError
from voice_llm.core.run import flags
from voice_llm.engines.line import wire
from voice_llm.core.scenario.dialogue import DEFAULT_DIALOGUE
from voice_llm.core.server.config import DEFAULT_PORT as LLM_PORT, api_key_from_env
from voice_llm.engines.speech_in.stt import DEFAULT_STT, STT_CHOICES
from voice_llm.engines.speech_out.segmenting import STRATEGIES
from voice_llm.capabilities.speak import add_voice_flags
from voice_llm.core.util.progress import Progress

PIPECAT_SERVE = "voice_llm.capabilities.agent.pipecat_agent:serve"
DEFAULT_LLM_URL = f"http://127.0.0.1:{LLM_PORT}"  # the agent has no --port: the managed server's default one


def listen_address(text: str) -> tuple[str, int]:
    """--listen HOST:PORT (PORT 0: any free port; the ready line says which)."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {text!r}")
    try:
        number = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port in {text!r}") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, not {port!r}")
    return host, number


def otlp_url(text: str) -> str:
    """--otlp http://HOST:PORT: an OTLP/HTTP receiver's base (the agent posts to /v1/traces under it)."""
    parts = urllib.parse.urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"not an http:// URL of an OTLP receiver: {text!r}")
    path = parts.path.rstrip("/")
    if path.endswith("/v1/traces"):
        path = path[: -len("/v1/traces")]
    return f"{parts.scheme}://{parts.netloc}{path}"


def add_commands(sub: Any) -> None:
    help_text = "serve voice-llm's own voice pipeline (or pipecat's) as an agent on a line (WebSocket)"
    p = sub.add_parser("agent", help=help_text, description=help_text)
    p.add_argument("--listen", type=listen_address, default=(DEFAULT_HOST, DEFAULT_PORT), metavar="HOST:PORT",
                   help=f"where the agent listens (default {DEFAULT_HOST}:{DEFAULT_PORT}; port 0: any free one)")
    p.add_argument("--protocol", choices=wire.PROTOCOLS, default=wire.TWILIO,
                   help="twilio: Media Streams JSON, 8 kHz mu-law (default); pcm: binary 16-bit frames at --rate "
                        "(the built-in engine); telnyx, plivo, exotel, vonage: the phone bridges, with pipecat's own "
                        "serializer (--engine pipecat); webrtc: pipecat's SmallWebRTC transport, its offer at "
                        "http://HOST:PORT/api/offer (--engine pipecat, the extras voice-llm[pipecat,webrtc])")
    p.add_argument("--rate", type=flags.positive_int, default=wire.DEFAULT_PCM_RATE, metavar="HZ",
                   help=f"the PCM line's sample rate (default {wire.DEFAULT_PCM_RATE}; Twilio is 8000 always)")
    flags.request_options(p, url_help=f"the LLM server the agent asks (default: {DEFAULT_LLM_URL}, the managed "
                                      "server's default port); may end in /v1")
    flags.api_key_option(p)
    p.add_argument("--model", help="the model name sent in each request (default: the first id of /v1/models)")
    p.add_argument("--endpoint-ms", type=flags.positive_number, default=DEFAULT_ENDPOINT_MS, metavar="MS",
                   help="silence that ends the caller's turn with --turn silence (default 300)")
    p.add_argument("--stt", choices=STT_CHOICES, default=DEFAULT_STT,
                   help="moonshine: Moonshine tiny on onnxruntime (default); faster-whisper (or whisper): Whisper "
                        "tiny.en; none: a fixed line instead of a transcript")
    p.add_argument("--stt-threads", type=flags.positive_int, default=None, metavar="N",
                   help="the STT's CPU threads (default: moonshine 1, faster-whisper every core)")
    p.add_argument("--speculative-stt", action=argparse.BooleanOptionalAction, default=DEFAULT_SPECULATIVE_STT,
                   help="transcribe from the VAD's speech end, before the endpoint, and commit at the endpoint (a "
                        f"resumed utterance drops it) (default {'on' if DEFAULT_SPECULATIVE_STT else 'off'})")
    p.add_argument("--preemptive", action=argparse.BooleanOptionalAction, default=None,
                   help="start the reply (LLM and synthesis) from the speculative transcript before the endpoint, "
                        "send none of its audio until the endpoint confirms it, drop it when speech resumes; implies "
                        "--speculative-stt; builtin engine (default "
                        f"{'on with speculative STT' if DEFAULT_PREEMPTIVE else 'off'})")
    p.add_argument("--echo-gate-db", type=flags.non_negative_number, default=DEFAULT_ECHO_GATE_DB, metavar="DB",
                   help="take a caller frame this many dB below the loudest audio the caller just heard for the "
                        "agent's own voice coming back, not a barge-in; 0: off (default "
                        f"{DEFAULT_ECHO_GATE_DB:g}; builtin engine)")
    p.add_argument("--stt-window", type=flags.positive_int, default=DEFAULT_STT_WINDOW_S, metavar="S",
                   help=f"Whisper's encoder window in seconds, 1-30 (default {DEFAULT_STT_WINDOW_S}; a longer turn "
                        "takes the 30 s path)")
    add_voice_flags(p)
    p.add_argument("--tts-threads", type=flags.positive_int, default=DEFAULT_TTS_THREADS, metavar="N",
                   help="Piper's onnxruntime threads (default: onnxruntime's, one per core; measured in the agent's "
                        "calls on 2 cores, one thread made the first audio later: BENCHMARKS.md)")
    p.add_argument("--strategy", choices=STRATEGIES, default=DEFAULT_STRATEGY,
                   help="how the replies are cut for speech (default clauses)")
    p.add_argument("--max-tokens", type=flags.positive_int, default=DEFAULT_MAX_TOKENS, metavar="N",
                   help=f"each reply's max_tokens (default {DEFAULT_MAX_TOKENS})")
    p.add_argument("--dialogue", default=DEFAULT_DIALOGUE,
                   help="the bundled dialogue (or a dialogue file) whose system prompt is used (default clinic)")
    p.add_argument("--docs", type=flags.non_negative_int, default=4, metavar="N",
                   help="KB documents in the system prompt (default 4)")
    flags.kb_option(p)
    p.add_argument("--otlp", type=otlp_url, default=None, metavar="http://HOST:PORT",
                   help="export OpenTelemetry spans per turn to this OTLP/HTTP receiver (default: none)")
    p.add_argument("--max-calls", type=flags.positive_int, default=DEFAULT_MAX_CALLS, metavar="N",
                   help="calls served at once; more are refused with close code 1013 (default 1)")
    p.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE,
                   help="builtin: voice-llm's pipeline (default); pipecat: a pipecat pipeline "
                        "(the extra voice-llm[pipecat])")
    p.add_argument("--turn", choices=TURNS, default="silence",
                   help="silence: the caller's turn ends after --endpoint-ms of silence (default); smart: pipecat's "
                        f"smart-turn v3.2 model judges it after {SMART_SILENCE_MS:g} ms of silence, complete ends it, "
                        f"incomplete waits for {SMART_FALLBACK_MS:g} ms of silence or for speech (either engine; "
                        "the extra voice-llm[pipecat])")
    p.add_argument("--ready-file", type=Path, default=None, metavar="PATH",
                   help="write the ready line (JSON: listen, protocol, engines, versions, pid) here when serving")
    p.add_argument("--include-usage", action="store_true",
                   help="ask the server for a final usage chunk (stream_options.include_usage), as the lab's requests "
                        "do on a server whose stream carries no timings (vLLM, SGLang)")
    p.add_argument("--no-prime", action="store_true",
                   help="send no priming request with the system prompt before the first call")
    p.set_defaults(run_command=main)


def settings_from(values: Mapping[str, Any]) -> AgentSettings:
    host, port = values.get("listen") or (DEFAULT_HOST, DEFAULT_PORT)
    given = {
        "host": host, "port": port, "protocol": values.get("protocol") or wire.TWILIO,
        "rate": values.get("rate") or wire.DEFAULT_PCM_RATE,
        "url": values.get("url") or DEFAULT_LLM_URL,
        "model": values.get("model"), "api_key": api_key_from_env(values.get("api_key")),
        "endpoint_ms": values.get("endpoint_ms") or DEFAULT_ENDPOINT_MS,
        "stt": values.get("stt") or DEFAULT_STT, "stt_threads": values.get("stt_threads"),
        "stt_window_s": values.get("stt_window") or DEFAULT_STT_WINDOW_S,
        "speculative_stt": (values["speculative_stt"] if values.get("speculative_stt") is not None
                            else DEFAULT_SPECULATIVE_STT),
        "preemptive": values.get("preemptive"),  # None: the engine's default (AgentSettings.__post_init__)
        "echo_gate_db": values["echo_gate_db"] if values.get("echo_gate_db") is not None else DEFAULT_ECHO_GATE_DB,
        "tts": values.get("tts") or "piper", "voice": values.get("voice"),
        "tts_threads": values.get("tts_threads") or DEFAULT_TTS_THREADS,  # None: onnxruntime's default
        "clause_words": values.get("clause_words") or 4, "strategy": values.get("strategy") or DEFAULT_STRATEGY,
        "max_tokens": values.get("max_tokens") or DEFAULT_MAX_TOKENS,
        "dialogue": values.get("dialogue") or DEFAULT_DIALOGUE,
        "docs": values["docs"] if values.get("docs") is not None else 4,
        "kb_dir": Path(values["kb"]).expanduser() if values.get("kb") else None,
        "otlp": values.get("otlp"), "max_calls": values.get("max_calls") or DEFAULT_MAX_CALLS,
        "engine": values.get("engine") or DEFAULT_ENGINE, "turn": values.get("turn") or "silence",
        "ready_file": Path(values["ready_file"]).expanduser() if values.get("ready_file") else None,
        "prime": not values.get("no_prime"),
        "include_usage": bool(values.get("include_usage")),
    }
    for key in ("timeout", "deadline"):
        if values.get(key) is not None:
            given["deadline_s" if key == "deadline" else key] = values[key]
    return AgentSettings(**given)


def main(values: Mapping[str, Any], progress: Progress) -> int:
    settings = settings_from(values)
    if settings.engine == "pipecat" and settings.preemptive:
        raise ConfigError("--preemptive is the builtin engine's (pipecat's pipeline has its own turn handling)")
    if settings.engine == "pipecat" and settings.stt == "none":
        raise ConfigError("--stt none is the builtin engine's (pipecat's pipeline transcribes: moonshine or "
                          "faster-whisper)")
    if settings.engine == "pipecat":
        return int(registry.resolve(PIPECAT_SERVE)(settings) or 0)
    return server.serve(settings)
