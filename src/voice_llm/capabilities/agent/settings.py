"""What `voice-llm agent` is asked to serve: one frozen value, every setting declared once below (its default,
help, flag and rule: voice_llm.core.run.flags.setting), that every engine (the built-in pipeline,
voice_llm.capabilities.agent.server; pipecat's, voice_llm.capabilities.agent.pipecat_agent) takes whole. The agent's
flags are derived from it (agent.command), so are the lab's and converse's flags for the agent they start
(voice_llm.capabilities.dial.step), and it crosses to that agent's process whole, as JSON (``agent --settings
FILE``: voice_llm.capabilities.dial.converse)."""

from __future__ import annotations

import argparse
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voice_llm.capabilities.agent import echo
from voice_llm.capabilities.agent.pipecat_extra import VAD_STOP_S as PIPECAT_VAD_STOP_S
from voice_llm.capabilities.agent.turn import MODES as TURNS, SMART_FALLBACK_MS, SMART_SILENCE_MS
from voice_llm.capabilities.speak import TTSOptions
from voice_llm.core.errors import ConfigError
from voice_llm.core.run import flags
from voice_llm.core.run.context import StepOptions
from voice_llm.core.run.flags import SECONDS, SERVER_URL, Between, OneOf, Satisfies, setting
from voice_llm.core.scenario.dialogue import DEFAULT_DIALOGUE
from voice_llm.core.server.config import DEFAULT_PORT as LLM_PORT, api_key_from_env
from voice_llm.core.sse import DEFAULT_DEADLINE_S
from voice_llm.engines.line import wire
from voice_llm.engines.speech_in import stt as sttmod, vad
from voice_llm.engines.speech_out.segmenting import STRATEGIES

ENGINES = ("builtin", "pipecat")
# pipecat 1.14's serializers, and its SmallWebRTC transport (webrtc): voice_llm.capabilities.agent.pipecat_agent
PIPECAT_PROTOCOLS = (wire.TWILIO, *wire.BRIDGES, wire.WEBRTC)
DEFAULT_ENGINE = "builtin"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 18300
DEFAULT_LLM_URL = f"http://127.0.0.1:{LLM_PORT}"  # the agent has no --port: the managed server's default one
DEFAULT_MAX_CALLS = 1
DEFAULT_MAX_TOKENS = 48  # docs/line.md: a reply the caller may talk over must still be streaming then
DEFAULT_STRATEGY = "clauses"
# Piper's onnxruntime threads in the agent (None: onnxruntime's default, one per core). Chosen by the heard gap, not by
# the stage alone: on a quiet machine (BENCHMARKS.md "Quiet machine: the floor, the cores", 2026-12-02) floor_bench
# timed Piper's first audio beside a generating llama-server at 210 ms with 1 thread and 456 ms with 2, but in the
# agent's calls (the A/B of benchmarks/preemptive_ab.py --a-args "--tts-threads 1" --b-args=--tts-threads=2, 8 turns
# each) one thread was slower where it counts: TTS stage 331 vs 221 ms, heard median 2455 vs 2275 ms. So the default
# stays every core.
DEFAULT_TTS_THREADS: int | None = None
# Whisper's encoder window for the caller's turns. 30 s is Whisper's own (faster-whisper pads every utterance to it);
# a turn of a phone call is a few seconds, and a 10 s window encodes a third of the frames. Measured before it was
# made the default (BENCHMARKS.md "Whisper's window"): the same transcripts of the caller lines, a shorter STT stage.
# A turn longer than the window, or a decode that repeats itself, goes through the 30 s path (speech.stt).
DEFAULT_STT_WINDOW_S = 30
# Speculative STT (issue 28 item 2): Whisper starts at the VAD's speech end (the first silent frame) instead of at the
# endpoint, so up to the endpoint's silence of its decode is off the critical path; a resumed utterance drops it.
# The default is set by the A/B measurement in BENCHMARKS.md ("Speculative STT"): off while the STT was tiny.en (its
# 30 s window's decode was never ready before the endpoint), on since Moonshine (issue 39 item 2, 2026-12-05: the
# same-run A/B of benchmarks/preemptive_ab.py, 12 clinic turns each on a quiet machine, heard median 1635 -> 1385 ms,
# the STT stage 104 -> 0 ms on the critical path, 0 word errors of 156 in both arms, 0 cut-offs on the pause line).
DEFAULT_SPECULATIVE_STT = True
# The preemptive reply (issue 28 item 3): the reply started from the speculative transcript when it is ready before the
# endpoint, its audio held until the endpoint confirms it, dropped when speech resumes first. Implies speculative STT.
# The default is set by the A/B measurements in BENCHMARKS.md. Ungated (issue 39 item 3, 2026-12-05) it was heard
# sooner on 2 slots (1375 -> 1155 ms median) but on 1 slot its p90 went 1815 -> 4715 ms and `make lab` heard 4015 ms
# median: a dropped request holds llama-server's slot until the server notices the closed connection (at its first
# token, or its next 1 s poll while still in its prefill) and the batch under way ends (0-3071 ms after the close at
# load 3-5), and the endpoint's request waited behind it. Gated since 2026-12-07 (agent.preemptive: a transcript that
# ends a sentence, not on "to"; two idle slots on /slots, one left for the endpoint's request): on a 2-slot server
# heard 3215 -> 1595 ms median, p90 5515 -> 4335 ms, 0 cut-offs, 36 tokens and 565 ms of synthesis wasted in 18
# dropped replies over 15 turns (same-run ABBA, load 1.9-4.6); on a 1-slot server (the lab's) it never starts, so
# the default cannot cost the tail it did. On by default; `--no-preemptive` turns it off.
DEFAULT_PREEMPTIVE = True
# Prefill ahead (issue 39, 2026-12-07): when the speculative transcript is ready before the endpoint but no preemptive
# reply may start (its gates: the transcript, or fewer than two idle slots, as on the lab's 1-slot server), the
# conversation with that transcript as the caller's turn is sent for one token, so llama-server's slot holds its
# prefix when the endpoint's own request comes: that request then prefills one token, not the caller's turn (measured
# on the lab's server shape, 4 KB documents: the turn's 28 tokens 162 ms, after the prefill ahead 1 token 14 ms). It is
# never closed early (a closed request is what held the slot, above): it is short, its prefix is the endpoint's when
# the caller was done, and a caller who goes on makes the endpoint wait out another silence, longer than it runs.
# It needs one idle slot on /slots. The default is set by the same-run A/B in BENCHMARKS.md ("Prefill ahead"): on the
# brief's 1-slot server, 20 clinic turns an arm on a quiet machine, request -> first token 195 -> 53 ms median, heard
# median 1005 -> 815 ms, p90 1555 -> 1155 ms, 0 cut-offs on the pause line, 0 word errors in both arms.
DEFAULT_PREFILL_AHEAD = True
# The echo gate (issue 39 item 4, agent.echo): a caller frame this many dB below the loudest audio the caller just
# heard is taken as the agent's own voice coming back, not as a barge-in. 0 turns it off. Chosen and measured in the
# line matrix (BENCHMARKS.md "Speech-in with Moonshine", its table "Barge-in over echo").
DEFAULT_ECHO_GATE_DB = echo.DEFAULT_MARGIN_DB




def otlp_base(text: str) -> str:
    """--otlp http://HOST:PORT: an OTLP/HTTP receiver's base (the agent posts to /v1/traces under it, so a URL
    given with it is taken without it)."""
    parts = urllib.parse.urlsplit(text.strip())
    trimmed = parts.path.rstrip("/")
    if trimmed.endswith("/v1/traces"):
        trimmed = trimmed[: -len("/v1/traces")]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, trimmed, "", ""))


def _port_refusal(port: int) -> str | None:
    return None if 0 <= port <= 65535 else f"a port is 0..65535, not {port}"


def _otlp_refusal(url: str) -> str | None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"not an http:// URL of an OTLP receiver: {url!r}"
    return None


@dataclass(frozen=True)
class AgentSettings:
    """Everything the agent is asked to serve. ``host`` and ``port`` are one flag, --listen (agent.command)."""

    host: str = setting(DEFAULT_HOST, name="--listen", offered=False, help="the address the agent listens on")
    port: int = setting(DEFAULT_PORT, name="--listen", offered=False, rule=Satisfies(_port_refusal, "a port"),
                        help="the port it listens on; 0: any free port (the ready line says which)")
    protocol: str = setting(wire.TWILIO, rule=OneOf(wire.PROTOCOLS),
                            help=f"{wire.protocols_said()}. The built-in engine serves "
                                 f"{' and '.join(wire.AGENT_PROTOCOLS)}; --engine pipecat the rest, the bridges with "
                                 "pipecat's own serializers, webrtc with its SmallWebRTC transport (the extras "
                                 "voice-llm[pipecat,webrtc]) (default {default})")
    rate: int = setting(wire.DEFAULT_PCM_RATE, metavar="HZ", rule=Between(1),
                        help="the PCM line's sample rate (default {default}; Twilio is 8000 always)")
    url: str = setting(DEFAULT_LLM_URL, rule=SERVER_URL,
                       help="the LLM server the agent asks (default: {default}, the managed server's default port); "
                            "may end in /v1")
    timeout: float = setting(StepOptions.timeout, metavar="SECONDS", rule=SECONDS, help=flags.TIMEOUT_HELP)
    deadline_s: float = setting(DEFAULT_DEADLINE_S, name="--deadline", metavar="SECONDS", rule=SECONDS,
                                help=flags.DEADLINE_HELP)  # the longest one reply's request may take
    api_key: str | None = setting(None, secret=True, help=flags.API_KEY_HELP)
    # the model name sent; None: the first id of /v1/models, or none when it has none
    model: str | None = setting(None, help="the model name sent in each request (default: the first id of "
                                           "/v1/models)")
    endpoint_ms: float = setting(vad.DEFAULT_ENDPOINT_MS, metavar="MS", rule=Between(0, above=True),
                                 help="silence that ends the caller's turn with --turn silence (default {default})")
    vad_threshold: float = vad.DEFAULT_THRESHOLD  # no flag: Silero's own
    stt: str = setting(sttmod.DEFAULT_STT, rule=OneOf(sttmod.STT_CHOICES),
                       help="moonshine: Moonshine tiny on onnxruntime; faster-whisper (or whisper): Whisper tiny.en; "
                            "none: a fixed line instead of a transcript (default {default})")
    stt_threads: int | None = setting(None, metavar="N", rule=Between(1),
                                      help="the STT's CPU threads (default: moonshine 1, faster-whisper every core)")
    speculative_stt: bool = setting(DEFAULT_SPECULATIVE_STT,
                                    help="transcribe from the VAD's speech end, before the endpoint, and commit at "
                                         "the endpoint (a resumed utterance drops it) (default {default})")
    # start the reply from that decode, held until the endpoint (True implies speculative_stt); None: the default,
    # DEFAULT_PREEMPTIVE for the builtin engine with speculative STT on, else off (see __post_init__)
    preemptive: bool | None = setting(None, help="start the reply (LLM and synthesis) from the speculative transcript "
                                                 "before the endpoint, send none of its audio until the endpoint "
                                                 "confirms it, drop it when speech resumes; implies "
                                                 "--speculative-stt; builtin engine (default "
                                                 f"{'on with speculative STT' if DEFAULT_PREEMPTIVE else 'off'})")
    # prefill the speculative transcript's turn when no preemptive reply starts from it (implies speculative_stt);
    # None: the default, DEFAULT_PREFILL_AHEAD for the builtin engine with speculative STT on (see __post_init__)
    prefill_ahead: bool | None = setting(None, help="when no preemptive reply starts from the speculative transcript, "
                                                    "ask the LLM server for one token of the conversation with it, so "
                                                    "its slot holds the turn's prompt when the endpoint comes; needs "
                                                    "an idle slot on /slots; implies --speculative-stt; builtin engine "
                                                    f"(default {'on with speculative STT' if DEFAULT_PREFILL_AHEAD else 'off'})")
    echo_gate_db: float = setting(DEFAULT_ECHO_GATE_DB, metavar="DB", rule=Between(0, 60, unit="dB"),
                                  help="take a caller frame this many dB below the loudest audio the caller just "
                                       "heard for the agent's own voice coming back, not a barge-in; 0: off "
                                       "(default {default}; builtin engine)")
    stt_window_s: int = setting(DEFAULT_STT_WINDOW_S, name="--stt-window", metavar="S",
                                rule=Between(sttmod.MIN_CHUNK_S, sttmod.DEFAULT_CHUNK_S, unit="s"),
                                help=f"Whisper's encoder window in seconds, {sttmod.MIN_CHUNK_S}-{sttmod.DEFAULT_CHUNK_S} "
                                     "(default {default}; a longer turn takes the 30 s path)")
    speech: TTSOptions = setting(default_factory=TTSOptions, help="how the replies are spoken: the speak step's "
                                                                   "--tts, --voice and --clause-words")
    tts_threads: int | None = setting(DEFAULT_TTS_THREADS, metavar="N", rule=Between(1),
                                      help="Piper's onnxruntime threads (default: onnxruntime's, one per core; "
                                           "measured in the agent's calls on 2 cores, one thread made the first "
                                           "audio later: BENCHMARKS.md)")
    strategy: str = setting(DEFAULT_STRATEGY, rule=OneOf(STRATEGIES),
                            help="how the replies are cut for speech (default {default})")
    max_tokens: int = setting(DEFAULT_MAX_TOKENS, metavar="N", rule=Between(1, 4096),
                              help="each reply's max_tokens (default {default})")
    dialogue: str = setting(DEFAULT_DIALOGUE, help="the bundled dialogue (or a dialogue file) whose system prompt is "
                                                   "used (default {default})")
    docs: int = setting(4, metavar="N", rule=Between(0), help="KB documents in the system prompt (default {default})")
    kb_dir: Path | None = setting(None, name="--kb", help=flags.KB_HELP)
    otlp: str | None = setting(None, metavar="http://HOST:PORT", parse=otlp_base,
                               rule=Satisfies(_otlp_refusal, "an OTLP receiver's http:// URL"),
                               help="export OpenTelemetry spans per turn to this OTLP/HTTP receiver (default: none)")
    max_calls: int = setting(DEFAULT_MAX_CALLS, metavar="N", rule=Between(1),
                             help="calls served at once; more are refused with close code 1013 (default {default})")
    engine: str = setting(DEFAULT_ENGINE, rule=OneOf(ENGINES),
                          help="builtin: voice-llm's pipeline; pipecat: a pipecat pipeline (the extra "
                               "voice-llm[pipecat]) (default {default})")
    turn: str = setting(TURNS[0], rule=OneOf(TURNS),
                        help="silence: the caller's turn ends after --endpoint-ms of silence; smart: pipecat's "
                             f"smart-turn v3.2 model judges it after {SMART_SILENCE_MS:g} ms of silence, complete "
                             f"ends it, incomplete waits for {SMART_FALLBACK_MS:g} ms of silence or for speech "
                             "(either engine; the extra voice-llm[pipecat]) (default {default})")
    ready_file: Path | None = setting(None, metavar="PATH", help="write the ready line (JSON: listen, protocol, "
                                                                 "engines, versions, pid) here when serving")
    # the lab's probe asks for it on a server whose stream carries no timings
    include_usage: bool = setting(False, switch="on",
                                  help="ask the server for a final usage chunk (stream_options.include_usage), as the "
                                       "lab's requests do on a server whose stream carries no timings (vLLM, SGLang)")
    # one request with the system prompt before the first call, so its prefix is cached
    prime: bool = setting(True, name="--no-prime", switch="off",
                          help="send no priming request with the system prompt before the first call")

    def __post_init__(self) -> None:
        flags.check(self)
        object.__setattr__(self, "stt", sttmod.canonical(self.stt))
        if self.stt == "none" and (self.preemptive or self.prefill_ahead):  # asked for: the defaults are None here
            raise ConfigError("--preemptive and --prefill-ahead start from the caller's transcript: --stt none makes "
                              "none")
        if self.preemptive is None:  # the default: a --no-speculative-stt or pipecat agent is not made preemptive
            object.__setattr__(self, "preemptive",
                               DEFAULT_PREEMPTIVE and self.engine == "builtin" and self.speculative_stt
                               and self.stt != "none")
        if self.prefill_ahead is None:  # the default, as preemptive's
            object.__setattr__(self, "prefill_ahead",
                               DEFAULT_PREFILL_AHEAD and self.engine == "builtin" and self.speculative_stt
                               and self.stt != "none")
        if (self.preemptive or self.prefill_ahead) and not self.speculative_stt:
            object.__setattr__(self, "speculative_stt", True)  # both start from the speculative transcript
        # voice-llm's own agent serves Twilio and PCM; pipecat's serves Twilio and the phone bridges, each with
        # pipecat's own serializer (it has none for raw PCM frames), and WebRTC with its SmallWebRTC transport
        served = wire.AGENT_PROTOCOLS if self.engine == "builtin" else PIPECAT_PROTOCOLS
        if self.protocol not in served:
            raise ConfigError(f"--protocol {self.protocol!r}: the {self.engine} agent serves "
                              f"{', '.join(served)}")
        try:
            self.line
        except ValueError as exc:
            raise ConfigError(f"--rate: {exc}") from None
        if self.engine == "pipecat":
            self._check_pipecat()

    def _check_pipecat(self) -> None:
        """What pipecat's pipeline cannot serve (agent.pipecat_agent), refused as any bad setting is."""
        if self.preemptive:
            raise ConfigError("--preemptive is the builtin engine's (pipecat's pipeline has its own turn handling)")
        if self.prefill_ahead:
            raise ConfigError("--prefill-ahead is the builtin engine's (pipecat's pipeline has its own turn handling)")
        if self.stt == "none":
            raise ConfigError("--stt none is the builtin engine's (pipecat's pipeline transcribes: moonshine or "
                              "faster-whisper)")
        if self.turn == "silence" and self.endpoint_ms / 1000.0 < PIPECAT_VAD_STOP_S:
            raise ConfigError(f"--endpoint-ms for the pipecat agent is at least {PIPECAT_VAD_STOP_S * 1000:g} "
                              f"(pipecat's VAD stop), not {self.endpoint_ms:g}")

    @property
    def line(self) -> wire.LineFormat:
        return wire.line_for(self.protocol, self.rate if self.protocol == wire.PCM else None)


# --- the agent's flags, and its settings from them ----------------------------------------------------------------

AGENT_FLAGS = flags.flags_of(AgentSettings)  # every setting with a flag of its own, in declaration order


def listen_address(text: str) -> tuple[str, int]:
    """--listen HOST:PORT, as the host and the port (the port's range is the settings' rule)."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {text!r}")
    return host, flags.whole(port)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """`voice-llm agent`'s flags: --listen (the host and the port), every setting's own, --settings FILE."""
    parser.add_argument("--listen", type=listen_address, default=None, metavar="HOST:PORT",
                        help=f"where the agent listens (default {AgentSettings.host}:{AgentSettings.port}; port 0: "
                             "any free one)")
    AGENT_FLAGS.add(parser)
    parser.add_argument("--settings", type=Path, default=None, metavar="FILE",
                        help="start from these settings, a JSON object of AgentSettings' fields by name (what the "
                             "lab's converse step hands its agent); each flag given beside it wins over the file")


def settings_from(values: Mapping[str, Any]) -> AgentSettings:
    """The agent's settings: its declared defaults, then the settings file (--settings), then the flags given;
    the API key from --api-key or the environment, never from a file."""
    given = AGENT_FLAGS.given(values)
    if values.get("listen") is not None:
        given["host"], given["port"] = values["listen"]
    given["api_key"] = api_key_from_env(given.get("api_key"))
    file = values.get("settings")
    return flags.build(AgentSettings, flags.read_settings(AgentSettings, file) if file is not None else {}, given)


def settings_of_command_line(command: Sequence[str]) -> AgentSettings | None:
    """What a running agent was asked to serve, from its command line (/proc/PID/cmdline: ``... agent FLAGS``),
    read as the agent itself reads it (its flags, its settings file); None when it is no agent's line, or one this
    version cannot read (another's flags, a settings file gone)."""
    words = list(command)
    if "agent" not in words:
        return None
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    add_flags(parser)
    try:
        values, _ = parser.parse_known_args(words[words.index("agent") + 1:])
        return settings_from(vars(values))
    except (argparse.ArgumentError, ConfigError, SystemExit):
        return None
