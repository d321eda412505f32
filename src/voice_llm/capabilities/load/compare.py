"""`voice-llm compare A B` on two load runs (registered as ``compare=`` in voice_llm.capabilities.load.CAPABILITY): per step both
runs measured (the same callers, in the sweep of the same slots, or the agent's), the judged metric's median with
compare's own significance rule (voice_llm.core.analysis.compare.compare_metric: the rank test from five turns a side,
else the ranges), its p50/p90 and the goodput as load.json states them, and the two verdicts (max callers, what
limited it, the agent's stage that grew most).

One sample per judged turn with a time (an error has none: it counts in goodput, not in the times), as dial's
metrics take a call's turns: different turns, not repeats, so a change is significant only when it stands out of
the turn-to-turn variation. Two load runs judged on different budgets (1500 ms against 1200 ms) are not compared
step by step: the line says why. Two runs of different kinds are refused in one line (IncomparableRunsError, as
compare refuses a folder it cannot read), text or --html alike: a load run against a run of lab steps (which
has no load.json), a sweep of text callers (first sentence) against one of dialing callers (heard gap): their
numbers are not of one thing.

The result also carries what compare.html draws (voice_llm.capabilities.load.report.compare_section, registered as the load
capability's compare section): the judged metric, its budget and the goodput target, and for each sweep both
runs' steps (not only the shared ones: a run that held more callers tested more steps).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from voice_llm.core.analysis import compare as core
from voice_llm.core.analysis.compare import IncomparableRunsError
from voice_llm.core.analysis.metrics import Measured, Metric
from voice_llm.core.errors import ArtifactError
from voice_llm.capabilities.load import stats
from voice_llm.capabilities.load.checks import read_load
from voice_llm.capabilities.load.doc import judged_on
from voice_llm.capabilities.load.stats import STAGE_LABELS, callers_text, slots_label
from voice_llm.core.run.folder import RunFolder
from voice_llm.core.util import stats as ustats
from voice_llm.core.util.artifacts import LOAD

KIND = "load"


def _judged(doc: Mapping[str, Any]) -> tuple[str, float | None, str]:
    judged = judged_on(doc)
    return judged.metric, judged.slo_ms, judged.name


def _times(samples: Sequence[Mapping[str, Any]], slots: Any, step: int, metric: str) -> tuple[float, ...]:
    return tuple(float(s[metric]) for s in samples if s["slots"] == slots and s["step"] == step
                 and s["phase"] == "measure" and not s.get("error") and s.get(metric) is not None)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f} %"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def _verdict(sweep: Mapping[str, Any]) -> str:
    verdict = sweep.get("verdict") or {}
    found = verdict.get("max_callers")
    text = "no verdict" if found is None else f"max callers {found}"
    if verdict.get("limited_by"):
        text += f" (limited by {verdict['limited_by']})"
    grew = verdict.get("saturating_stage")
    if grew:
        text += (f", grew most: {STAGE_LABELS.get(grew['stage'], grew['stage'])} at {callers_text(grew['callers'])} "
                 f"(+{grew['growth_ms']:.0f} ms)")
    return f"{text}, tested up to {verdict.get('tested_up_to', '?')}"


def _kind(doc: Mapping[str, Any]) -> str:
    metric, slo, what = _judged(doc)
    callers = "dialing callers" if metric == stats.DIAL_METRIC else "text callers"
    return f"a load run of {callers} (judged on the {what} <= {_ms(slo)} ms)"


def _other_kind(out: Path) -> str | None:
    """What a folder without load.json holds, when it is a run (run.json: the steps it planned), else None."""
    try:
        record = RunFolder(out).record
    except ArtifactError:
        return None
    if record is None:
        return None
    planned = record.doc.get("steps_planned")
    steps = [s for s in planned if isinstance(s, str)] if isinstance(planned, list) else []
    return f"a run of {', '.join(steps)}" if steps else "a run without load.json"


def _refuse_other_kinds(out_a: Path, out_b: Path, has_a: bool) -> None:
    """One of the two is a load run and the other a run of another kind: refused in one line."""
    kind = _other_kind(out_b if has_a else out_a)
    if kind is None:
        return  # not a run at all (an empty folder): the core says what it holds
    load = f"a load run ({LOAD})"
    other = f"{kind} (no {LOAD})"
    a, b = (load, other) if has_a else (other, load)
    raise IncomparableRunsError(f"will not compare {out_a} with {out_b}: A is {a}, B is {b}; compare two load "
                                "runs, or two runs of lab steps")


def _step_summary(step: Mapping[str, Any], metric: str) -> dict[str, Any]:
    spread = step.get(metric) or {}
    return {"callers": step.get("callers"), "p50": spread.get("p50"), "p90": spread.get("p90"),
            "goodput": step.get("goodput"), "judged": step.get("judged")}


def _sweep_name(doc: Mapping[str, Any], sweep: Mapping[str, Any]) -> str:
    return "the agent" if judged_on(doc).dialing else slots_label(sweep.get("slots"))


def compare_load(out_a: Path, out_b: Path) -> dict[str, Any] | None:
    """The load part of `compare A B`: None unless both folders hold load.json; else {"kind", "lines", "steps",
    "verdicts"} (a folder whose load.json or samples cannot be read is one line, never a traceback)."""
    has_a, has_b = ((out / LOAD).is_file() for out in (out_a, out_b))
    if has_a != has_b:
        _refuse_other_kinds(out_a, out_b, has_a)
    if not (has_a and has_b):
        return None  # no load run here: nothing of load's to compare (the core says the rest)
    try:
        (doc_a, samples_a), (doc_b, samples_b) = read_load(out_a), read_load(out_b)
    except ArtifactError as exc:
        return {"kind": KIND, "lines": [f"load: not compared: {exc}"], "steps": [], "verdicts": []}
    (metric, slo_a, what), (metric_b, slo_b, _) = _judged(doc_a), _judged(doc_b)
    if metric != metric_b:
        raise IncomparableRunsError(f"will not compare {out_a} with {out_b}: A is {_kind(doc_a)}, B is "
                                    f"{_kind(doc_b)}; compare two load runs of the same callers")
    drawn = {"metric": metric, "what": what, "slo_ms": slo_a, "slo_ms_b": slo_b,
             "goodput_target": doc_a.get("goodput_target"), "goodput_target_b": doc_b.get("goodput_target"),
             "mode": "dial" if metric == stats.DIAL_METRIC else "text"}
    if slo_a != slo_b:
        return {"kind": KIND, "steps": [], "verdicts": [], **drawn,
                "lines": [f"load: not compared step by step: A is judged on {metric} <= {_ms(slo_a)} ms, B on "
                          f"{metric_b} <= {_ms(slo_b)} ms"]}
    sweeps_b = {sw.get("slots"): sw for sw in doc_b.get("sweeps") or []}
    lines: list[str] = []
    rows: list[dict[str, Any]] = []
    verdicts: list[dict[str, Any]] = []
    for sweep_a in doc_a.get("sweeps") or []:
        sweep_b = sweeps_b.get(sweep_a.get("slots"))
        name = _sweep_name(doc_a, sweep_a)
        if sweep_b is None:
            lines.append(f"load, {name}: measured in run A only")
            continue
        verdicts.append({"sweep": name, "a": sweep_a.get("verdict"), "b": sweep_b.get("verdict"),
                         "steps_a": [_step_summary(s, metric) for s in sweep_a.get("steps") or []],
                         "steps_b": [_step_summary(s, metric) for s in sweep_b.get("steps") or []]})
        lines.append(f"load, {name}: A {_verdict(sweep_a)}; B {_verdict(sweep_b)}")
        steps_b = {s["callers"]: s for s in sweep_b.get("steps") or []}
        for step_a in sweep_a.get("steps") or []:
            step_b = steps_b.get(step_a["callers"])
            if step_b is None:
                continue
            callers = step_a["callers"]
            times_a = _times(samples_a, sweep_a.get("slots"), step_a["step"], metric)
            times_b = _times(samples_b, sweep_b.get("slots"), step_b["step"], metric)
            row = {"sweep": name, "callers": callers,
                   "a": {"p50": step_a[metric]["p50"], "p90": step_a[metric]["p90"], "goodput": step_a["goodput"],
                         "judged": step_a["judged"]},
                   "b": {"p50": step_b[metric]["p50"], "p90": step_b[metric]["p90"], "goodput": step_b["goodput"],
                         "judged": step_b["judged"]}}
            tail = (f"p50 {_ms(row['a']['p50'])} -> {_ms(row['b']['p50'])} ms, p90 {_ms(row['a']['p90'])} -> "
                    f"{_ms(row['b']['p90'])} ms, goodput {_pct(row['a']['goodput'])} -> {_pct(row['b']['goodput'])} "
                    f"({row['a']['judged']} vs {row['b']['judged']} judged turns)")
            if times_a and times_b:
                m = Metric(f"load_{metric}_{callers}", f"load, {name}, {what} at {callers_text(callers)} (median)", "ms",
                           LOAD, metric == stats.DIAL_METRIC, lambda doc: (0.0, []), repeats=False)
                found = core.compare_metric(Measured(m, ustats.median(times_a), times_a),
                                            Measured(m, ustats.median(times_b), times_b))
                row.update({"test": found.test, "p_value": found.p_value, "significant": found.significant})
                lines.append(f"{found.line}; {tail}")
            else:
                row.update({"test": None, "p_value": None, "significant": None})
                lines.append(f"load, {name}, {what} at {callers_text(callers)}: no timed turn in "
                             f"{'A' if not times_a else 'B'}; {tail}")
            rows.append(row)
    for sweep_b in doc_b.get("sweeps") or []:
        if sweep_b.get("slots") not in {sw.get("slots") for sw in doc_a.get("sweeps") or []}:
            lines.append(f"load, {_sweep_name(doc_b, sweep_b)}: measured in run B only")
    return {"kind": KIND, "lines": lines, "steps": rows, "verdicts": verdicts, **drawn}


__all__ = ["compare_load"]
