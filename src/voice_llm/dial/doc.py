"""dial.json (and dial-partial.json) as one value: the file's shape typed once, read by one ``parse``, written from
the same type.

dial.json was a dict: dial/checks.py read it with a hundred ``.get("...")`` calls, the report, the key numbers
and load's dialing read it raw again, and the tests' folder builder wrote a dial.json of its own idea, sharing no
type with the dialer's writer. Here every block of the file is a frozen dataclass (:class:`DialDoc` down to a
turn's :class:`Heard`), read as :mod:`voice_llm.run.artifacts` reads the core's files: the type of each field the
code reads (a finite number, a whole number, true or false, a string, a list, an object), one
:class:`~voice_llm.errors.ArtifactError` line naming the file and the field when it is not (``dial.json:
turns[2].heard.gap_ms is 'x', not a finite number``), the run's ``schema_version`` by the folder's rule and
``dial_schema_version`` refused when newer than this voice-llm's. :meth:`voice_llm.run.folder.RunFolder.artifact`
parses it once per folder.

What the types do not hold is the relations between fields (a gap is first sound minus speech end, the summary is
its turns'): those are the checks', which FAIL when they break. A field a dial.json of an older version lacks is
None (or empty) here, and the check that needs it says so. Keys not typed here (a block another capability adds:
a WebRTC line's, the agent's OTLP summary) are kept in each block's ``extra`` and written back after the typed
keys, so that parse then :meth:`Block.as_dict` gives the document back, key for key, value for value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from voice_llm.errors import ArtifactError
from voice_llm.run.artifacts import Artifact, field_error, field_path, is_finite_number
from voice_llm.util.artifacts import DIAL, DIAL_PARTIAL

__all__ = ["Agent", "AgentReported", "BargeIn", "Block", "CutOff", "DIAL_SCHEMA_VERSION", "DialDoc", "DialPartialDoc",
           "DialerCost", "FalseBargeIn", "Files", "Floor", "Heard", "Line", "Otlp", "Playout", "Settings", "Spread",
           "Summary", "Turn", "TurnCaller", "Wer"]

DIAL_SCHEMA_VERSION = 4  # dial.json's own shape (dial_schema_version; schema_version is the run's stamp)

B = TypeVar("B", bound="Block")
Reader = Callable[[Any, str, str], Any]  # (the JSON value, the file's name, the field's path) -> the typed value


# --- the readers of one value (each given a value that is there and not null) -----------------------------------

def _number(value: Any, what: str, where: str) -> float:
    if not is_finite_number(value):
        raise field_error(what, where, f"is {value!r:.80}, not a finite number")
    return value  # type: ignore[no-any-return]  # kept as written (1 stays 1): the file round-trips


def _whole(value: Any, what: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise field_error(what, where, f"is {value!r:.80}, not a whole number")
    return value


def _flag(value: Any, what: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise field_error(what, where, f"is {value!r:.80}, not true or false")
    return value


def _text(value: Any, what: str, where: str) -> str:
    if not isinstance(value, str):
        raise field_error(what, where, f"is {value!r:.80}, not a string")
    return value


def _any(value: Any, what: str, where: str) -> Any:
    return value


def _object(value: Any, what: str, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise field_error(what, where, f"is {value!r:.80}, not an object")
    return value


def _list(value: Any, what: str, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise field_error(what, where, f"is {value!r:.80}, not a list")
    return value


def _tuple_of(read: Reader) -> Reader:
    def reader(value: Any, what: str, where: str) -> tuple[Any, ...]:
        return tuple(read(item, what, field_path(where, i)) for i, item in enumerate(_list(value, what, where)))
    return reader


def _span(value: Any, what: str, where: str) -> tuple[float, float]:
    """[start_ms, end_ms]: a pause or a resumed stretch on the call clock."""
    pair = _list(value, what, where)
    if len(pair) != 2:
        raise field_error(what, where, f"is {value!r:.80}, not [start_ms, end_ms]")
    return _number(pair[0], what, field_path(where, 0)), _number(pair[1], what, field_path(where, 1))


def _reasons(value: Any, what: str, where: str) -> Mapping[str, str]:
    """``unknown``: why a number is null, a sentence per field."""
    body = _object(value, what, where)
    for key, reason in body.items():
        _text(reason, what, field_path(where, key))
    return dict(body)


def _numbers(value: Any, what: str, where: str) -> Mapping[str, float | None]:
    """An object of numbers or nulls (a turn's agent_breakdown)."""
    body = _object(value, what, where)
    for key, number in body.items():
        if number is not None:
            _number(number, what, field_path(where, key))
    return dict(body)


def _block(kind: type[B]) -> Reader:
    def reader(value: Any, what: str, where: str) -> B:
        return kind.read(_object(value, what, where), what, where)
    return reader


# --- a field's declaration ---------------------------------------------------------------------------------------

def _field(read: Reader, *, key: str | None = None, required: bool = False, default: Any = None,
           omit: bool = False) -> Any:
    """A typed key of a block. ``required``: a file without it (or with null there) is refused; else an absent key
    is ``default`` and is left out again when written. ``omit``: a value None (or empty) that a writer built is
    left out of the file (a key the dialer writes only when it has one: a turn's pauses)."""
    meta = {"read": read, "key": key, "required": required, "omit": omit}
    if required:
        return field(metadata=meta)
    if isinstance(default, (list, dict)):
        raise TypeError("a mutable default")
    return field(default=default, metadata=meta)


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, (tuple, Mapping)) and not value)


def _write(value: Any) -> Any:
    if isinstance(value, Block):
        return value.as_dict()
    if isinstance(value, tuple):
        return [_write(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _write(item) for key, item in value.items()}
    return value


@dataclass(frozen=True, kw_only=True)
class Block:
    """One object of the file: its typed keys as fields, the rest in ``extra`` (kept, written back after them);
    ``absent`` the typed keys the file did not have (left out again when written, unless given a value since)."""

    extra: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    absent: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    @classmethod
    def _typed(cls) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
        """(field name, key in the file, its declaration) of each typed key, in the file's order."""
        for spec in fields(cls):
            if "read" in spec.metadata:
                yield spec.name, spec.metadata["key"] or spec.name, spec.metadata

    @classmethod
    def read(cls: type[B], body: Mapping[str, Any], what: str, where: str = "") -> B:
        """``body`` (an object of the file at ``where``) as this block; an ArtifactError naming the field."""
        values: dict[str, Any] = {}
        absent = set()
        known = set()
        for name, key, meta in cls._typed():
            known.add(key)
            at = field_path(where, key)
            if key not in body:
                if meta["required"]:
                    raise ArtifactError(f"{what} has no field {at!r}")
                absent.add(key)
                continue
            value = body[key]
            if value is None:
                if meta["required"]:
                    raise field_error(what, at, "is null")
                values[name] = None
                continue
            values[name] = meta["read"](value, what, at)
        extra = {key: value for key, value in body.items() if key not in known}
        return cls(**values, extra=extra, absent=frozenset(absent))

    def as_dict(self) -> dict[str, Any]:
        """The block as the file holds it: the typed keys in order, then ``extra``."""
        found: dict[str, Any] = {}
        for name, key, meta in self._typed():
            value = getattr(self, name)
            if (key in self.absent or meta["omit"]) and _empty(value):
                continue  # absent from the file read (and not set since), or a key written only when it has a value
            found[key] = _write(value)
        found.update(self.extra)
        return found


# --- the blocks of dial.json ---------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Agent(Block):
    url: str | None = _field(_text)
    protocol: str | None = _field(_text)
    headers: Any = _field(_any)
    identity: Any = _field(_any)  # what the agent said of itself (its ready line), or None


@dataclass(frozen=True, kw_only=True)
class Line(Block):
    """The line as dialed: its format and the phone's side of it (jitter, loss, echo). Other keys (a WebRTC
    line's block) are kept in ``extra``."""

    protocol: str = _field(_text, required=True)
    codec: str | None = _field(_text)
    rate: int = _field(_whole, required=True)
    frame_ms: float = _field(_number, required=True)
    jitter_ms: float = _field(_number, required=True)
    loss_pct: float | None = _field(_number)  # None: a file from before line conditions (no loss)
    echo_db: float | None = _field(_number)
    seed: int | None = _field(_whole)
    echo_delay_ms: float | None = _field(_number)
    lost_up_frames: int | None = _field(_whole)
    lost_down_frames: int | None = _field(_whole)
    conditions: str | None = _field(_text)
    cap_s: float | None = _field(_number)
    stream_sid: Any = _field(_any)
    call_sid: Any = _field(_any)

    @property
    def loss(self) -> float:
        """The share of frames lost both ways (0 in a file from before line conditions)."""
        return self.loss_pct if self.loss_pct is not None else 0.0

    @property
    def frame_samples(self) -> float:
        return self.rate * self.frame_ms / 1000.0


@dataclass(frozen=True, kw_only=True)
class Floor(Block):
    rule: str | None = _field(_text)
    caller: int = _field(_whole, required=True)
    heard: int = _field(_whole, required=True)


@dataclass(frozen=True, kw_only=True)
class Settings(Block):
    turns: int = _field(_whole, required=True)
    barge_in_turns: tuple[int, ...] = _field(_tuple_of(_whole), default=())
    barge_in_after_ms: float | None = _field(_number)
    think_ms: float | None = _field(_number)
    think_share: float | None = _field(_number)
    reply_wait_s: float | None = _field(_number)
    deadline_s: float | None = _field(_number)
    lead_ms: float | None = _field(_number)
    reply_end_ms: float | None = _field(_number)
    silent_after_ms: float | None = _field(_number)  # None: docs/line.md's 200 ms (a file from before it was stated)
    false_barge_in_rule: str | None = _field(_text)
    cut_off_rule: str | None = _field(_text)
    talked_over_rule: str | None = _field(_text)
    late_tick_rule: str | None = _field(_text)
    barge_silence_rule: str | None = _field(_text)
    stt: str | None = _field(_text)
    stt_engine: Any = _field(_any)


@dataclass(frozen=True, kw_only=True)
class TurnCaller(Block):
    """A turn's caller line on the call clock: fed from ``offset_ms``, its true speech start..end."""

    offset_ms: float = _field(_number, required=True)
    speech_start_ms: float = _field(_number, required=True)
    speech_end_ms: float = _field(_number, required=True)
    floor: int | None = _field(_whole)  # the line's own floor; None: the caller channel's (floor.caller)
    source: Any = _field(_any)
    converted_from: Any = _field(_any)
    pauses_ms: tuple[tuple[float, float], ...] = _field(_tuple_of(_span), default=(), omit=True)


@dataclass(frozen=True, kw_only=True)
class Heard(Block):
    """The reply as the caller heard it; ``gap_ms`` None when none was heard, or talked over, or near a late tick
    (``unknown`` says which)."""

    first_sound_ms: float | None = _field(_number)
    gap_ms: float | None = _field(_number)
    talked_over: bool | None = _field(_flag)  # None: a file from before it was told apart (not talked over)
    late_tick: bool | None = _field(_flag)
    last_sound_ms: float | None = _field(_number)
    transcript: str | None = _field(_text)


@dataclass(frozen=True, kw_only=True)
class BargeIn(Block):
    onset_ms: float | None = _field(_number)
    heard_silent_ms: float | None = _field(_number)
    heard_after_onset_ms: float | None = _field(_number)
    cleared_ms: float | None = _field(_number)
    resumed_ms: tuple[tuple[float, float], ...] | None = _field(_tuple_of(_span))
    words_heard: str | None = _field(_text)
    words_heard_count: int | None = _field(_whole)


@dataclass(frozen=True, kw_only=True)
class AgentReported(Block):
    """The agent's own number for a turn (its spans: voice_llm.dial.otlp.Reported)."""

    latency_ms: float | None = _field(_number)
    source: str | None = _field(_text)


@dataclass(frozen=True, kw_only=True)
class Wer(Block):
    errors: int | None = _field(_whole)
    words: int | None = _field(_whole)


@dataclass(frozen=True, kw_only=True)
class FalseBargeIn(Block):
    """Where the agent cut its own reply with the caller silent: by a ``clear`` at ``t_ms``, or ``stopped``
    (silent from ``silent_ms``, resumed at ``resumed_ms``)."""

    kind: str | None = _field(_text)
    t_ms: float | None = _field(_number)
    silent_ms: float | None = _field(_number)
    resumed_ms: float | None = _field(_number)
    dropped_ms: float | None = _field(_number)


@dataclass(frozen=True, kw_only=True)
class CutOff(Block):
    t_ms: float | None = _field(_number)
    caller_speech_left_ms: float | None = _field(_number)


@dataclass(frozen=True, kw_only=True)
class Turn(Block):
    """One caller line and what was heard after it."""

    index: int = _field(_whole, required=True)
    script: str | None = _field(_text)
    caller_wav: str | None = _field(_text)
    caller: TurnCaller = _field(_block(TurnCaller), required=True)
    heard: Heard | None = _field(_block(Heard))
    barge_in: BargeIn | None = _field(_block(BargeIn))
    agent_reported: AgentReported | None = _field(_block(AgentReported))
    heard_minus_reported_ms: float | None = _field(_number)
    agent_breakdown: Mapping[str, float | None] | None = _field(_numbers)
    wer: Wer | None = _field(_block(Wer))
    false_barge_in_at: FalseBargeIn | None = _field(_block(FalseBargeIn))
    false_barge_in: bool | None = _field(_flag)  # None: a file from before false barge-ins were counted
    cut_off_at: CutOff | None = _field(_block(CutOff))
    cut_off: bool | None = _field(_flag)  # None: the heard channel cannot show it (unknown says why), or not counted
    agent_stages: Any = _field(_any, omit=True)
    agent_preemptive: Any = _field(_any, omit=True)
    agent_transcript: str | None = _field(_text, omit=True)

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
    frames: int = _field(_whole, required=True)
    late_frames: int = _field(_whole, required=True)
    underruns: int | None = _field(_whole)
    marks_returned: int | None = _field(_whole)
    clears: int | None = _field(_whole)
    max_buffered_ms: float | None = _field(_number)
    dropped_ms: float | None = _field(_number)
    lost_ms: float | None = _field(_number)
    max_late_ms: float | None = _field(_number)


@dataclass(frozen=True, kw_only=True)
class DialerCost(Block):
    median: float | None = _field(_number)
    p90: float | None = _field(_number)
    max: float | None = _field(_number)
    frames: int | None = _field(_whole)
    what: str | None = _field(_text)


@dataclass(frozen=True, kw_only=True)
class Spread(Block):
    """A summary of one number over the turns: median, p90 and count (heard_gap_ms also counts the turns it left
    out: talked over, near a late tick)."""

    median: float | None = _field(_number)
    p90: float | None = _field(_number)
    n: int | None = _field(_whole)
    talked_over: int | None = _field(_whole)
    late_tick: int | None = _field(_whole)

    def numbers(self) -> dict[str, float | int | None]:
        """The block's numbers by their keys (check_summary compares them with the turns')."""
        return {"median": self.median, "p90": self.p90, "n": self.n, "talked_over": self.talked_over,
                "late_tick": self.late_tick}


@dataclass(frozen=True, kw_only=True)
class Summary(Block):
    heard_gap_ms: Spread | None = _field(_block(Spread))
    barge_in_heard_after_onset_ms: Spread | None = _field(_block(Spread))
    heard_minus_reported_ms: Spread | None = _field(_block(Spread))  # None: no turn's agent number reported
    false_barge_ins: int | None = _field(_whole)
    cut_offs: int | None = _field(_whole)  # None: no turn's heard channel can show one (unknown says why)


@dataclass(frozen=True, kw_only=True)
class Files(Block):
    """The files of dial/ the call wrote; another file a step adds (the converse step's agent_log) is in
    ``extra``."""

    call_wav: str | None = _field(_text)
    events: str | None = _field(_text)
    caller_wavs: tuple[str, ...] = _field(_tuple_of(_text), default=())
    otlp: tuple[str, ...] = _field(_tuple_of(_text), default=())

    def named(self) -> list[Any]:
        """Every path listed, the ``extra`` files too (a value that is not a path is kept for the check to refuse)."""
        found: list[Any] = [self.call_wav, self.events, *self.caller_wavs, *self.otlp]
        for value in self.extra.values():
            found.extend(value if isinstance(value, list) else [value])
        return [name for name in found if name is not None]


@dataclass(frozen=True, kw_only=True)
class Otlp(Block):
    """The agent's traces received during the call (voice_llm.dial.otlp.summary); ``bodies``: those kept."""

    bodies: int | None = _field(_whole)


@dataclass(frozen=True, kw_only=True)
class DialDoc(Artifact, Block):
    """dial.json: one call as the caller heard it."""

    NAME: ClassVar[str] = DIAL
    doc: Any = field(default=None, repr=False, compare=False)
    schema_version: Any = _field(_any)  # the run's stamp (the folder's rule reads it)
    dial_schema_version: int | None = _field(_whole)  # None: version 1, from before it was stated
    agent: Agent | None = _field(_block(Agent))
    line: Line = _field(_block(Line), required=True)
    clock: str | None = _field(_text)
    t0_epoch_ns: int = _field(_whole, required=True)
    floor: Floor = _field(_block(Floor), required=True)
    caller: Any = _field(_any)
    settings: Settings = _field(_block(Settings), required=True)
    turns: tuple[Turn, ...] = _field(_tuple_of(_block(Turn)), required=True)
    playout: Playout = _field(_block(Playout), required=True)
    dialer_cost_ms: DialerCost | None = _field(_block(DialerCost))
    summary: Summary | None = _field(_block(Summary))
    files: Files = _field(_block(Files), required=True)
    otlp: Otlp | None = _field(_block(Otlp))
    unknown: Mapping[str, str] = _field(_reasons, default=None)
    load_average: Any = _field(_any, omit=True)
    error: str | None = _field(_text, omit=True)  # a call that failed (dial-partial.json): why

    def __post_init__(self) -> None:
        if self.unknown is None:  # an absent (or null) unknown is no reason for anything
            object.__setattr__(self, "unknown", {})

    @classmethod
    def _parse(cls, doc: Any, what: str) -> DialDoc:
        if not isinstance(doc, Mapping):
            raise ArtifactError(f"{what} is not an object: {doc!r:.80}")
        version = doc.get("dial_schema_version")
        if isinstance(version, (int, float)) and not isinstance(version, bool) and version > DIAL_SCHEMA_VERSION:
            raise ArtifactError(f"{what} was written by a newer voice-llm (dial schema {version}; this one reads up "
                                f"to {DIAL_SCHEMA_VERSION}): upgrade voice-llm to check or draw it")
        found = cls.read(doc, what)
        object.__setattr__(found, "doc", doc)
        return found

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

