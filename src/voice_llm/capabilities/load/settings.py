"""What a `load` run is told: its settings, one frozen value (the command's flags, or a library caller's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from voice_llm.capabilities.load.plan import (DEFAULT_BARGE_IN_SHARE, DEFAULT_CALLERS, DEFAULT_SLO_FIRST_SENTENCE_MS,
                                 DEFAULT_SLO_HEARD_MS, DEFAULT_STEP_S, DEFAULT_WARMUP_S, DIAL_CALLERS, DIAL_DEADLINE_S,
                                 DIAL_LINES, DIAL_STEP_S, DIAL_TURNS, DIAL_WARMUP_S, LOAD_THINK_SCALE,
                                 SPEECH_WORDS_PER_S)
from voice_llm.core.scenario import dialogue as dialogues
from voice_llm.core.scenario.kb import default_kb_dir
from voice_llm.core.server.config import DEFAULT_CTX, DEFAULT_PORT, default_out_dir

DEFAULT_SLOTS = (1, 4)  # the managed servers swept when none is running on --port and --slots is not given


@dataclass(frozen=True)
class LoadSettings:
    """Everything a load run needs. ``url`` None: the managed llama-server on ``port``, started once per value of
    ``slots`` (each slot with ``CTX_PER_SLOT`` tokens, or ``ctx`` when that is more) and stopped after its sweep
    when this run started it. ``dial``: the agent's WebSocket; each caller is then a real call on the line
    (voice_llm.capabilities.load.dialing), judged on the heard gap against ``slo_heard_ms``, and no LLM server is started or
    asked (the agent has its own). ``callers``, ``step_s``, ``warmup_s`` left None take the mode's defaults."""

    out: Path = field(default_factory=default_out_dir)
    kb_dir: Path | None = None
    url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 120.0  # each caller's request: seconds without content
    wait_for_out: bool = False
    new_run: bool = False  # OUT holds a run made against another server: replace it instead of refusing
    quiet: bool = False
    # the sweep
    callers: tuple[int, ...] = None  # type: ignore[assignment]  # None: the mode's default (__post_init__)
    max_callers: int = 64
    step_s: float = None  # type: ignore[assignment]
    warmup_s: float = None  # type: ignore[assignment]
    slo_first_sentence_ms: float = DEFAULT_SLO_FIRST_SENTENCE_MS
    stop_on_budget: bool = True
    workers: int = 2
    # the managed server; slots None: the managed server already running on ``port`` as it is (its slots and
    # context), else one sweep per DEFAULT_SLOTS
    slots: tuple[int, ...] | None = None
    port: int = DEFAULT_PORT
    ctx: int = DEFAULT_CTX
    threads: int | None = None
    model: str | None = None  # the GGUF file of the managed server
    server_bin: str | None = None
    # the callers
    dialogue: str = dialogues.DEFAULT_DIALOGUE
    docs: int = dialogues.DEFAULT_DOCS
    max_tokens: int | None = None  # None: the dialogue's, capped at plan.LOAD_MAX_TOKENS (lab-ttft: its own)
    think_scale: float = LOAD_THINK_SCALE
    barge_in: float = DEFAULT_BARGE_IN_SHARE
    caller_words_per_s: float = SPEECH_WORDS_PER_S
    # distributed
    master: bool = False
    worker: bool = False
    expect_workers: int = 1
    master_host: str = "127.0.0.1"
    master_bind_host: str = "0.0.0.0"
    master_port: int | None = None
    # dialing callers (load --dial URL)
    dial: str | None = None
    slo_heard_ms: float = DEFAULT_SLO_HEARD_MS
    dial_turns: int = DIAL_TURNS
    dial_lines: str = DIAL_LINES  # the caller lines (dial --caller-lines): load (short) or clinic
    dial_barge_in_turns: tuple[int, ...] = ()
    dial_protocol: str = "twilio"
    dial_deadline_s: float = DIAL_DEADLINE_S
    otlp_listen: str | None = None  # HOST:PORT: one OTLP receiver for the agent's spans of every call (load.stages)

    def __post_init__(self) -> None:
        dial = self.dial is not None
        for name, text, dialing in (("callers", DEFAULT_CALLERS, DIAL_CALLERS), ("step_s", DEFAULT_STEP_S, DIAL_STEP_S),
                                    ("warmup_s", DEFAULT_WARMUP_S, DIAL_WARMUP_S)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, dialing if dial else text)

    @property
    def kb(self) -> Path:
        return Path(self.kb_dir) if self.kb_dir else default_kb_dir()
