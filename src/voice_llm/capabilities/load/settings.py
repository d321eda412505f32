"""What a `load` run is told: its settings, one frozen value (the command's flags, or a library caller's). Each
setting is declared once below (voice_llm.core.run.flags.setting: default, help, flag, rule); the command's own
flags are derived from the declarations (load.cli), and the rules are checked once, when the value is made."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from voice_llm.capabilities.dial import DialOptions
from voice_llm.capabilities.load import stats
from voice_llm.capabilities.load.plan import (AGENT_LOAD_MAX_TOKENS, DEFAULT_BARGE_IN_SHARE, DEFAULT_CALLERS,
                                              DEFAULT_MASTER_PORT, DEFAULT_SLO_FIRST_SENTENCE_MS, DEFAULT_SLO_HEARD_MS,
                                              DEFAULT_STEP_S, DEFAULT_WARMUP_S, DIAL_CALLERS, DIAL_LINE_SETS,
                                              DIAL_LINES, DIAL_STEP_S, DIAL_TURNS, DIAL_WARMUP_S, LOAD_MAX_TOKENS,
                                              LOAD_THINK_SCALE, SPEECH_WORDS_PER_S)
from voice_llm.core.errors import ConfigError
from voice_llm.core.run import flags
from voice_llm.core.run.context import StepOptions
from voice_llm.core.run.flags import Between, Each, OneOf, Satisfies, setting
from voice_llm.core.scenario import dialogue as dialogues
from voice_llm.core.scenario.kb import default_kb_dir
from voice_llm.core.server.config import DEFAULT_CTX, DEFAULT_PORT, default_out_dir
from voice_llm.engines.line import wire

DEFAULT_SLOTS = (1, 4)  # the managed servers swept when none is running on --port and --slots is not given
PORT = Between(1, 65535)
SOME_STEPS = flags.Each(Between(1), some=True)


def _csv(values: tuple[int, ...]) -> str:
    return ",".join(str(v) for v in values)


def _websocket_refusal(url: str) -> str | None:
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    return None if scheme in ("ws", "wss") else f"not the agent's WebSocket (ws:// or wss://): {url!r}"


@dataclass(frozen=True)
class LoadSettings:
    """Everything a load run needs. ``url`` None: the managed llama-server on ``port``, started once per value of
    ``slots`` (each slot with ``CTX_PER_SLOT`` tokens, or ``ctx`` when that is more) and stopped after its sweep
    when this run started it. ``dial``: the agent's WebSocket; each caller is then a real call on the line
    (voice_llm.capabilities.load.dialing), judged on the heard gap against ``slo_heard_ms``, and no LLM server is started or
    asked (the agent has its own). ``callers``, ``step_s``, ``warmup_s`` left None take the mode's defaults.
    The settings every command that writes a run shares (``offered=False``) come with the core's own flags
    (voice_llm.core.run.flags: --out, --url, --timeout, --kb, --wait, --new-run, --quiet, --api-key)."""

    out: Path = setting(default_factory=default_out_dir, name="--out", offered=False, help="artifact folder")
    kb_dir: Path | None = setting(None, name="--kb", offered=False, help=flags.KB_HELP)
    url: str | None = setting(None, offered=False, rule=flags.SERVER_URL, help=flags.URL_HELP)
    api_key: str | None = setting(None, offered=False, secret=True, help=flags.API_KEY_HELP)
    # each caller's request: seconds without content
    timeout: float = setting(StepOptions.timeout, offered=False, rule=flags.SECONDS, help=flags.TIMEOUT_HELP)
    wait_for_out: bool = setting(False, name="--wait", offered=False, help="wait for another run writing to OUT")
    # OUT holds a run made against another server: replace it instead of refusing
    new_run: bool = setting(False, offered=False, help="replace a run made against another server")
    quiet: bool = setting(False, offered=False, help=flags.QUIET_HELP)
    # the sweep
    callers: tuple[int, ...] = setting(None, rule=SOME_STEPS,  # None: the mode's default (__post_init__)
                                       help=f"steps of concurrent callers, upward (default {_csv(DEFAULT_CALLERS)}; "
                                            f"--dial {_csv(DIAL_CALLERS)})")
    max_callers: int = setting(64, rule=Between(1), help="never run a step with more callers than this")
    step_s: float = setting(None, rule=Between(0, above=True),
                            help=f"the longest measured window per step (s; default {DEFAULT_STEP_S:g}, --dial "
                                 f"{DIAL_STEP_S:g}): it ends sooner, once {stats.MIN_JUDGED_TURNS} judged turns are in")
    warmup_s: float = setting(None, rule=Between(0),
                              help=f"dropped window at the start of each step (s; default {DEFAULT_WARMUP_S:g}, --dial "
                                   f"{DIAL_WARMUP_S:g})")
    # dialing callers (load --dial URL)
    dial: str | None = setting(None, metavar="URL", rule=Satisfies(_websocket_refusal, "a ws:// URL"),
                               help="the agent's WebSocket, e.g. ws://127.0.0.1:18300/ of `voice-llm agent --max-calls "
                                    f"8 --max-tokens {AGENT_LOAD_MAX_TOKENS}` (short replies: a step is judged in "
                                    "minutes; add --otlp http://HOST:PORT with --otlp-listen for its stage times) on an "
                                    "LLM server with a slot per caller (`voice-llm up --slots 4 --ctx 16384`: with one "
                                    "slot, calls queue and re-prefill each other's history); no LLM server is started "
                                    "or asked")
    slo_heard_ms: float = setting(DEFAULT_SLO_HEARD_MS, rule=Between(0, above=True),
                                  help="heard-gap budget: goodput counts turns heard within it; the sweep stops when "
                                       "p90 exceeds it")
    dial_turns: int = setting(DIAL_TURNS, rule=Between(1),
                              help="caller lines per call (default {default}: short calls, a verdict in minutes)")
    dial_lines: str = setting(DIAL_LINES, rule=OneOf(DIAL_LINE_SETS),  # the caller lines (dial --caller-lines)
                              help="the caller's lines (dial --caller-lines; default {default}: short clinic "
                                   "questions, about a second each; clinic: the dialogue's longer ones)")
    dial_barge_in_turns: tuple[int, ...] = setting((), metavar="DIAL_BARGE_IN_TURNS", rule=Each(Between(1)),
                                                   help="turns whose reply the caller cuts into (default none)")
    # the line and the call's deadline: dial's own defaults (DialOptions), which the calls otherwise take
    dial_protocol: str = setting(DialOptions.protocol, rule=OneOf((wire.TWILIO, wire.PCM)),
                                 help="the line (default {default})")
    dial_deadline_s: float = setting(DialOptions.deadline_s, name="--dial-deadline", metavar="DIAL_DEADLINE_S",
                                     rule=Between(0, above=True),
                                     help="dial --deadline: the longest wait for the handshake, a reply, a reply's "
                                          "end (s)")
    # HOST:PORT: one OTLP receiver for the agent's spans of every call (load.stages)
    otlp_listen: str | None = setting(None, metavar="HOST:PORT",
                                      help="receive the agent's OTel spans of every call here (start the agent with "
                                           "--otlp http://HOST:PORT): each step gets the agent's stage times and the "
                                           "stage that grew most")
    slo_first_sentence_ms: float = setting(DEFAULT_SLO_FIRST_SENTENCE_MS, rule=Between(0, above=True),
                                           help="first-sentence budget: goodput counts turns within it; the sweep "
                                                "stops when p90 exceeds it")
    stop_on_budget: bool = setting(True, name="--no-stop", switch="off", help="run every step even past the budget")
    workers: int = setting(2, rule=Between(1), help="local Locust worker processes")
    # the managed server; slots None: the managed server already running on ``port`` as it is (its slots and
    # context), else one sweep per DEFAULT_SLOTS
    slots: tuple[int, ...] | None = setting(None, rule=SOME_STEPS,
                                            help="managed server: one sweep per slot count (-np), e.g. 1,4; each slot "
                                                 "gets a 4096 context (default: the managed server running on --port "
                                                 f"as it is, else {_csv(DEFAULT_SLOTS)})")
    port: int = setting(DEFAULT_PORT, rule=PORT, help="port of the managed server")
    ctx: int = setting(DEFAULT_CTX, rule=Between(1), help="at least this context (default: 4096 per slot)")
    threads: int | None = setting(None, rule=Between(1), help="CPU threads for the managed server")
    model: str | None = setting(None, help="GGUF model file for the managed server")  # the managed server's GGUF
    server_bin: str | None = setting(None, help="llama-server binary for the managed server")
    # the callers
    dialogue: str = setting(dialogues.DEFAULT_DIALOGUE,
                            help=f"bundled dialogue, or {dialogues.LAB_TTFT} (the ttft step's request, cache off, as "
                                 "a call)")
    docs: int = setting(dialogues.DEFAULT_DOCS, rule=Between(0), help="KB documents in the system prompt")
    # None: the dialogue's, capped at plan.LOAD_MAX_TOKENS (lab-ttft: its own)
    max_tokens: int | None = setting(None, rule=Between(1),
                                     help=f"cap each answer (default: the dialogue's, at most {LOAD_MAX_TOKENS}: "
                                          "short replies for load)")
    think_scale: float = setting(LOAD_THINK_SCALE, rule=Between(0),
                                 help="multiply every think time, the caller's line and listening to the answer (0: "
                                      "none; 1: as long as speaking takes)")
    barge_in: float = setting(DEFAULT_BARGE_IN_SHARE, rule=Between(0, 1), help="share of turns the caller cuts short")
    caller_words_per_s: float = setting(SPEECH_WORDS_PER_S, rule=Between(0, above=True), help="how fast callers speak")
    # distributed (--master and --worker exclude each other: load.cli)
    master: bool = setting(False, switch="on", help="run only the master; workers join from other machines")
    worker: bool = setting(False, switch="on", help="run one Locust worker for a master at --master-host")
    expect_workers: int = setting(1, rule=Between(1), help="with --master: workers to wait for")
    master_host: str = setting("127.0.0.1", help="with --worker: the master's address")
    master_bind_host: str = setting("0.0.0.0", help="with --master: the interface workers connect to")
    master_port: int | None = setting(None, rule=PORT,
                                      help="the port the master listens on for workers (--master, --worker: default "
                                           f"{DEFAULT_MASTER_PORT}; local workers: a free port unless given)")

    def __post_init__(self) -> None:
        flags.check(self)
        dial = self.dial is not None
        if self.otlp_listen is not None and not dial:  # a flag combination: refused as a bad flag (exit 2)
            raise ConfigError("--otlp-listen receives a voice agent's spans: it goes with --dial URL")
        if dial and self.url:  # likewise a flag combination (it was exit 1, found by a newcomer's walkthrough)
            raise ConfigError("--dial measures the agent at its URL; the LLM server behind it is the agent's own "
                              "(`voice-llm agent --url ...`): drop --url")
        if dial and any(t < 1 or t >= self.dial_turns for t in self.dial_barge_in_turns):
            raise ConfigError(f"--dial-barge-in-turns {list(self.dial_barge_in_turns)}: a barge-in cuts into turn "
                              f"K's reply with line K+1, so K must be 1..{self.dial_turns - 1} (--dial-turns "
                              f"{self.dial_turns})")
        for name, text, dialing in (("callers", DEFAULT_CALLERS, DIAL_CALLERS), ("step_s", DEFAULT_STEP_S, DIAL_STEP_S),
                                    ("warmup_s", DEFAULT_WARMUP_S, DIAL_WARMUP_S)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, dialing if dial else text)

    @property
    def kb(self) -> Path:
        return Path(self.kb_dir) if self.kb_dir else default_kb_dir()
