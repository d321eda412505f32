"""The settings of a load sweep and of its callers, as plain values that travel between processes as JSON.

No Locust here: the `load` command builds these in the voice-llm process; the master subprocess and the workers
read them back. A dialing caller's call is dial's own settings (DialOptions, as `dial --settings FILE` reads them),
never a copy of them here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

from voice_llm.capabilities.dial import DialOptions
from voice_llm.capabilities.load import stats
from voice_llm.core.run import flags
from voice_llm.core.server.config import api_key_from_env
from voice_llm.core.sse import parse_json

SPEECH_WORDS_PER_S = 2.5  # the brief's speaking rate when no measured audio says otherwise
DEFAULT_CALLERS = (1, 2, 4, 8)
# The longest measured window of a text step: it ends sooner, once MIN_JUDGED_TURNS judged turns are in (as a
# dialing step's does). Measured (BENCHMARKS.md "text-mode load: a verdict in minutes"): one caller of the default
# scenario takes ~5 s a turn on an idle 2-core box, so 20 turns come in ~100 s: a verdict within 2 minutes a step.
DEFAULT_STEP_S = 120.0
DEFAULT_WARMUP_S = 15.0
# The default caller of text-mode load, made for a verdict in minutes (the same measurement): the clinic call's
# 64-token answers are 45-58 words, 18-23 s of listening at 2.5 words/s, which made a turn ~25 s at one caller
# (2.4 turns a minute). Load caps the answers at LOAD_MAX_TOKENS (one short spoken sentence or two: the first
# sentence, which the SLO judges, is measured the same) and scales every think time by LOAD_THINK_SCALE.
LOAD_MAX_TOKENS = 32
LOAD_THINK_SCALE = 0.25
DEFAULT_SLO_FIRST_SENTENCE_MS = 1000.0
DEFAULT_BARGE_IN_SHARE = 0.1
DEFAULT_MASTER_PORT = 5557
# Dialing callers (load --dial URL): the heard-gap SLO and short turns, so that a step is judged in minutes (issue
# 30 item 4): the `load` caller lines (dial's --caller-lines load: short clinic questions, about a second each), 4
# per call (the dial subprocess's start and the call's lead silence, ~3 s, spread over 4 turns), no barge-in (its
# cut-off reply would end the turn early), the caller's lines made once per worker and reused
# (voice_llm.capabilities.load.dialing), and a think pause scaled to the reply heard (DIAL_THINK_SHARE of it, after dial's
# reply-end silence). The replies are the agent's: start it with a short --max-tokens (AGENT_LOAD_MAX_TOKENS).
DEFAULT_SLO_HEARD_MS = 1500.0
DIAL_TURNS = 4
DIAL_LINES = "load"  # dial --caller-lines: load (default) or clinic (the dialogue's longer lines)
DIAL_LINE_SETS = ("load", "clinic")
DIAL_THINK_MS = 0.0  # the fixed part of the caller's pause after a reply (dial --think-ms; dial's own default 300)
DIAL_THINK_SHARE = 0.1  # ... plus this share of the reply as heard (dial --think-share): 3 s heard, 300 ms pause
DIAL_STT = "none"  # the heard replies untranscribed: a load step needs when the caller heard, not the words
AGENT_LOAD_MAX_TOKENS = 12  # what `load --dial --help` and docs/load.md tell the user to start the agent with
DIAL_CALLERS = (1, 2, 3, 4, 6, 8)  # a CPU box holds few real-time callers: small steps up
DIAL_STEP_S = 300.0  # the longest measured window: it ends once MIN_JUDGED_TURNS judged turns are in
DIAL_WARMUP_S = 20.0
REFUSED_PAUSE_S = 5.0  # after a refused or failed call, before the caller dials again


@dataclass(frozen=True)
class CallerConfig:
    """What every simulated caller does; sent by the master to every worker (also remote ones)."""

    url: str
    system: str
    turns: tuple[str, ...]
    max_tokens: int = 64
    history: bool = True
    cache_prompt: bool = True
    answer_words_per_s: float = SPEECH_WORDS_PER_S  # how fast the assistant's answer is spoken
    caller_words_per_s: float = SPEECH_WORDS_PER_S  # how fast the caller speaks their line
    think_scale: float = 1.0  # 0 = no think time at all (a stress test, not a phone call)
    barge_in_share: float = DEFAULT_BARGE_IN_SHARE
    barge_in_max_tokens: int = 40  # a barge-in cuts the answer after a random 1..N content chunks
    timeout_s: float = 120.0
    seed: int = 7
    model: str | None = None  # the model name each request carries (the first id of the server's /v1/models)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> CallerConfig:
        data = parse_json(text)  # the one guarded parser (a config nested too deep is a ValueError, not a crash)
        data["turns"] = tuple(data["turns"])
        return cls(**data)


@dataclass(frozen=True)
class SweepPlan:
    """The stepped sweep one master runs against one server."""

    caller: CallerConfig
    callers: tuple[int, ...] = DEFAULT_CALLERS
    step_s: float = DEFAULT_STEP_S
    warmup_s: float = DEFAULT_WARMUP_S
    slo_first_sentence_ms: float = DEFAULT_SLO_FIRST_SENTENCE_MS
    local_workers: int = 2  # worker processes the master starts itself; 0 with --master (remote workers)
    expect_workers: int = 2
    bind_host: str = "127.0.0.1"
    master_port: int = DEFAULT_MASTER_PORT
    drain_timeout_s: float = 120.0  # wait at most this long for turns still running after a measured window
    connect_timeout_s: float = 60.0  # for the workers to connect
    stop_on_budget: bool = True
    slots: int | None = None  # the server's slots, when known (for the verdict's "limited by")
    quiet: bool = False  # no progress lines from the master
    dial: DialOptions | None = None  # dialing callers (load --dial), their call (run.dial_caller): judged on the heard gap
    slo_heard_ms: float = DEFAULT_SLO_HEARD_MS
    enough_judged: int | None = None  # end a measured window once this many judged turns were reported (None: at step_s)

    @property
    def metric(self) -> str:
        """The sample column each turn is judged on (voice_llm.capabilities.load.stats)."""
        return stats.DIAL_METRIC if self.dial is not None else stats.TEXT_METRIC

    @property
    def decide_early(self) -> bool:
        """A step that already missed more than the target allows is judged failing at once
        (voice_llm.capabilities.load.stats.failed_early), and its measured window ends there: dialing callers, and text callers
        since load.json 4 (a text step at 1 caller on a loaded box missed 4 of 4 turns by 20 s each, and had no
        verdict after its 120 s window)."""
        return True

    @property
    def warmup_cap_s(self) -> float:
        """The longest a text step's warm-up may last (stats.warm_up): --warmup-s, a caller's lead-in before its
        first turn (at most twice its first line's speaking time, scaled as locust_users.VoiceCaller thinks), the
        turn's no-content timeout (a turn that gets nothing by then ends as an error, which finishes it) and
        --step-s for the answer itself: past it no caller can still be on its first turn of a live server."""
        first = self.caller.turns[0] if self.caller.turns else ""
        rate = self.caller.caller_words_per_s
        lead_in = 2 * (len(first.split()) / rate if rate > 0 else 0.0) * self.caller.think_scale
        return self.warmup_s + lead_in + self.caller.timeout_s + self.step_s

    @property
    def slo_ms(self) -> float:
        return self.slo_heard_ms if self.dial is not None else self.slo_first_sentence_ms

    def to_json(self) -> str:
        data = asdict(replace(self, dial=None))
        data["dial"] = flags.as_json(self.dial) if self.dial is not None else None  # dial's settings as dial reads them
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> SweepPlan:
        data = parse_json(text)  # the one guarded parser (a config nested too deep is a ValueError, not a crash)
        caller = data.pop("caller")
        caller["turns"] = tuple(caller["turns"])
        data["callers"] = tuple(data["callers"])
        dial = data.pop("dial", None)
        if dial is not None:
            dial = flags.build(DialOptions, flags.from_json(DialOptions, dial, "the sweep plan's dial"))
        return cls(caller=CallerConfig(**caller), dial=dial, **data)


def api_key() -> str | None:
    """The workers read the key from their own environment (ENV_API_KEY), never from the master."""
    return api_key_from_env(None)
