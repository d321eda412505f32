"""What `voice-llm agent` is asked to serve: one frozen value the CLI builds from its flags, and that every engine
(the built-in pipeline, voice_llm.capabilities.agent.server; pipecat's, voice_llm.capabilities.agent.pipecat_agent) takes whole."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voice_llm.capabilities.agent import echo
from voice_llm.core.errors import ConfigError
from voice_llm.engines.line import wire
from voice_llm.engines.speech_in import stt

ENGINES = ("builtin", "pipecat")
# pipecat 1.14's serializers, and its SmallWebRTC transport (webrtc): voice_llm.capabilities.agent.pipecat_agent
PIPECAT_PROTOCOLS = (wire.TWILIO, *wire.BRIDGES, wire.WEBRTC)
DEFAULT_ENGINE = "builtin"
TURNS = ("silence", "smart")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 18300
DEFAULT_MAX_CALLS = 1
DEFAULT_MAX_TOKENS = 48  # docs/line.md: a reply the caller may talk over must still be streaming then
DEFAULT_ENDPOINT_MS = 300.0
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
# The echo gate (issue 39 item 4, agent.echo): a caller frame this many dB below the loudest audio the caller just
# heard is taken as the agent's own voice coming back, not as a barge-in. 0 turns it off. Chosen and measured in the
# line matrix (BENCHMARKS.md "Speech-in with Moonshine", its table "Barge-in over echo").
DEFAULT_ECHO_GATE_DB = echo.DEFAULT_MARGIN_DB


@dataclass(frozen=True)
class AgentSettings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT  # 0: any free port (the ready line says which)
    protocol: str = wire.TWILIO
    rate: int = wire.DEFAULT_PCM_RATE  # the PCM line's rate; a Twilio line is 8 kHz mu-law always
    url: str = "http://127.0.0.1:8080"  # the LLM server (any OpenAI-compatible one)
    model: str | None = None  # the model name sent; None: the first id of /v1/models, or none when it has none
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 120.0  # seconds without a token
    deadline_s: float = 600.0  # the longest one reply's request may take
    endpoint_ms: float = DEFAULT_ENDPOINT_MS
    vad_threshold: float = 0.5
    echo_gate_db: float = DEFAULT_ECHO_GATE_DB  # agent.echo's margin; 0: off
    stt: str = stt.DEFAULT_STT  # moonshine; "whisper" is recorded as faster-whisper
    stt_threads: int | None = None  # None: the STT's own default (speech.stt.default_threads: Moonshine 1, Whisper all)
    stt_window_s: int = DEFAULT_STT_WINDOW_S  # Whisper's encoder window (speech.stt chunk_s); see the constant
    speculative_stt: bool = DEFAULT_SPECULATIVE_STT  # decode from the VAD's speech end, commit at the endpoint
    # start the reply from that decode, held until the endpoint (True implies speculative_stt); None: the default,
    # DEFAULT_PREEMPTIVE for the builtin engine with speculative STT on, else off (see __post_init__)
    preemptive: bool | None = None
    tts: str = "piper"
    voice: str | None = None
    tts_threads: int | None = DEFAULT_TTS_THREADS  # Piper's onnxruntime intra-op threads; None: one per core
    strategy: str = DEFAULT_STRATEGY
    clause_words: int = 4
    max_tokens: int = DEFAULT_MAX_TOKENS
    dialogue: str = "clinic"
    docs: int = 4
    kb_dir: Path | None = None
    otlp: str | None = None  # http://HOST:PORT of an OTLP/HTTP receiver; None: no spans
    max_calls: int = DEFAULT_MAX_CALLS
    engine: str = DEFAULT_ENGINE
    ready_file: Path | None = None
    turn: str = "silence"  # Silero then --endpoint-ms of silence, or smart: pipecat's smart-turn model (both engines)
    prime: bool = True  # one request with the system prompt before the first call, so its prefix is cached
    include_usage: bool = False  # stream_options.include_usage on every request (the lab's probe asks for it)
    extra: dict[str, Any] = field(default_factory=dict)  # engine-specific settings (pipecat's --turn)

    def __post_init__(self) -> None:
        if self.stt not in stt.STT_CHOICES:
            raise ConfigError(f"--stt must be one of {', '.join(stt.STT_CHOICES)}, not {self.stt!r}")
        object.__setattr__(self, "stt", stt.canonical(self.stt))
        if self.preemptive is None:  # the default: a --no-speculative-stt or pipecat agent is not made preemptive
            object.__setattr__(self, "preemptive",
                               DEFAULT_PREEMPTIVE and self.engine == "builtin" and self.speculative_stt
                               and self.stt != "none")
        if self.preemptive and not self.speculative_stt:
            object.__setattr__(self, "speculative_stt", True)  # the reply starts from the speculative transcript
        if self.engine not in ENGINES:
            raise ConfigError(f"--engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")
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
        if self.max_calls < 1:
            raise ConfigError(f"--max-calls must be at least 1, not {self.max_calls}")
        if self.turn not in TURNS:
            raise ConfigError(f"--turn must be one of {', '.join(TURNS)}, not {self.turn!r}")
        if not stt.MIN_CHUNK_S <= self.stt_window_s <= stt.DEFAULT_CHUNK_S:
            raise ConfigError(f"--stt-window must be {stt.MIN_CHUNK_S}-{stt.DEFAULT_CHUNK_S} s, not {self.stt_window_s}")
        if not 0 <= self.echo_gate_db <= 60:
            raise ConfigError(f"--echo-gate-db must be 0 (off) to 60 dB, not {self.echo_gate_db:g}")
        if not 1 <= self.max_tokens <= 4096:
            raise ConfigError(f"--max-tokens must be 1-4096, not {self.max_tokens}")

    @property
    def llm_url(self) -> str:
        """The LLM server's URL by the name pipecat_agent's settings give it."""
        return self.url

    @property
    def line(self) -> wire.LineFormat:
        return wire.line_for(self.protocol, self.rate if self.protocol == wire.PCM else None)
