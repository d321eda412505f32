"""`voice-llm compare A B` on two load runs: per shared step the judged metric's median with compare's significance
rule, its p50/p90 and goodput, and both verdicts; on two made-up load folders (no Locust, no agent)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from voice_llm.analysis.compare import IncomparableRunsError, compare_runs, summary_lines
from voice_llm.load import stats
from voice_llm.load.document import load_document, sweep_document
from voice_llm.load.plan import CallerConfig, DialConfig, SweepPlan
from voice_llm.load.samples import write_samples
from voice_llm.load.settings import LoadSettings

URL = "ws://127.0.0.1:9/"


def _row(step: int, n: int, gap: float | None, error: str | None = None) -> dict:
    row = {name: None for name in stats.SAMPLE_FIELDS}
    row.update({"step": step, "callers": step + 1, "phase": "measure", "worker": "w1", "caller": "w1/1", "call": n,
                "turn": 1, "start": 105.0 + 100 * step + n / 10, "error": error, "cancelled": False, "tokens": 0,
                "refused": error is not None, "barge_in": False, "call_frames": 1000, "late_frames": 0})
    if gap is not None:
        row.update({"heard_gap_ms": gap, "speech_end_ms": 3000.0, "first_sound_ms": 3000.0 + gap})
    row.pop("slots")
    return row


def _load_run(out: Path, gaps_per_step: list[list[float | None]], slo: float = 1500.0) -> Path:
    """load.json + load_samples.csv as `load --dial` writes them, one step per list of heard gaps (None: refused)."""
    dial = DialConfig(url=URL)
    plan = SweepPlan(caller=CallerConfig(url=URL, system="", turns=()), callers=tuple(range(1, len(gaps_per_step) + 1)),
                     step_s=60.0, dial=dial, slo_heard_ms=slo)
    rows = [_row(i, n, g, None if g is not None else "refused: close code 1013")
            for i, gaps in enumerate(gaps_per_step) for n, g in enumerate(gaps)]
    result = {"started": 0.0, "ended": 900.0, "workers": ["w1"], "stopped": None, "samples": rows,
              "steps": [{"step": i, "callers": i + 1, "window": {"start": 100.0 + 100 * i, "end": 160.0 + 100 * i,
                         "drain_s": 0.5}, "cpu": {}, "generator_bound": False,
                         "host": {"cpu_busy": 0.5, "loadavg_1m": 1.0, "master_cpu_s": 0.1}}
                        for i in range(len(gaps_per_step))]}
    sweep, samples = sweep_document(plan, result, None, URL)
    settings = LoadSettings(dial=URL, step_s=60.0, warmup_s=5.0, callers=plan.callers, stop_on_budget=False,
                            slo_heard_ms=slo)
    out.mkdir(parents=True)
    (out / "load.json").write_text(json.dumps(load_document(settings, {"mode": "dial"}, [sweep])))
    write_samples(out / "load_samples.csv", samples)
    return out


def test_two_load_runs_compared_step_by_step(tmp_path: Path) -> None:
    # A holds 2 callers; B (a slower agent) holds 1: at 2 callers its gaps are ~600 ms longer
    a = _load_run(tmp_path / "a", [[900.0 + n for n in range(20)], [1000.0 + n for n in range(20)],
                                   [2000.0 + n for n in range(20)]])
    b = _load_run(tmp_path / "b", [[905.0 + n for n in range(20)], [1600.0 + n for n in range(20)]])
    comparison = compare_runs(a, b)
    (load,) = comparison.others
    assert [(r["callers"], r["significant"]) for r in load["steps"]] == [(1, True), (2, True)]
    assert load["steps"][1]["a"]["goodput"] == 1.0 and load["steps"][1]["b"]["goodput"] == 0.0
    assert load["steps"][1]["test"] == "mann-whitney"
    lines = summary_lines(comparison)
    assert any("A max callers 2 (limited by agent), tested up to 3; B max callers 1 (limited by agent), tested up to 2"
               in line for line in lines)
    two = next(line for line in lines if "heard gap at 2 callers" in line)
    assert "1,010 -> 1,610 ms" in two and "significant (Mann-Whitney" in two and "a listener would notice" in two
    assert "p90 1017 -> 1617 ms, goodput 100 % -> 0 % (20 vs 20 judged turns)" in two
    assert not any("heard gap at 3 callers" in line for line in lines)  # a step of A only is not compared
    assert comparison.as_dict()["capabilities"][0]["kind"] == "load"


def test_load_runs_with_other_budgets_or_one_load_run_are_said_not_compared(tmp_path: Path) -> None:
    a = _load_run(tmp_path / "a", [[900.0] * 20])
    b = _load_run(tmp_path / "b", [[900.0] * 20], slo=1200.0)
    (load,) = compare_runs(a, b).others
    assert load["lines"] == ["load: not compared step by step: A is judged on heard_gap_ms <= 1500 ms, B on "
                             "heard_gap_ms <= 1200 ms"]
    # a refused step (no heard gap at all in B) is said, its goodput still compared
    c = _load_run(tmp_path / "c", [[None] * 3])
    line = next(ln for ln in summary_lines(compare_runs(a, c)) if "at 1 callers" in ln)
    assert "no timed turn in B" in line and "goodput 100 % -> 0 %" in line
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(IncomparableRunsError, match="no measurement compare reads"):
        compare_runs(a, empty)
