"""The core's artifacts as values: one frozen dataclass per file, each with the one ``parse`` that validates it.

The same JSON shapes were validated three ways (the checks, the report's charts, the metrics), each with its own
idea of a missing field or a string where a number belongs. Here each file's shape is checked once: the types of
the fields the core reads, a finite number wherever a number must be (JSON has no NaN, but Python's parser
accepts ``NaN`` and ``Infinity``; :func:`voice_llm.core.util.artifacts.loads_json` refuses them, and ``parse`` refuses
them too for a document handed to it directly), and the schema version by the folder's rule
(:func:`voice_llm.core.run.folder.refuse_unknown`). A shape it does not accept is one
:class:`~voice_llm.core.errors.ArtifactError` line naming the file and the field (``ttft.json: runs[2].ttft_ms is
'x', not a finite number``), which a check turns into its FAIL line and the report into "could not be drawn".

What the values do not hold is the relations between fields (first token below total, the medians of the runs):
those are the checks', which FAIL with the brief's words when they break. A number a step may leave null states
why in the file's ``unknown`` (``unknown`` below): it is ``None`` here and the check says "not checkable" with that
reason. Every value keeps its raw document as ``.doc`` for a field not typed here (a capability's, the server's
own /props). :meth:`voice_llm.core.run.folder.RunFolder.artifact` parses each file once per folder.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from voice_llm.core.errors import ArtifactError, NoDataError
from voice_llm.core.run import meta as runmeta
from voice_llm.core.run.folder import refuse_unknown
from voice_llm.core.util import artifacts as names

__all__ = ["Artifact", "Cache", "CacheCase", "Cancel", "Chunk", "Health", "Prefill", "PrefillRow", "Props",
           "Report", "Sentence", "TYPED", "Ttft", "TtftRun", "field_error", "field_path", "is_finite_number"]

A = TypeVar("A", bound="Artifact")


# --- the one set of field rules ------------------------------------------------------------------------------------

def _fail(what: str, where: str, message: str) -> ArtifactError:
    return ArtifactError(f"{what}: {where} {message}" if where else f"{what}: {message}")


def _obj(value: Any, what: str, where: str = "") -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        if not where:
            raise ArtifactError(f"{what} is not an object: {value!r:.80}")
        raise _fail(what, where, f"is {value!r:.80}, not an object")
    return value


def _get(doc: Mapping[str, Any], key: str, what: str, where: str) -> Any:
    if key not in doc:
        raise ArtifactError(f"{what} has no field {_at(where, key)!r}")
    return doc[key]


def _at(where: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _no_data(what: str, where: str, key: str, said: str) -> NoDataError:
    return NoDataError(f"{what} {where}: {key!r} {said}" if where else f"{what}: {key!r} {said}")


def _number(doc: Mapping[str, Any], key: str, what: str, where: str = "", *, nullable: bool = False) -> float | None:
    """A finite number at ``key`` (None too when ``nullable``: a step that could not measure it leaves it null and
    says why in ``unknown``). A null, NaN or infinity where a number must be is no measurement (NoDataError: the
    step saved none); any other value is malformed."""
    value = _get(doc, key, what, where)
    if value is None and nullable:
        return None
    if value is None:
        raise _no_data(what, where, key, "is null")
    if isinstance(value, float) and not math.isfinite(value):  # Python's parser reads NaN and Infinity
        raise _no_data(what, where, key, f"is {value!r}, not a measurement")
    if not _is_number(value):
        raise _fail(what, _at(where, key), f"is {value!r:.80}, not a finite number")
    return float(value)


def _required(doc: Mapping[str, Any], key: str, what: str, where: str = "") -> float:
    found = _number(doc, key, what, where)
    assert found is not None  # not nullable
    return found


def _optional(doc: Mapping[str, Any], key: str, what: str, where: str = "") -> float | None:
    """A number that may be absent (a field added by a later version, or an optional measurement) or null."""
    return _number(doc, key, what, where, nullable=True) if key in doc else None


def _int(doc: Mapping[str, Any], key: str, what: str, where: str = "") -> int:
    value = _get(doc, key, what, where)
    if value is None:
        raise _no_data(what, where, key, "is null")
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(what, _at(where, key), f"is {value!r:.80}, not a whole number")
    return value


def _str(doc: Mapping[str, Any], key: str, what: str, where: str = "", *, optional: bool = False) -> str | None:
    if optional and doc.get(key) is None:
        return None
    value = _get(doc, key, what, where)
    if not isinstance(value, str):
        raise _fail(what, _at(where, key), f"is {value!r:.80}, not a string")
    return value


def _list(doc: Mapping[str, Any], key: str, what: str, where: str = "") -> Sequence[Any]:
    value = _get(doc, key, what, where)
    if not isinstance(value, list):
        raise _fail(what, _at(where, key), f"is {value!r:.80}, not a list")
    return value


def _unknown(doc: Mapping[str, Any], what: str) -> Mapping[str, str]:
    """``unknown``: why the step left a number null (any JSON value is said as text)."""
    found = doc.get("unknown")
    if found is None:
        return {}
    return {str(k): str(v) for k, v in _obj(found, what, "unknown").items()}


# The same rules' words for a capability's own typed artifact (voice_llm.capabilities.dial.doc): one way to name a field and
# to say that its value is wrong.
field_error = _fail
field_path = _at
is_finite_number = _is_number


# --- the artifacts -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Artifact:
    """A parsed artifact: ``doc`` is the document as saved (for fields not typed here)."""

    NAME: ClassVar[str] = ""
    doc: Any = field(repr=False, compare=False)

    @classmethod
    def parse(cls: type[A], doc: Any, what: str | None = None) -> A:
        """``doc`` (a parsed JSON document) as this artifact, validated once; ``what`` names it in the error
        (the file name by default). Raises ArtifactError in one line naming the file and the field."""
        what = what or cls.NAME
        refuse_unknown(what, doc)
        try:
            return cls._parse(doc, what)
        except RecursionError as exc:
            raise ArtifactError(f"{what} is nested too deeply to be real JSON") from exc

    @classmethod
    def _parse(cls: type[A], doc: Any, what: str) -> A:
        raise NotImplementedError


@dataclass(frozen=True)
class Health(Artifact):
    """health.json: what the server's health route (or, without one, its model list) answered. ``route`` is None
    in a folder from before health.json recorded what was seen (then ``status`` is /health's body alone)."""

    NAME: ClassVar[str] = names.HEALTH
    route: str | None = None
    http_status: int | None = None
    status: Any = None  # what the body said (a string from llama-server; a check compares it with "ok")
    model_ids: tuple[Any, ...] | None = None

    @classmethod
    def _parse(cls, doc: Any, what: str) -> Health:
        body = _obj(doc, what)
        route = _str(body, "route", what, optional=True)
        code = body.get("http_status")
        if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
            raise _fail(what, "http_status", f"is {code!r:.80}, not an HTTP status")
        ids = body.get("model_ids")
        if ids is not None and not isinstance(ids, list):
            raise _fail(what, "model_ids", f"is {ids!r:.80}, not a list")
        return cls(doc, route, code, body.get("status"), None if ids is None else tuple(ids))


@dataclass(frozen=True)
class Props(Artifact):
    """props.json: the server's /props. ``n_ctx`` is None when the server has no such route (``unknown`` says
    why) or does not state it."""

    NAME: ClassVar[str] = names.PROPS
    n_ctx: Any = None  # as the server said it (a check holds it to a positive whole number)
    total_slots: Any = None
    unknown: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def _parse(cls, doc: Any, what: str) -> Props:
        body = _obj(doc, what)
        settings = body.get("default_generation_settings")
        settings = {} if settings is None else _obj(settings, what, "default_generation_settings")
        return cls(doc, settings.get("n_ctx"), body.get("total_slots"), _unknown(body, what))


@dataclass(frozen=True)
class TtftRun:
    ttft_ms: float
    total_ms: float
    tokens: int | None  # None: not recorded (check requires it; the chart leaves it out)


@dataclass(frozen=True)
class Ttft(Artifact):
    """ttft.json: the five answers and the medians the step states."""

    NAME: ClassVar[str] = names.TTFT
    runs: tuple[TtftRun, ...] = ()
    ttft_p50: float = 0.0
    total_p50: float = 0.0

    @classmethod
    def _parse(cls, doc: Any, what: str) -> Ttft:
        body = _obj(doc, what)
        runs = []
        listed = _list(body, "runs", what)
        if not listed:
            raise NoDataError(f"{what} runs is an empty list: the step saved no measurement")
        for i, run in enumerate(listed):
            where = f"runs[{i}]"
            run = _obj(run, what, where)
            tokens = _int(run, "tokens", what, where) if run.get("tokens") is not None else None
            runs.append(TtftRun(_required(run, "ttft_ms", what, where), _required(run, "total_ms", what, where),
                                tokens))
        return cls(doc, tuple(runs), _required(body, "ttft_p50", what), _required(body, "total_p50", what))


def _repeat_values(row: Mapping[str, Any], key: str, what: str, where: str) -> tuple[float | None, ...]:
    """The values of ``key`` over a step's ``repeats`` (none when the file has no repeats). A repeat may leave a
    value null (the server's slot not seen in one repeat): None here, and a spread over the repeats is then not
    known; the median the file states is still read."""
    repeats = row.get("repeats")
    if repeats is None:
        return ()
    if not isinstance(repeats, list):
        raise _fail(what, _at(where, "repeats"), f"is {repeats!r:.80}, not a list")
    return tuple(_number(_obj(r, what, f"{_at(where, 'repeats')}[{i}]"), key, what, f"{_at(where, 'repeats')}[{i}]",
                         nullable=True) for i, r in enumerate(repeats))


@dataclass(frozen=True)
class PrefillRow:
    docs: int
    ttft_ms: float | None
    prompt_ms: float | None
    prompt_n: float | None
    unknown: Mapping[str, str]
    ttft_repeats: tuple[float | None, ...] = ()
    prompt_ms_repeats: tuple[float | None, ...] = ()
    prompt_n_repeats: tuple[float | None, ...] = ()
    doc: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def value(self, key: str) -> float | None:
        """The brief's field ``key`` (ttft_ms, prompt_ms, prompt_n)."""
        return {"ttft_ms": self.ttft_ms, "prompt_ms": self.prompt_ms, "prompt_n": self.prompt_n}[key]

    def samples(self, key: str) -> tuple[float | None, ...]:
        """The repeats' values of ``key``, or the field alone (a file from before repeats)."""
        found = {"ttft_ms": self.ttft_repeats, "prompt_ms": self.prompt_ms_repeats,
                 "prompt_n": self.prompt_n_repeats}[key]
        value = self.value(key)
        return found or (() if value is None else (value,))


@dataclass(frozen=True)
class Prefill(Artifact):
    """prefill.json: one row per document count, in the order measured. A number the server did not report
    (prompt_ms, prompt_n without timings) is None, with the reason in the row's ``unknown``."""

    NAME: ClassVar[str] = names.PREFILL
    rows: tuple[PrefillRow, ...] = ()

    @classmethod
    def _parse(cls, doc: Any, what: str) -> Prefill:
        if not isinstance(doc, list):
            raise ArtifactError(f"{what} is not a list of rows: {doc!r:.80}")
        if not doc:
            raise NoDataError(f"{what} is an empty list: the step saved no measurement")
        rows = []
        for i, row in enumerate(doc):
            where = f"[{i}]"
            row = _obj(row, what, where)
            values = {key: _number(row, key, what, where, nullable=True) for key in ("ttft_ms", "prompt_ms", "prompt_n")}
            repeats = {key: _repeat_values(row, key, what, where) if values[key] is not None else ()
                       for key in values}
            rows.append(PrefillRow(_int(row, "docs", what, where), values["ttft_ms"], values["prompt_ms"],
                                   values["prompt_n"], _unknown(row, what), repeats["ttft_ms"], repeats["prompt_ms"],
                                   repeats["prompt_n"], row))
        return cls(doc, tuple(rows))

    def row(self, docs: int) -> PrefillRow | None:
        return next((row for row in self.rows if row.docs == docs), None)


@dataclass(frozen=True)
class CacheCase:
    ttft_ms: float
    prompt_n: float | None  # None: the server reported no token counts (``unknown.prompt_n`` says why)
    cache_n: float | None = None  # the tokens reused from the cache, when the server says
    doc: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)


CACHE_CASES = ("first", "second", "changed_suffix", "changed_prefix")


@dataclass(frozen=True)
class Cache(Artifact):
    """cache.json: the miss (``first``), the hit (``second``), and when measured the changed suffix and prefix;
    ``repeats`` each case's first-token times over the step's repeats."""

    NAME: ClassVar[str] = names.CACHE
    first: CacheCase | None = None
    second: CacheCase | None = None
    changed_suffix: CacheCase | None = None
    changed_prefix: CacheCase | None = None
    unknown: Mapping[str, str] = field(default_factory=dict)
    repeats: Mapping[str, tuple[float | None, ...]] = field(default_factory=dict)

    @classmethod
    def _parse(cls, doc: Any, what: str) -> Cache:
        body = _obj(doc, what)
        cases: dict[str, CacheCase | None] = {}
        for case in CACHE_CASES:
            if case not in body and case.startswith("changed_"):
                cases[case] = None
                continue
            found = _obj(_get(body, case, what, ""), what, case)
            cases[case] = CacheCase(_required(found, "ttft_ms", what, case), _optional(found, "prompt_n", what, case),
                                    _optional(found, "cache_n", what, case), found)
        repeats: dict[str, tuple[float | None, ...]] = {}
        listed = body.get("repeats")
        if listed is not None:
            if not isinstance(listed, list):
                raise _fail(what, "repeats", f"is {listed!r:.80}, not a list")
            for case in CACHE_CASES:
                if cases[case] is None:
                    continue
                repeats[case] = tuple(
                    _number(_obj(_get(_obj(r, what, f"repeats[{i}]"), case, what, f"repeats[{i}]"), what,
                                 f"repeats[{i}].{case}"), "ttft_ms", what, f"repeats[{i}].{case}", nullable=True)
                    for i, r in enumerate(listed))
        return cls(doc, cases["first"], cases["second"], cases["changed_suffix"], cases["changed_prefix"],
                   _unknown(body, what), repeats)

    def case(self, name: str) -> CacheCase | None:
        return {"first": self.first, "second": self.second, "changed_suffix": self.changed_suffix,
                "changed_prefix": self.changed_prefix}[name]

    def samples(self, name: str) -> tuple[float | None, ...]:
        """The case's first-token times over the repeats, or its one value (a file from before repeats)."""
        case = self.case(name)
        return self.repeats.get(name) or (() if case is None else (case.ttft_ms,))


@dataclass(frozen=True)
class Chunk:
    t_ms: float
    text: str


def _chunks(body: Mapping[str, Any], what: str, where: str = "") -> tuple[Chunk, ...]:
    found = []
    for i, chunk in enumerate(_list(body, "chunks", what, where)):
        at = f"{_at(where, 'chunks')}[{i}]"
        chunk = _obj(chunk, what, at)
        text = _str(chunk, "text", what, at)
        assert text is not None
        found.append(Chunk(_required(chunk, "t_ms", what, at), text))
    return tuple(found)


@dataclass(frozen=True)
class Sentence(Artifact):
    """sentence.json: one answer's first token, first whole sentence and end, on one clock."""

    NAME: ClassVar[str] = names.SENTENCE
    ttft_ms: float = 0.0
    first_sentence_ms: float | None = None  # None: no whole sentence was found (check fails it; the chart says it)
    total_ms: float = 0.0
    first_sentence: str | None = None
    text: str | None = None
    smart_first_sentence_ms: float | None = None
    chunks: tuple[Chunk, ...] = ()
    repeats: Mapping[str, tuple[float | None, ...]] = field(default_factory=dict)

    @classmethod
    def _parse(cls, doc: Any, what: str) -> Sentence:
        body = _obj(doc, what)
        first = _str(body, "first_sentence", what, optional=True)
        text = _str(body, "text", what, optional=True)
        chunks = _chunks(body, what) if "chunks" in body else ()
        repeats = {key: _repeat_values(body, key, what, "") for key in ("first_sentence_ms", "total_ms")}
        return cls(doc, _required(body, "ttft_ms", what), _optional(body, "first_sentence_ms", what),
                   _required(body, "total_ms", what), first, text, _optional(body, "smart_first_sentence_ms", what),
                   chunks, repeats)

    def samples(self, key: str) -> tuple[float | None, ...]:
        value = {"first_sentence_ms": self.first_sentence_ms, "total_ms": self.total_ms}[key]
        return self.repeats.get(key) or (value,)


@dataclass(frozen=True)
class Cancel(Artifact):
    """cancel.json: the answer cut after 0.5 s (the client side) and when the server's slot went idle (its side;
    None when it could not be seen, ``unknown`` says why). ``closed_at_ms`` is None when the answer ended before the
    cut (nothing was cancelled; ``unknown`` says so)."""

    NAME: ClassVar[str] = names.CANCEL
    max_tokens: int = 0
    received_tokens: int = 0
    closed_at_ms: float | None = 0.0
    slot_idle_after_ms: float | None = None
    cancel_logged: bool | None = None
    raw: str | None = None
    chunks: tuple[Chunk, ...] | None = None  # None: the file lists none (check fails it; the chart draws no ticks)
    unknown: Mapping[str, str] = field(default_factory=dict)
    idle_repeats: tuple[float | None, ...] = ()

    @classmethod
    def _parse(cls, doc: Any, what: str) -> Cancel:
        body = _obj(doc, what)
        logged = body.get("cancel_logged")
        if logged not in (True, False, None) or isinstance(logged, (int, float)) and not isinstance(logged, bool):
            raise _fail(what, "cancel_logged", f"is {logged!r:.80}, not true, false or null")
        idle = _number(body, "slot_idle_after_ms", what, nullable=True)
        unknown = _unknown(body, what)
        # null only as the step writes it for an answer that ended before the cut: with its reason in ``unknown``
        closed = _number(body, "closed_at_ms", what, nullable=bool(unknown.get("closed_at_ms")))
        return cls(doc, _int(body, "max_tokens", what), _int(body, "received_tokens", what),
                   closed, idle, logged, _str(body, "raw", what, optional=True),
                   _chunks(body, what) if "chunks" in body else None, unknown,
                   _repeat_values(body, "slot_idle_after_ms", what, "") if idle is not None else ())

    def idle_samples(self) -> tuple[float | None, ...]:
        return self.idle_repeats or (() if self.slot_idle_after_ms is None else (self.slot_idle_after_ms,))


@dataclass(frozen=True)
class Report(Artifact):
    """report.json: the key numbers (a finite number or null each; ``unknown`` says why one is null) beside the
    run's id, schema version and noise assessment, which are not numbers of the run."""

    NAME: ClassVar[str] = names.REPORT
    NOT_NUMBERS: ClassVar[frozenset[str]] = frozenset({"run_id", runmeta.SCHEMA, "noise", "unknown"})
    numbers: Mapping[str, float | None] = field(default_factory=dict)
    unknown: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def _parse(cls, doc: Any, what: str) -> Report:
        body = _obj(doc, what)
        numbers: dict[str, float | None] = {}
        for key, value in body.items():
            if key in cls.NOT_NUMBERS:
                continue
            if value is not None and not _is_number(value):
                raise _fail(what, key, f"is {value!r:.80}, not a finite number or null")
            numbers[key] = None if value is None else value
        return cls(doc, numbers, _unknown(body, what))


# The file each typed artifact is read from: RunFolder.artifact and the readers that take a file name.
TYPED: Mapping[str, type[Artifact]] = {kind.NAME: kind for kind in (Health, Props, Ttft, Prefill, Cache, Sentence,
                                                                      Cancel, Report)}
