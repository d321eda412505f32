"""`voice-llm compare A B` on two load runs: per shared step the judged metric's median with compare's significance
rule, its p50/p90 and goodput, and both verdicts; on two made-up load folders (no Locust, no agent). compare.html of
two load runs (load's compare section), and runs of different kinds refused in one line."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from voice_llm.core.analysis.compare import IncomparableRunsError, compare_runs, summary_lines
from voice_llm.capabilities.load import stats
from voice_llm.capabilities.load.document import load_document, sweep_document
from voice_llm.capabilities.load.plan import SweepPlan
from voice_llm.capabilities.load.run import dial_caller
from voice_llm.capabilities.load.samples import write_samples
from voice_llm.capabilities.load.settings import LoadSettings

URL = "ws://127.0.0.1:9/"
FIXTURES = Path(__file__).parents[1] / "fixtures"


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
    caller, dial, _ = dial_caller(LoadSettings(dial=URL))
    plan = SweepPlan(caller=caller, callers=tuple(range(1, len(gaps_per_step) + 1)),
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
    line = next(ln for ln in summary_lines(compare_runs(a, c)) if "at 1 caller: " in ln)
    assert "no timed turn in B" in line and "goodput 100 % -> 0 %" in line
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(IncomparableRunsError, match="no measurement compare reads"):
        compare_runs(a, empty)


# --- compare.html of two load runs (voice-llm compare A B --html) --------------------------------------------


def test_the_compare_page_draws_both_runs_per_step_and_says_which_holds_more_callers(tmp_path: Path) -> None:
    from voice_llm.cli.main import main

    a = _load_run(tmp_path / "a", [[900.0 + n for n in range(20)], [1000.0 + n for n in range(20)],
                                   [2000.0 + n for n in range(20)]])
    b = _load_run(tmp_path / "b", [[905.0 + n for n in range(20)], [1600.0 + n for n in range(20)]])
    assert main(["compare", str(a), str(b), "--html"]) == 0
    page = (a / "compare.html").read_text()
    assert re.search(r'<body data-charts="1"', page)  # load's chart; the core's empty sections are left out
    assert 'id="section-load"' in page and 'id="section-verdicts"' not in page and 'id="section-spread"' not in page
    assert "how many callers within the heard gap budget" in page
    assert "A holds more callers: 2 against 1 in B" in page
    verdicts = page[page.index('class="load-verdicts"'):]
    assert "<td>the agent, A</td><td>2</td><td>3</td>" in verdicts and "<td>the agent, B</td><td>1</td><td>2</td>" in verdicts
    steps = page[page.index('class="load-compare"'):]
    assert steps.count("<tr>") == 1 + 2  # the two steps both measured (3 callers: A only, drawn but not compared)
    assert "<td>1,010/1,017</td><td>1,610/1,617</td><td>100 %</td><td>0 %</td>" in steps


def test_the_compare_chart_puts_a_and_b_side_by_side_for_every_step_of_either(tmp_path: Path) -> None:
    from voice_llm.capabilities.load.report import compare_section
    from voice_llm.core.report import style

    a = _load_run(tmp_path / "a", [[900.0] * 20, [1000.0] * 20, [2000.0] * 20])
    b = _load_run(tmp_path / "b", [[905.0] * 20, [None] * 20])  # every call refused at 2 callers
    (load,) = compare_runs(a, b).others
    assert (load["metric"], load["slo_ms"], load["goodput_target"]) == ("heard_gap_ms", 1500.0, 0.95)
    (entry,) = load["verdicts"]
    assert [s["callers"] for s in entry["steps_a"]] == [1, 2, 3] and [s["callers"] for s in entry["steps_b"]] == [1, 2]
    with style.drawing():
        section = compare_section(load)
    assert "A holds more callers: 2 against 1 in B" in section and "no timed" in section  # B refused at 2
    assert "<li>load, the agent: A max callers 2" in section  # compare's lines, in words


def test_runs_of_different_kinds_are_refused_in_one_line(tmp_path: Path) -> None:
    # real runs: a dialing sweep, a text sweep and a lab run (tests/fixtures)
    dial = Path(shutil.copytree(FIXTURES / "load_dial_run", tmp_path / "dial"))
    text = Path(shutil.copytree(FIXTURES / "load_text_run", tmp_path / "text"))
    with pytest.raises(IncomparableRunsError) as refused:
        compare_runs(dial, text)
    line = str(refused.value)
    assert "\n" not in line and "A is a load run of dialing callers (judged on the heard gap <= 6000 ms), B is a " \
        "load run of text callers (judged on the first sentence <= 1000 ms)" in line
    lab = Path(shutil.copytree(FIXTURES / "sample_run", tmp_path / "lab"))
    with pytest.raises(IncomparableRunsError, match=r"A is a run of health, sse, ttft, .* \(no load.json\), B is a "
                                                    r"load run \(load.json\); compare two load runs"):
        compare_runs(lab, dial, force=True)
    # the page is never written for them (the command says the line and exits)
    from voice_llm.cli.main import main

    assert main(["compare", str(text), str(lab), "--html"]) != 0
    assert not (text / "compare.html").exists()


def test_load_runs_on_other_budgets_get_a_page_that_says_why_they_are_not_compared(tmp_path: Path) -> None:
    from voice_llm.core.report.compare_page import render_compare

    a = _load_run(tmp_path / "a", [[900.0] * 20])
    b = _load_run(tmp_path / "b", [[900.0] * 20], slo=1200.0)
    page = render_compare(compare_runs(a, b)).read_text()
    assert 'id="section-load"' in page and "not compared: load: not compared step by step" in page


def test_two_real_text_sweeps_on_the_page_have_no_agent_stage_column(tmp_path: Path) -> None:
    from voice_llm.core.report.compare_page import render_compare

    a = Path(shutil.copytree(FIXTURES / "load_text_run", tmp_path / "a"))
    b = Path(shutil.copytree(FIXTURES / "load_text_run", tmp_path / "b"))
    page = render_compare(compare_runs(a, b)).read_text()
    assert "within the first sentence budget" in page and "neither run has a verdict" in page
    verdicts = page[page.index('class="load-verdicts"'):]
    assert "<td>2 slots, A</td><td>no verdict</td><td>4</td><td>–</td></tr>" in verdicts
    assert "stage that grew most" not in verdicts.split("</table>")[0]
    assert page[page.index('class="load-compare"'):].split("</table>")[0].count("<tr>") == 1 + 3
