"""Checks of load.json against its raw samples, from the files alone (call.json's are voice_llm.capabilities.conversation.checks).

Each check takes the run folder (a RunFolder read once, or its path), returns the detail it verified or raises
voice_llm.core.checks.base's :class:`CheckFailed` with the numbers that broke the relation (or :class:`NotCheckable`). load.json is recomputed from load_samples.csv with the same
rules (voice_llm.capabilities.load.stats): nearest-rank percentiles are always one of the samples, and the CSV keeps every
float exactly, so they must agree exactly. Every relation here is an invariant: times of one turn on one clock,
files equal to what they were derived from, token counts, the brief's cache hit < no cache; a file that measured
nothing (no sweep, no step, no turn) or holds impossible numbers (negative, inf, NaN) fails, it is no evidence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from voice_llm.core.util.artifacts import LOAD, LOAD_SAMPLES
from voice_llm.core.checks.base import CheckFailed, NotCheckable, finite_number, require
from voice_llm.capabilities.load import stats
from voice_llm.capabilities.load.doc import LoadDoc, judged_on
from voice_llm.capabilities.load.samples import read_samples
from voice_llm.core.run.folder import RunFolder

WINDOW_SLACK_S = 2.0  # the phase message reaches a worker a little after the master's clock changed phase
_COMPARED = ("turns", "errors", "cancelled", "judged", "good", "goodput", "good_turns_per_s", "ttft_ms",
             "first_sentence_ms", "itl_ms", "itl_p99_max_ms", "workers")
# Keys added later (load_schema_version 2): compared where load.json has them (a file written before has not).
_COMPARED_LATER = ("error_reasons", "heard_gap_ms", "refused", "calls", "late_frames", "call_frames", "calls_behind",
                   "barge_ins", "agent_reported_ms")
# load_schema_version 3: the agent's stage times per step (dialing callers), compared in a file of that version on
_COMPARED_V3 = ("agent_stage_turns", "agent_stages_ms")
# load_schema_version 5: the turns heard but not timed (a dialer's late tick), every step's
_COMPARED_V5 = ("unjudged",)
FRAME_MS = 20.0  # dial's line frames: the heard gap is measured on the call clock to within one


__all__ = ["CheckFailed", "NotCheckable"]
_require = require
# The sample columns that are times or counts: each a finite number >= 0 where present ("start" is a clock
# reading, finite only).
_NON_NEGATIVE = ("ttft_ms", "first_sentence_ms", "e2e_ms", "itl_p50_ms", "itl_p99_ms", "prompt_ms", "tokens",
                 "prompt_n", "cache_n", "callers", "turn", "speech_end_ms", "first_sound_ms", "call_frames",
                 "late_frames", "barge_in_heard_after_onset_ms", "agent_reported_ms")


# --- load.json ------------------------------------------------------------------------------------------------


def _sweeps(doc: Any) -> list[Mapping[str, Any]]:
    """load.json's sweeps, each with its steps: a file with none measured nothing, and is no evidence."""
    _require(isinstance(doc, dict), f"{LOAD} is not an object")
    sweeps = doc.get("sweeps")
    _require(isinstance(sweeps, list) and bool(sweeps), f"{LOAD} has no sweeps: nothing was measured")
    for sweep in sweeps:
        _require(isinstance(sweep, dict) and isinstance(sweep.get("steps"), list) and bool(sweep["steps"]),
                 f"slots {sweep.get('slots') if isinstance(sweep, dict) else sweep!r}: a sweep with no steps")
    return sweeps


def _possible(samples: Sequence[Mapping[str, Any]]) -> None:
    """Every sample's times and counts are numbers a turn can have: finite, and >= 0 (a clock reading finite)."""
    for row, s in enumerate(samples, 1):
        for key in ("start", *_NON_NEGATIVE):
            value = s.get(key)
            if value is None:
                continue
            where = f"{LOAD_SAMPLES} row {row} ({s.get('caller')} turn {s.get('turn')}) {key}"
            _require(finite_number(value, where) >= 0 or key == "start", f"{where} is negative: {value!r}")


def read_load(out: RunFolder | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """load.json and its raw samples, as saved (ArtifactError when either cannot be read)."""
    doc = RunFolder.of(out).json(LOAD)
    return doc, read_samples(RunFolder.of(out).file(doc.get("samples_csv", LOAD_SAMPLES)))  # never outside OUT


def _evidence(out: RunFolder | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """load.json and its samples, refused when they measured nothing or hold impossible numbers."""
    doc, samples = read_load(out)
    sweeps = _sweeps(doc)
    _possible(samples)
    if not samples:  # no turn at all: a relation on the samples has nothing to hold on (unless a step claims turns)
        claimed = [s.get("turns") for sweep in sweeps for s in sweep["steps"] if s.get("turns")]
        _require(not claimed, f"{LOAD} counts {claimed} turns but {LOAD_SAMPLES} holds no sample")
        raise NotCheckable(f"{LOAD_SAMPLES} holds no turn (no turn started in any measured window)")
    return doc, samples


def _measured(samples: Sequence[Mapping[str, Any]], slots: Any, step: int) -> list[Mapping[str, Any]]:
    return [s for s in samples if s["slots"] == slots and s["step"] == step and s["phase"] == "measure"]


def check_load_matches_samples(out: RunFolder | Path) -> str:
    """Invariant: every step of load.json is what its measured samples give (derived equals source)."""
    doc, samples = _evidence(out)
    metric, slo = _judged_on(doc)
    count = 0
    for sweep in doc["sweeps"]:
        for step in sweep["steps"]:
            window = step["window"]
            again = stats.summarize_step(_measured(samples, sweep["slots"], step["step"]), slo,
                                         window["end"] - window["start"], metric)
            later = [k for k in _COMPARED_LATER if k in step or k in again and metric == stats.DIAL_METRIC]
            if _schema(doc) >= 3 and metric == stats.DIAL_METRIC:
                later += _COMPARED_V3
            if _schema(doc) >= 5:
                later += _COMPARED_V5
            for key in (*_COMPARED, *later):
                _require(again.get(key) == step.get(key), f"slots {sweep['slots']}, {step['callers']} callers: {key} "
                                                          f"is {step.get(key)!r} in {LOAD} but {again.get(key)!r} "
                                                          "from the samples")
            count += 1
    return f"{count} steps recomputed from {len(samples)} raw samples"


def _schema(doc: Mapping[str, Any]) -> int:
    version = doc.get("load_schema_version")
    return version if isinstance(version, int) and not isinstance(version, bool) else 1


def _judged_on(doc: Mapping[str, Any]) -> tuple[str, float]:
    """The metric load.json's turns are judged on and its budget (LoadDoc.judged_on: the first sentence, or the
    heard gap of mode dial), which must be the metric the file names and a number."""
    found = LoadDoc.parse(doc)
    judged = found.judged_on
    if found.dialing:
        _require(found.metric == judged.metric, f"{LOAD}: mode dial judged on {found.metric!r}")
    return judged.metric, finite_number(judged.slo_ms, f"{LOAD} {judged.budget_key}")


def check_load_verdict(out: RunFolder | Path) -> str:
    """Invariant: the verdict and the stop rule follow from load.json's steps (derived equals source). A verdict
    that rests on no measured turn at all is not checkable: there is nothing it could be wrong about."""
    doc = RunFolder.of(out).json(LOAD)  # the verdict follows from load.json's steps: the raw samples are not needed
    verdicts = []
    empty = []
    for sweep in _sweeps(doc):
        turns = [s.get("turns") for s in sweep["steps"]]
        _require(all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in turns),
                 f"slots {sweep['slots']}: turns {turns} are not counts")
        if not any(turns):
            empty.append(f"slots {sweep['slots']}")
        # text steps fail early as dialing ones do since load_schema_version 4 (voice_llm.capabilities.load.document)
        again = stats.verdict(sweep["steps"], sweep["slots"], early=judged_on(doc).dialing or _schema(doc) >= 4)
        if _schema(doc) < 3:
            again.pop("saturating_stage", None)  # added in load_schema_version 3
        if _schema(doc) == 3 and again.get("max_callers") == 0:
            # before load_schema_version 4 a verdict of 0 named no saturating stage (the first step is the base);
            # since, a --no-stop sweep's last timed step names it (stats.saturating_stage)
            if sweep["verdict"].get("saturating_stage") is None:
                again["saturating_stage"] = None
        _require(again == sweep["verdict"], f"slots {sweep['slots']}: verdict {sweep['verdict']} but the steps say {again}")
        if doc.get("stop_on_budget", True):
            metric, slo = _judged_on(doc)
            reasons = [stats.stop_reason(s, slo, metric) for s in sweep["steps"]]
            _require(all(r is None for r in reasons[:-1]), f"slots {sweep['slots']}: the sweep went on after {reasons}")
        callers = [s["callers"] for s in sweep["steps"]]
        _require(callers == sorted(set(callers)), f"slots {sweep['slots']}: steps not strictly upward: {callers}")
        slots = (("the agent" if judged_on(doc).dialing else "the server's slots") if sweep["slots"] is None
                 else f"{sweep['slots']} slot{'' if sweep['slots'] == 1 else 's'}")
        verdicts.append(f"{slots}: {'no verdict' if again['max_callers'] is None else again['max_callers']}")
    if empty:
        raise NotCheckable(f"no turn was measured in any step of {', '.join(empty)}: the verdict "
                           f"({', '.join(verdicts)}) rests on nothing")
    return "max callers: " + ", ".join(verdicts)


def check_load_windows(out: RunFolder | Path) -> str:
    """Invariant: warm-up dropped: every counted turn started inside its step's measured window, every warm-up
    turn before it. The slack is for the phase message's way to a worker; a counted turn beyond it means the
    step's numbers counted turns of another phase, whatever the cause: the evidence does not show the claim."""
    doc, samples = _evidence(out)
    for sweep in doc["sweeps"]:
        workers = {s["worker"] for s in samples if s["slots"] == sweep["slots"]}
        _require(workers <= set(sweep["workers"]), f"samples from workers not in the sweep: {workers - set(sweep['workers'])}")
        for step in sweep["steps"]:
            start, end = step["window"]["start"], step["window"]["end"]
            for s in (s for s in samples if s["slots"] == sweep["slots"] and s["step"] == step["step"]):
                if s["phase"] == "measure":
                    _require(start - WINDOW_SLACK_S <= s["start"] <= end + WINDOW_SLACK_S,
                             f"a measured turn started at {s['start']:.1f}, outside {start:.1f}..{end:.1f}")
                elif s["phase"] == "warmup":
                    _require(s["start"] <= start + WINDOW_SLACK_S, f"a warm-up turn started at {s['start']:.1f}, after {start:.1f}")
    return f"{len(samples)} samples in their windows"


def check_load_turn_order(out: RunFolder | Path) -> str:
    """Invariant: the times of one turn on one clock: ttft <= first sentence <= end (text callers); the heard gap
    is first sound - speech end, and a failed turn has none (dialing callers: :func:`_heard_order`)."""
    doc, samples = _evidence(out)
    if judged_on(doc).dialing:
        return _heard_order(samples)
    timed = [s for s in samples if s["ttft_ms"] is not None]
    for s in timed:
        first = s["first_sentence_ms"] if s["first_sentence_ms"] is not None else s["ttft_ms"]
        _require(s["ttft_ms"] <= first <= s["e2e_ms"],
                 f"{s['caller']} turn {s['turn']}: ttft {s['ttft_ms']:.1f} <= first sentence {s['first_sentence_ms']} "
                 f"<= end {s['e2e_ms']:.1f} ms does not hold")
    return f"ttft <= first sentence <= end in {len(timed)} turns"


def _heard_order(samples: Sequence[Mapping[str, Any]]) -> str:
    """Invariant (dialing callers): each turn's heard gap is its two call-clock times' difference (dial.json
    rounds each to the microsecond; 0.01 ms allowed); an error turn (refused: close code 1013, or no reply)
    carries no gap, and a refusal is an error: a failed turn is never counted as a slow one."""
    timed = 0
    for s in samples:
        where = f"{s['caller']} call {s['call']} turn {s['turn']}"
        if s.get("refused"):
            _require(bool(s.get("error")), f"{where}: refused but not counted as an error")
        if s.get("error"):
            _require(s.get("heard_gap_ms") is None, f"{where}: an error ({s['error']}) with a heard gap "
                                                    f"{s.get('heard_gap_ms')} ms: a failed turn counted as a timed one")
            continue
        gap, end, first = s.get("heard_gap_ms"), s.get("speech_end_ms"), s.get("first_sound_ms")
        _require(gap is not None and end is not None and first is not None,
                 f"{where}: a turn without an error has no heard gap ({gap}), speech end ({end}) or first sound ({first})")
        _require(abs((first - end) - gap) <= 0.01, f"{where}: heard gap {gap} ms but first sound {first} - speech "
                                                   f"end {end} = {first - end:.3f} ms")
        timed += 1
    return f"heard gap = first sound - speech end in {timed} dialing turns; errors carry no gap"
