"""`voice-llm compare A B` on two load runs (registered as ``compare=`` in voice_llm.load.CAPABILITY): per step both
runs measured (the same callers, in the sweep of the same slots, or the agent's), the judged metric's median with
compare's own significance rule (voice_llm.analysis.compare.compare_metric: the rank test from five turns a side,
else the ranges), its p50/p90 and the goodput as load.json states them, and the two verdicts (max callers, what
limited it, the agent's stage that grew most).

One sample per judged turn with a time (an error has none: it counts in goodput, not in the times), as dial's
metrics take a call's turns: different turns, not repeats, so a change is significant only when it stands out of
the turn-to-turn variation. Two runs judged on different metrics or budgets (a text sweep and a dialing one, or
1500 ms against 1200 ms) are not compared step by step: the line says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from voice_llm.analysis import compare as core
from voice_llm.analysis.metrics import Measured, Metric
from voice_llm.errors import ArtifactError
from voice_llm.load import stats
from voice_llm.load.checks import read_load
from voice_llm.load.stats import STAGE_LABELS, slots_label
from voice_llm.util import stats as ustats
from voice_llm.util.artifacts import LOAD

KIND = "load"


def _judged(doc: Mapping[str, Any]) -> tuple[str, float | None, str]:
    if doc.get("mode") == "dial":
        return stats.DIAL_METRIC, doc.get("slo_heard_ms"), "heard gap"
    return stats.TEXT_METRIC, doc.get("slo_first_sentence_ms"), "first sentence"


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
        text += (f", grew most: {STAGE_LABELS.get(grew['stage'], grew['stage'])} at {grew['callers']} callers "
                 f"(+{grew['growth_ms']:.0f} ms)")
    return f"{text}, tested up to {verdict.get('tested_up_to', '?')}"


def _sweep_name(doc: Mapping[str, Any], sweep: Mapping[str, Any]) -> str:
    return "the agent" if doc.get("mode") == "dial" else slots_label(sweep.get("slots"))


def compare_load(out_a: Path, out_b: Path) -> dict[str, Any] | None:
    """The load part of `compare A B`: None unless both folders hold load.json; else {"kind", "lines", "steps",
    "verdicts"} (a folder whose load.json or samples cannot be read is one line, never a traceback)."""
    if not all((out / LOAD).is_file() for out in (out_a, out_b)):
        return None  # a load run against a folder without one: nothing of load's to compare (the core says the rest)
    try:
        (doc_a, samples_a), (doc_b, samples_b) = read_load(out_a), read_load(out_b)
    except ArtifactError as exc:
        return {"kind": KIND, "lines": [f"load: not compared: {exc}"], "steps": [], "verdicts": []}
    (metric, slo_a, what), (metric_b, slo_b, _) = _judged(doc_a), _judged(doc_b)
    if (metric, slo_a) != (metric_b, slo_b):
        return {"kind": KIND, "steps": [], "verdicts": [],
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
        verdicts.append({"sweep": name, "a": sweep_a.get("verdict"), "b": sweep_b.get("verdict")})
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
                m = Metric(f"load_{metric}_{callers}", f"load, {name}, {what} at {callers} callers (median)", "ms",
                           LOAD, metric == stats.DIAL_METRIC, lambda doc: (0.0, []), repeats=False)
                found = core.compare_metric(Measured(m, ustats.median(times_a), times_a),
                                            Measured(m, ustats.median(times_b), times_b))
                row.update({"test": found.test, "p_value": found.p_value, "significant": found.significant})
                lines.append(f"{found.line}; {tail}")
            else:
                row.update({"test": None, "p_value": None, "significant": None})
                lines.append(f"load, {name}, {what} at {callers} callers: no timed turn in "
                             f"{'A' if not times_a else 'B'}; {tail}")
            rows.append(row)
    for sweep_b in doc_b.get("sweeps") or []:
        if sweep_b.get("slots") not in {sw.get("slots") for sw in doc_a.get("sweeps") or []}:
            lines.append(f"load, {_sweep_name(doc_b, sweep_b)}: measured in run B only")
    return {"kind": KIND, "lines": lines, "steps": rows, "verdicts": verdicts}


__all__ = ["compare_load"]
