"""load's section of report.html (issue 30 item 5): the judged metric's p50/p90 and the goodput per step against the
budget and the target, and the agent's stage medians per step, two charts each with a caption saying what it shows
and why it matters.

The dialing sweep is ``fixtures/load_dial_run``: the files of a real `voice-llm load --dial` against voice-llm's
built-in agent (its spans received with --otlp-listen) on a loaded 2-core machine, 1 and 2 callers, 60 s steps, a
6 s heard-gap budget: 4 judged turns a step, no verdict (max callers 0), the LLM's first clause the stage that
grew (+4412 ms at 2 callers). The text sweep is ``fixtures/load_text_run``: a real `voice-llm load` (managed
server, 2 slots, SmolLM2-135M, no documents; callers 1, 2, 4, 30 s steps) at load average 8-10: 1-2 turns a step,
first sentence 13.7-35.6 s, no verdict. ``fixtures/load_dial_pipecat_run``: a real `load --dial --otlp-listen`
against `voice-llm agent --engine pipecat` (1 and 2 callers, 60 s steps, 60 s budget, load average ~10): 43 spans,
all naming their call, 5 turns matched, pipecat's one latency each and no stages.
"""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import pytest

from voice_llm.capabilities.load import report
from voice_llm.core.report.page import render_report

DIAL_RUN = Path(__file__).parents[1] / "fixtures" / "load_dial_run"
TEXT_RUN = Path(__file__).parents[1] / "fixtures" / "load_text_run"
PIPECAT_RUN = Path(__file__).parents[1] / "fixtures" / "load_dial_pipecat_run"


def _doc() -> dict:
    return json.loads((DIAL_RUN / "load.json").read_text())


def test_the_dialing_sweep_draws_the_heard_gap_and_goodput_then_the_stages() -> None:
    doc = _doc()
    fig, caption, tables = report.load_chart(doc)
    left, right = fig.axes
    assert left.get_ylabel() == "heard gap (ms)" and right.get_ylabel().startswith("goodput")
    # p90, p50 and the budget line on the left, the goodput and its target on the right, per step
    (p90, p50), budget = left.get_lines()[:2], left.get_lines()[2]
    steps = doc["sweeps"][0]["steps"]
    assert list(p90.get_ydata()) == [s["heard_gap_ms"]["p90"] for s in steps] == [7214.75, 29265.0]
    assert list(p50.get_ydata()) == [s["heard_gap_ms"]["p50"] for s in steps]
    assert list(budget.get_ydata()) == [6000.0, 6000.0]
    assert list(right.get_lines()[0].get_ydata()) == [75.0, 0.0] and list(right.get_lines()[1].get_ydata()) == [95.0] * 2
    assert left.get_xscale() == "linear" and [t.get_text() for t in left.get_xticklabels()] == ["1", "2"]
    assert "the agent: max callers = 0, on 4 judged turns (limited by cpu)" in caption
    assert "p50 (dashed) and p90 (solid) against the 6000 ms budget" in caption and "Why it matters" in caption
    assert "1 caller" not in tables or "heard gap p50/p90/p99" in tables
    stages_fig, why = report.stages_chart(doc)
    (ax,) = stages_fig.axes
    assert len(ax.patches) == 2 * 7  # a bar per step for each of the agent's seven stages, stacked
    heights = [p.get_height() for p in ax.patches]
    assert sum(heights[i] for i in range(1, 14, 2)) == pytest.approx(
        sum(v for v in steps[1]["agent_stages_ms"].values() if v))
    assert "LLM first clause grew most, by 4412 ms at 2 callers" in why and "Why it matters" in why
    assert "where" in why and "the band that widens" in why


def test_report_html_of_the_real_dialing_run_is_two_figures_then_the_tables(tmp_path: Path) -> None:
    out = Path(shutil.copytree(DIAL_RUN, tmp_path / "out"))
    page = render_report(out).read_text()
    assert re.search(r'<body data-charts="2"', page)
    start = page.index('<section id="section-load">')
    section = page[start:page.index("</section>", start)]
    assert "how many callers within the heard gap budget" in section
    assert re.findall(r'<figure class="chart" id="chart-([a-z]+)"', section) == ["load", "loadstages"]
    assert section.count("<figcaption>") == 2
    assert section.index('id="chart-loadstages"') < section.index('class="load-steps"') < section.index('class="load-stages"')


def test_a_real_text_sweep_draws_the_first_sentence_on_the_same_shape_without_stages() -> None:
    doc = json.loads((TEXT_RUN / "load.json").read_text())
    fig, caption, _ = report.load_chart(doc)
    left, right = fig.axes
    assert left.get_ylabel() == "first sentence (ms)"
    steps = doc["sweeps"][0]["steps"]
    assert list(left.get_lines()[0].get_ydata()) == [s["first_sentence_ms"]["p90"] for s in steps]
    assert list(left.get_lines()[-1].get_ydata()) == [1000.0, 1000.0]  # the budget
    # 13.7 s and 35.6 s against a 1 s budget on a readable (log) axis; the doubling callers 1, 2, 4 on log2
    assert left.get_yscale() == "log" and left.get_xscale() == "log"
    assert "2 slots: no verdict (fewer than 20 judged turns in every step)" in caption
    assert "time to the first whole sentence" in caption and "Why it matters" in caption
    assert report.stages_chart(doc) is None
    page = report.load_section(doc)
    assert "within the first sentence budget" in page and page.count("<figure") == 1


def test_the_callers_axis_is_log2_for_a_doubling_sweep_and_plain_for_one_more_caller_a_step() -> None:
    from voice_llm.core.report import style

    with style.drawing():
        fig = style.figure(style.WIDE)
        doubling, plain = fig.subplots(1, 2)
        report.callers_axis(doubling, [1, 2, 4, 8])
        report.callers_axis(plain, [1, 2, 3, 4, 6, 8])
    assert doubling.get_xscale() == "log" and plain.get_xscale() == "linear"


@pytest.mark.parametrize("a, b, words", [
    ({"max_callers": 2}, {"max_callers": 1}, "A holds more callers: 2 against 1 in B"),
    ({"max_callers": 1}, {"max_callers": 3}, "B holds more callers: 3 against 1 in A"),
    ({"max_callers": 2}, {"max_callers": 2}, "both hold 2 callers"),
    ({"max_callers": None}, {"max_callers": 0}, "only B has a verdict: B holds 0 callers, A no verdict"),
    ({"max_callers": None}, None, "neither run has a verdict"),
])
def test_which_run_holds_more_callers_in_words(a: dict, b: dict | None, words: str) -> None:
    assert report.holds_more(a, b).startswith(words)


def test_a_dialing_sweep_without_stage_times_says_why_there_is_no_stage_chart() -> None:
    # a real `load --dial --otlp-listen` against `voice-llm agent --engine pipecat` (fixtures/load_dial_pipecat_run):
    # every span named its call (none without a streamSid), each measured turn got pipecat's one latency, no stages
    doc = json.loads((PIPECAT_RUN / "load.json").read_text())
    spans = doc["caller"]["agent_spans"]
    assert spans["spans"] > 0 and spans["without_stream_sid"] == 0 and spans["turns_matched"] == 5
    assert report.stages_chart(doc) is None
    assert report.no_stages_reason(doc).startswith("The agent's stage times are not drawn: 5 turns matched")
    section = report.load_section(doc)
    assert section.count("<figure") == 1 and "none with voice-llm's stage breakdown" in html.unescape(section)
    doc["caller"].pop("agent_spans")
    assert "load received no spans (start the agent with --otlp" in report.no_stages_reason(doc)
