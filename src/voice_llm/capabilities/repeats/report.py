"""report.html's spread section, the repeats capability's: every sample of every time metric of the run, drawn by
the core's spread chart (voice_llm.core.report.spread, which compare.html draws for two runs)."""

from __future__ import annotations

from pathlib import Path

from voice_llm.core.analysis import metrics
from voice_llm.core.report import style
from voice_llm.core.report.spread import SpreadSeries, spread_caption, spread_figure, time_metrics
from voice_llm.core.run.folder import RunFolder

SPREAD_TITLE = "Spread over repeats"


def spread_section(out: RunFolder | Path) -> style.Chart | str:
    """report.html's spread section (voice_llm.capabilities.repeats.CAPABILITY): every time metric of this run folder."""
    series = [SpreadSeries("this run", metrics.measure_all(RunFolder.of(out)), style.BLUE)]
    if not time_metrics(series):
        return style.missing_section_html("spread", SPREAD_TITLE, "no measured times in this folder")
    return style.Chart(spread_figure(series), spread_caption(series))
