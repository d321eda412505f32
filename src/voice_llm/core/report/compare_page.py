"""``voice-llm report --compare OUT_B``: both runs on one page (OUT_A/compare.html), from their files alone — the
set-ups side by side, each run's noise, a verdict per metric and the spread of both runs on one chart.

A capability that compares its own runs (Capability.compare: two load runs, step by step) draws its own sections
here (Capability.compare_sections, each built from what its compare returned), as it draws its sections of
report.html: the page imports no capability. When only a capability's comparison holds numbers (two load runs
share none of the core's metrics), its sections are the page's verdict and the core's empty ones are left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


from voice_llm import __version__


from voice_llm.core import registry
from voice_llm.core.analysis.compare import AUDIO_FIELDS, NOTICE_MS, Comparison, RunSide, noise_brief, shown
from voice_llm.core.errors import ArtifactError, NoDataError, ReportIncompleteError
from voice_llm.core.registry import SectionEntry
from voice_llm.core.report import style
from voice_llm.core.report.page import metadata_rows
from voice_llm.core.report.spread import SpreadSeries, spread_caption, spread_figure, time_metrics
from voice_llm.core.report.style import BLUE, ORANGE, Chart, chart_section_html, guarded
from voice_llm.core.run.folder import RunFolder
from voice_llm.core.util.artifacts import COMPARE_HTML, RUN, write_bytes_atomic


_EXTRA_CSS = """
table.verdicts td.sig { font-weight: 600; }
table.verdicts tr.heard td { background: #eef6ff; }
table.meta tr.differs td, table.meta tr.differs th { background: #fff7e0; }
"""


def _run_doc(side: RunSide) -> Mapping[str, Any]:
    try:
        doc = RunFolder(side.out).json(RUN)
    except ArtifactError:
        return {}
    return doc if isinstance(doc, Mapping) else {}


def _metadata_html(comparison: Comparison) -> str:
    left, right = metadata_rows(_run_doc(comparison.a)), metadata_rows(_run_doc(comparison.b))
    # The speak step's TTS and options, and each step's repeats: run.json does not hold them (compare.setup_of).
    extra = [label for label, _ in AUDIO_FIELDS] + [label for label in comparison.a.setup if label.startswith("repeat")]
    value = lambda side, label: shown(side.setup.get(label), "—")  # noqa: E731 - as a person reads it, not a repr
    left += [(label, value(comparison.a, label)) for label in extra]
    right += [(label, value(comparison.b, label)) for label in extra]
    rows = []
    for (label, a), (_, b) in zip(left, right):
        # Ids, times and loads always differ; flag only what changes what was measured.
        differs = a != b and label not in {"run id", "started", "ended"} and not label.startswith("load average")
        rows.append(f'<tr class="{"differs" if differs else ""}"><th>{style.esc(label)}</th><td>{style.esc(a)}</td>'
                    f"<td>{style.esc(b)}</td></tr>\n")
    return ('<section id="section-metadata">\n<h2>Set-up of the two runs</h2>\n<table class="meta"><thead><tr>'
            "<th></th><th>A</th><th>B</th></tr></thead><tbody>\n" + "".join(rows) + "</tbody></table>\n</section>\n")


def _noise_html(comparison: Comparison) -> str:
    items = []
    for name, side in (("A", comparison.a), ("B", comparison.b)):
        if side.noise.get("noisy"):
            items.append(f"<li>run {name} was noisy: {style.esc(noise_brief(side.noise))}</li>")
        else:
            items.append(f"<li>run {name}: the machine was quiet enough</li>")
    noisy = any(side.noise.get("noisy") for side in (comparison.a, comparison.b))
    title = "Warning: a run was made on a noisy machine" if noisy else "Noise"
    return (f'<section id="section-noise" class="{"noise" if noisy else "quiet"}">\n<h2>{title}</h2>\n'
            f"<ul>\n{''.join(items)}\n</ul>\n</section>\n")


def _verdicts_html(comparison: Comparison) -> str:
    if not comparison.metrics:
        return ('<section id="section-verdicts">\n<h2>Every metric, B against A</h2>\n<p class="missing">no data: '
                "the two runs share no measured metric</p>\n</section>\n")
    rows = []
    for m in comparison.metrics:
        ratio = "—" if m.ratio is None else f"{m.ratio:.2f}"
        sig = {True: "significant", False: "within the noise", None: "cannot tell"}[m.significant]
        rows.append(
            f'<tr class="{"heard" if m.noticeable else ""}"><td>{style.esc(m.label)}</td>'
            f'<td class="num">{m.a:,.1f} {style.esc(m.unit)}</td><td class="num">{m.b:,.1f} {style.esc(m.unit)}</td>'
            f'<td class="num">{ratio}</td><td class="{"sig" if m.significant else ""}">{style.esc(sig)}'
            f'{"<br>set-ups differ: " + style.esc(", ".join(m.setup_differs)) if m.setup_differs else ""}</td>'
            f"<td>{'yes' if m.noticeable else ''}</td><td>{style.esc(m.line)}</td></tr>\n")
    heard = [m.label for m in comparison.metrics if m.noticeable]
    return (
        '<section id="section-verdicts">\n<h2>Every metric, B against A</h2>\n'
        f"<p>A listener would notice: <strong>{style.esc('; '.join(heard) or 'nothing')}</strong> (a significant change "
        f"of {NOTICE_MS:.0f} ms or more in what the caller hears; a rule of thumb).</p>\n"
        '<table class="verdicts"><thead><tr><th>metric</th><th>A</th><th>B</th><th>B/A</th><th>beyond noise?</th>'
        "<th>heard?</th><th>in words</th></tr></thead><tbody>\n" + "".join(rows) + "</tbody></table>\n</section>\n"
    )


def render_compare(comparison: Comparison, dest: Path | None = None) -> Path:
    """Write the comparison page (default OUT_A/compare.html) and return its path."""
    series = [SpreadSeries("A", comparison.a.found, BLUE), SpreadSeries("B", comparison.b.found, ORANGE)]
    failures: list[tuple[str, str]] = []
    sections = [guarded("metadata", "Set-up of the two runs", lambda: _metadata_html(comparison), failures),
                guarded("noise", "Noise", lambda: _noise_html(comparison), failures)]
    with style.drawing():
        own = _capability_sections(comparison, failures)
        sections += own
        if comparison.metrics or not own:  # the core's numbers, or nothing else to show: its sections say so
            sections.append(guarded("verdicts", "Every metric, B against A", lambda: _verdicts_html(comparison),
                                    failures))
            sections.append(guarded("spread", _SPREAD_TITLE, lambda: _spread_html(series), failures))
    charts = sum(section.count('<figure class="chart"') for section in sections)
    header = (f"<header>\n<h1>voice-llm: two runs compared</h1>\n<p class=\"lede\">A: {style.esc(comparison.a.out)} "
              f"(run {style.esc(comparison.a.run_id or 'without id')})<br>B: {style.esc(comparison.b.out)} (run {style.esc(comparison.b.run_id or 'without id')})</p>\n"
              + "".join(f"<p class=\"missing\">compared with --force although {style.esc(r)}</p>\n" for r in comparison.forced)
              + "</header>\n")
    page = (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>voice-llm compare</title>\n<style>{style.CSS}{_EXTRA_CSS}</style>\n<script>{style.RENDER_PROBE}</script>\n"
        f'</head>\n<body data-charts="{charts}" data-rendered="0">\n{header}{"".join(sections)}'
        f"<footer>voice-llm {style.esc(__version__)}: rendered from the two runs' files alone.</footer>\n</body>\n</html>\n"
    )
    path = write_bytes_atomic(dest or comparison.a.out / COMPARE_HTML, page.encode("utf-8"))
    if failures:
        raise ReportIncompleteError(path, tuple(failures))
    return path


_SPREAD_TITLE = "Spread over repeats, both runs"


def _spread_html(series: list[SpreadSeries]) -> str:
    if not time_metrics(series):
        return (f'<section id="section-spread">\n<h2>{_SPREAD_TITLE}</h2>\n<p class="missing">no data: neither run '
                "measured a time</p>\n</section>\n")
    return chart_section_html("spread", _SPREAD_TITLE, Chart(spread_figure(series), spread_caption(series)))


def _capability_sections(comparison: Comparison, failures: list[tuple[str, str]]) -> list[str]:
    """Each registered capability's compare sections, for each comparison it returned (its "kind" is its name)."""
    drawn = []
    for capability in registry.capabilities():
        for result in (other for other in comparison.others if other.get("kind") == capability.name):
            drawn += [_capability_section(entry, result, failures) for entry in capability.compare_sections]
    return drawn


def _capability_section(entry: SectionEntry, result: Mapping[str, Any], failures: list[tuple[str, str]]) -> str:
    """One capability section: its chart or HTML; "no data" / "not available" with the reason; a bug in its drawing
    is said in the section and after the page (ReportIncompleteError), as report.html does."""
    try:
        built = entry.build(result)
    except NoDataError as exc:
        return style.missing_section_html(entry.name, entry.title, str(exc), "no data")
    except ArtifactError as exc:
        return style.missing_section_html(entry.name, entry.title, str(exc))
    except Exception as exc:  # noqa: BLE001 - a bug in one section must not cost the page
        return style.failed_section(entry.name, entry.title, exc, failures)
    if isinstance(built, str):
        return built
    return guarded(entry.name, entry.title, lambda: style.chart_section_html(entry.name, entry.title, built), failures)
