"""dial.json (and dial-partial.json) as one value: the file's shape typed once, read by one ``parse``, written from
the same type.

dial.json was a dict: dial/checks.py read it with a hundred ``.get("...")`` calls, the report, the key numbers
and load's dialing read it raw again, and the tests' folder builder wrote a dial.json of its own idea, sharing no
type with the dialer's writer. Here every block of the file is a frozen dataclass (:class:`DialDoc` down to a
turn's :class:`Heard`), read as :mod:`voice_llm.core.run.artifacts` reads the core's files: the type of each field the
code reads (a finite number, a whole number, true or false, a string, a list, an object), one
:class:`~voice_llm.core.errors.ArtifactError` line naming the file and the field when it is not (``dial.json:
turns[2].heard.gap_ms is 'x', not a finite number``), the run's ``schema_version`` by the folder's rule and
``dial_schema_version`` refused when newer than this voice-llm's. :meth:`voice_llm.core.run.folder.RunFolder.artifact`
parses it once per folder.

What the types do not hold is the relations between fields (a gap is first sound minus speech end, the summary is
its turns'): those are the checks', which FAIL when they break. A field a dial.json of an older version lacks is
None (or empty) here, and the check that needs it says so. Keys not typed here (a block another capability adds:
a WebRTC line's, the agent's OTLP summary) are kept in each block's ``extra`` and written back after the typed
keys, so that parse then :meth:`Block.as_dict` gives the document back, key for key, value for value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from voice_llm.core.run.blocks import (Block, Document, as_is, block, flag, number, numbers, reasons, span, text, tuple_of,
                                  typed, whole)
from voice_llm.core.util.artifacts import DIAL, DIAL_PARTIAL

__all__ = ["Agent", "AgentReported", "BargeIn", "CutOff", "DIAL_SCHEMA_VERSION", "DialDoc", "DialPartialDoc",
           "DialerCost", "FalseBargeIn", "Files", "Floor", "Heard", "Line", "Otlp", "Playout", "Settings", "Spread",
           "Summary", "Turn", "TurnCaller", "Wer"]

DIAL_SCHEMA_VERSION = 4  # dial.json's own shape (dial_schema_version; schema_version is the run's stamp)

# --- the blocks of dial.json ---------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Agent(Block):
    url: str | None = typed(text)
    protocol: str | None = typed(text)
    headers: Any = typed(as_is)
    identity: Any = typed(as_is)  # what the agent said of itself (its ready line), or None


@dataclass(frozen=True, kw_only=True)
class Line(Block):
    """The line as dialed: its format and the phone's side of it (jitter, loss, echo). Other keys (a WebRTC
    line's block) are kept in ``extra``."""

    protocol: str = typed(text, required=True)
    codec: str | None = typed(text)
    rate: int = typed(whole, required=True)
    frame_ms: float = typed(number, required=True)
    jitter_ms: float = typed(number, required=True)
    loss_pct: float | None = typed(number)  # None: a file from before line conditions (no loss)
    echo_db: float | None = typed(number)
    seed: int | None = typed(whole)
    echo_delay_ms: float | None = typed(number)
    lost_up_frames: int | None = typed(whole)
    lost_down_frames: int | None = typed(whole)
    conditions: str | None = typed(text)
    cap_s: float | None = typed(number)
    stream_sid: Any = typed(as_is)
    call_sid: Any = typed(as_is)

    @property
    def loss(self) -> float:
        """The share of frames lost both ways (0 in a file from before line conditions)."""
        return self.loss_pct if self.loss_pct is not None else 0.0

    @property
    def frame_samples(self) -> float:
        return self.rate * self.frame_ms / 1000.0


@dataclass(frozen=True, kw_only=True)
class Floor(Block):
    rule: str | None = typed(text)
    caller: int = typed(whole, required=True)
    heard: int = typed(whole, required=True)


@dataclass(frozen=True, kw_only=True)
class Settings(Block):
    turns: int = typed(whole, required=True)
    barge_in_turns: tuple[int, ...] = typed(tuple_of(whole), default=())
    barge_in_after_ms: float | None = typed(number)
    think_ms: float | None = typed(number)
    think_share: float | None = typed(number)
    reply_wait_s: float | None = typed(number)
    deadline_s: float | None = typed(number)
    lead_ms: float | None = typed(number)
    reply_end_ms: float | None = typed(number)
    silent_after_ms: float | None = typed(number)  # None: docs/line.md's 200 ms (a file from before it was stated)
    false_barge_in_rule: str | None = typed(text)
    cut_off_rule: str | None = typed(text)
    talked_over_rule: str | None = typed(text)
    late_tick_rule: str | None = typed(text)
    barge_silence_rule: str | None = typed(text)
    stt: str | None = typed(text)
    stt_engine: Any = typed(as_is)


@dataclass(frozen=True, kw_only=True)
class TurnCaller(Block):
    """A turn's caller line on the call clock: fed from ``offset_ms``, its true speech start..end."""

    offset_ms: float = typed(number, required=True)
    speech_start_ms: float = typed(number, required=True)
    speech_end_ms: float = typed(number, required=True)
    floor: int | None = typed(whole)  # the line's own floor; None: the caller channel's (floor.caller)
    source: Any = typed(as_is)
    converted_from: Any = typed(as_is)
    pauses_ms: tuple[tuple[float, float], ...] = typed(tuple_of(span), default=(), omit=True)


@dataclass(frozen=True, kw_only=True)
class Heard(Block):
    """The reply as the caller heard it; ``gap_ms`` None when none was heard, or talked over, or near a late tick
    (``unknown`` says which)."""

    first_sound_ms: float | None = typed(number)
    gap_ms: float | None = typed(number)
    talked_over: bool | None = typed(flag)  # None: a file from before it was told apart (not talked over)
    late_tick: bool | None = typed(flag)
    last_sound_ms: float | None = typed(number)
    transcript: str | None = typed(text)


@dataclass(frozen=True, kw_only=True)
class BargeIn(Block):
    onset_ms: float | None = typed(number)
    heard_silent_ms: float | None = typed(number)
    heard_after_onset_ms: float | None = typed(number)
    cleared_ms: float | None = typed(number)
    resumed_ms: tuple[tuple[float, float], ...] | None = typed(tuple_of(span))
    words_heard: str | None = typed(text)
    words_heard_count: int | None = typed(whole)


@dataclass(frozen=True, kw_only=True)
class AgentReported(Block):
    """The agent's own number for a turn (its spans: voice_llm.capabilities.dial.otlp.Reported)."""

    latency_ms: float | None = typed(number)
    source: str | None = typed(text)


@dataclass(frozen=True, kw_only=True)
class Wer(Block):
    errors: int | None = typed(whole)
    words: int | None = typed(whole)


@dataclass(frozen=True, kw_only=True)
class FalseBargeIn(Block):
    """Where the agent cut its own reply with the caller silent: by a ``clear`` at ``t_ms``, or ``stopped``
    (silent from ``silent_ms``, resumed at ``resumed_ms``)."""

    kind: str | None = typed(text)
    t_ms: float | None = typed(number)
    silent_ms: float | None = typed(number)
    resumed_ms: float | None = typed(number)
    dropped_ms: float | None = typed(number)


@dataclass(frozen=True, kw_only=True)
class CutOff(Block):
    t_ms: float | None = typed(number)
    caller_speech_left_ms: float | None = typed(number)


@dataclass(frozen=True, kw_only=True)
class Turn(Block):
    """One caller line and what was heard after it."""

    index: int = typed(whole, required=True)
    script: str | None = typed(text)
    caller_wav: str | None = typed(text)
    caller: TurnCaller = typed(block(TurnCaller), required=True)
    heard: Heard | None = typed(block(Heard))
    barge_in: BargeIn | None = typed(block(BargeIn))
    agent_reported: AgentReported | None = typed(block(AgentReported))
    heard_minus_reported_ms: float | None = typed(number)
    agent_breakdown: Mapping[str, float | None] | None = typed(numbers)
    wer: Wer | None = typed(block(Wer))
    false_barge_in_at: FalseBargeIn | None = typed(block(FalseBargeIn))
    false_barge_in: bool | None = typed(flag)  # None: a file from before false barge-ins were counted
    cut_off_at: CutOff | None = typed(block(CutOff))
    cut_off: bool | None = typed(flag)  # None: the heard channel cannot show it (unknown says why), or not counted
    agent_stages: Any = typed(as_is, omit=True)
    agent_preemptive: Any = typed(as_is, omit=True)
    agent_transcript: str | None = typed(text, omit=True)

    @property
    def where(self) -> str:
        """How a check names the turn: ``turn 3``."""
        return f"turn {self.index}"

    @property
    def gap_ms(self) -> float | None:
        """The heard gap, or None (nothing heard, talked over, near a late tick)."""
        return self.heard.gap_ms if self.heard is not None else None

    @property
    def reported_ms(self) -> float | None:
        """The agent's own latency for the turn, or None (not reported)."""
        return self.agent_reported.latency_ms if self.agent_reported is not None else None


@dataclass(frozen=True, kw_only=True)
class Playout(Block):
    frames: int = typed(whole, required=True)
    late_frames: int = typed(whole, required=True)
    underruns: int | None = typed(whole)
    marks_returned: int | None = typed(whole)
    clears: int | None = typed(whole)
    max_buffered_ms: float | None = typed(number)
    dropped_ms: float | None = typed(number)
    lost_ms: float | None = typed(number)
    max_late_ms: float | None = typed(number)


@dataclass(frozen=True, kw_only=True)
class DialerCost(Block):
    median: float | None = typed(number)
    p90: float | None = typed(number)
    max: float | None = typed(number)
    frames: int | None = typed(whole)
    what: str | None = typed(text)


@dataclass(frozen=True, kw_only=True)
class Spread(Block):
    """A summary of one number over the turns: median, p90 and count (heard_gap_ms also counts the turns it left
    out: talked over, near a late tick)."""

    median: float | None = typed(number)
    p90: float | None = typed(number)
    n: int | None = typed(whole)
    talked_over: int | None = typed(whole)
    late_tick: int | None = typed(whole)

    def numbers(self) -> dict[str, float | int | None]:
        """The block's numbers by their keys (check_summary compares them with the turns')."""
        return {"median": self.median, "p90": self.p90, "n": self.n, "talked_over": self.talked_over,
                "late_tick": self.late_tick}


@dataclass(frozen=True, kw_only=True)
class Summary(Block):
    heard_gap_ms: Spread | None = typed(block(Spread))
    barge_in_heard_after_onset_ms: Spread | None = typed(block(Spread))
    heard_minus_reported_ms: Spread | None = typed(block(Spread))  # None: no turn's agent number reported
    false_barge_ins: int | None = typed(whole)
    cut_offs: int | None = typed(whole)  # None: no turn's heard channel can show one (unknown says why)


@dataclass(frozen=True, kw_only=True)
class Files(Block):
    """The files of dial/ the call wrote; another file a step adds (the converse step's agent_log) is in
    ``extra``."""

    call_wav: str | None = typed(text)
    events: str | None = typed(text)
    caller_wavs: tuple[str, ...] = typed(tuple_of(text), default=())
    otlp: tuple[str, ...] = typed(tuple_of(text), default=())

    def named(self) -> list[Any]:
        """Every path listed, the ``extra`` files too (a value that is not a path is kept for the check to refuse)."""
        found: list[Any] = [self.call_wav, self.events, *self.caller_wavs, *self.otlp]
        for value in self.extra.values():
            found.extend(value if isinstance(value, list) else [value])
        return [name for name in found if name is not None]


@dataclass(frozen=True, kw_only=True)
class Otlp(Block):
    """The agent's traces received during the call (voice_llm.capabilities.dial.otlp.summary); ``bodies``: those kept."""

    bodies: int | None = typed(whole)


@dataclass(frozen=True, kw_only=True)
class DialDoc(Document):
    """dial.json: one call as the caller heard it."""

    NAME: ClassVar[str] = DIAL
    SHAPE_KEY: ClassVar[str] = "dial_schema_version"
    SHAPE: ClassVar[int] = DIAL_SCHEMA_VERSION
    schema_version: Any = typed(as_is, omit=True)  # the run's stamp (the folder's rule reads it; null is refused)
    dial_schema_version: int | None = typed(whole)  # None: version 1, from before it was stated
    agent: Agent | None = typed(block(Agent))
    line: Line = typed(block(Line), required=True)
    clock: str | None = typed(text)
    t0_epoch_ns: int = typed(whole, required=True)
    floor: Floor = typed(block(Floor), required=True)
    caller: Any = typed(as_is)
    settings: Settings = typed(block(Settings), required=True)
    turns: tuple[Turn, ...] = typed(tuple_of(block(Turn)), required=True)
    playout: Playout = typed(block(Playout), required=True)
    dialer_cost_ms: DialerCost | None = typed(block(DialerCost))
    summary: Summary | None = typed(block(Summary))
    files: Files = typed(block(Files), required=True)
    otlp: Otlp | None = typed(block(Otlp))
    unknown: Mapping[str, str] = typed(reasons, default=None)
    load_average: Any = typed(as_is, omit=True)
    error: str | None = typed(text, omit=True)  # a call that failed (dial-partial.json): why

    def __post_init__(self) -> None:
        if self.unknown is None:  # an absent (or null) unknown is no reason for anything
            object.__setattr__(self, "unknown", {})

    @property
    def version(self) -> int:
        return self.dial_schema_version if self.dial_schema_version is not None else 1

    def reason(self, key: str) -> str | None:
        """Why ``key`` (``turns[2].heard.gap_ms``, ``agent_reported``) is null, as ``unknown`` says; None: no reason."""
        return self.unknown.get(key)

    def heard_gaps(self) -> list[float]:
        """Every heard turn's gap, in turn order (what the summary and compare's samples are made of)."""
        return [turn.gap_ms for turn in self.turns if turn.gap_ms is not None]

    def barge_ins(self) -> list[tuple[int, Turn, BargeIn]]:
        """(position, turn, its barge-in) of each turn barged in on."""
        return [(position, turn, turn.barge_in) for position, turn in enumerate(self.turns)
                if turn.barge_in is not None]


@dataclass(frozen=True, kw_only=True)
class DialPartialDoc(DialDoc):
    """dial-partial.json: a call that failed, as far as it went (``error`` says why; its own files)."""

    NAME: ClassVar[str] = DIAL_PARTIAL

