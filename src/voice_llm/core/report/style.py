"""The one look of every page voice-llm draws (report.html, compare.html, and each capability's charts): the
palette, the matplotlib settings, the CSS, how a time is written, the chart value a section builder returns and
the HTML a section becomes.

Public on purpose: the core's pages and every capability's renderer import these names and no private one, so
the report does not import a capability to share its style (and a capability's charts do not import the page).

Charts are drawn with matplotlib's object API (``matplotlib.figure.Figure``, never pyplot: no global figure state,
no GUI backend) and inlined as SVG markup, so a page needs no network and prints as vectors.
"""

from __future__ import annotations

import contextlib

import html
import io
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any


from voice_llm.core.errors import ArtifactError, NoDataError

if TYPE_CHECKING:  # matplotlib is imported when a chart is drawn (style.figure), not with this module
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# Fixed SVG settings so the same artifacts always give the same bytes: a constant hash salt for clip-path and
# marker ids, and text kept as <text> (smaller, selectable, searchable) instead of glyph outlines.
RC: dict[str, Any] = {
    "svg.fonttype": "none",
    "svg.hashsalt": "voice-llm",
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.axisbelow": True,  # grid behind bars, not across them
    "grid.alpha": 0.3,
    "legend.fontsize": 9,
    "legend.framealpha": 0.9,
}


def figure(size: tuple[float, float]) -> Figure:
    """A new figure of ``size`` inches with the constrained layout every chart uses. matplotlib (~0.4 s to import)
    is imported here, when the first chart is drawn, so the CLI and the modules that only name a renderer start
    without it (a heavy third-party import, the one kind a function may make)."""
    from matplotlib.figure import Figure

    return Figure(figsize=size, layout="constrained")


@contextlib.contextmanager
def drawing() -> Iterator[None]:
    """The fixed settings (:data:`RC`) while charts are drawn and saved."""
    import matplotlib

    with matplotlib.rc_context(RC):
        yield


WIDE = (10.0, 3.6)  # inches; 720 pt of SVG fills the ~1000 px column at about 1:1
TIME_AXIS = "time since the request was sent (ms)"

# One colour per meaning, shared by every chart.
BLUE, ORANGE, GREEN, GREY, RED, PURPLE = "#1f77b4", "#e67e22", "#2ca02c", "#555555", "#d62728", "#7b4ea3"
# One colour per series where a chart has several of one kind (the load sweeps, one per slot count).
SERIES = (BLUE, ORANGE, GREEN, PURPLE, RED, GREY)

# Every id and id reference matplotlib writes; prefixed per chart so five inlined SVGs never share an id.
_SVG_ID_RE = re.compile(r'\b(id="|href="#|url\(#)([^")]+)')


# NoDataError (voice_llm.core.errors): the step ran but saved nothing to draw; the section says "no data" with it.


@dataclass(frozen=True)
class Chart:
    """What a section builder returns: the figure, the sentence under it, and any HTML after it (tables)."""

    figure: Figure
    caption: str
    extra_html: str = ""


# --- formatting ----------------------------------------------------------------------------------------------


def esc(value: Any) -> str:
    """HTML-escape anything that came from an artifact (model path, chunk text, check details...)."""
    return html.escape(str(value), quote=True)


def ms(value: float | None) -> str:
    """A time in ms as every page writes it: sub-10 ms values keep a decimal (a 3.4 ms cache hit does not read
    as "3"), larger ones are whole with thousands separators; None (not measured) is a dash."""
    if value is None:
        return "–"
    return f"{value:.1f}" if abs(value) < 10 else f"{value:,.0f}"


def count(value: float) -> str:
    return f"{value:,.0f}"


def percent(value: float | None) -> str:
    """A share (0..1) as a whole percentage; None is a dash."""
    return "–" if value is None else f"{100 * value:.0f} %"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], css_class: str) -> str:
    """A plain HTML table of text cells (every cell escaped)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{css_class}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>\n'


# --- reading and validating artifact values ------------------------------------------------------------------


def mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ArtifactError(f"{where} should be a JSON object, got {type(value).__name__}")
    return value


def rows(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ArtifactError(f"{where} should be a non-empty JSON list")
    if not value:
        raise NoDataError(f"{where} is an empty list: the step saved no measurement")
    return value


def optional_number(obj: Mapping[str, Any], key: str, where: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    # bool is an int in Python, but `true` is never a valid time or count.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ArtifactError(f"{where}: {key!r} should be a number, got {value!r}")
    if not math.isfinite(value):  # NaN or infinity: the step saved no measurement here
        raise NoDataError(f"{where}: {key!r} is {value!r}, not a measurement")
    return float(value)


def number(obj: Mapping[str, Any], key: str, where: str) -> float:
    value = optional_number(obj, key, where)
    if value is None:
        if key in obj:  # null: the step measured nothing here (an all-error or empty step)
            raise NoDataError(f"{where}: {key!r} is null")
        raise ArtifactError(f"{where}: {key!r} is missing")
    return value


# --- chart plumbing ------------------------------------------------------------------------------------------


def figure_svg(fig: Figure, prefix: str) -> str:
    """The figure as SVG markup ready to inline in HTML: no XML prolog or doctype, ids unique to ``prefix``."""
    buf = io.StringIO()
    # Date=None drops the timestamp matplotlib otherwise embeds, keeping the output reproducible.
    fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    return _SVG_ID_RE.sub(lambda m: f"{m.group(1)}{prefix}-{m.group(2)}", svg)


def figure_html(name: str, chart: Chart) -> str:
    """One chart as a <figure> with its caption and its extra HTML after it; ``name`` makes its ids unique on the
    page (letters only: the browser test finds a chart by ``chart-<letters>``)."""
    svg = figure_svg(chart.figure, f"chart-{name}")
    return (f'<figure class="chart" id="chart-{name}">\n{svg}\n'
            f"<figcaption>{esc(chart.caption)}</figcaption>\n</figure>\n{chart.extra_html}")


def chart_section_html(name: str, title: str, chart: Chart) -> str:
    return charts_section_html(name, title, [(name, chart)])


def charts_section_html(name: str, title: str, charts: Sequence[tuple[str, Chart]], intro: str = "") -> str:
    """A section of several charts (each its own figure and caption, named for its ids), after ``intro`` (HTML)."""
    figures = "".join(figure_html(chart_name, chart) for chart_name, chart in charts)
    return f'<section id="section-{name}">\n<h2>{esc(title)}</h2>\n{intro}{figures}</section>\n'


def missing_section_html(name: str, title: str, reason: str, what: str = "not available") -> str:
    """A section without its chart, saying why: "not available" (missing or malformed artifact) or "no data"."""
    return (
        f'<section id="section-{name}">\n<h2>{esc(title)}</h2>\n'
        f'<p class="missing">{what}: {esc(reason)}</p>\n</section>\n'
    )


def failed_section(name: str, title: str, exc: Exception, failures: list[tuple[str, str]]) -> str:
    """The section of a drawing that raised (a bug): said in the page, and recorded in ``failures``."""
    error = f"{type(exc).__name__}: {exc}"
    failures.append((name, error))
    return (f'<section id="section-{name}">\n<h2>{esc(title)}</h2>\n'
            f'<p class="missing">could not be drawn: {esc(error)}</p>\n</section>\n')


def guarded(name: str, title: str, draw: Callable[[], str], failures: list[tuple[str, str]]) -> str:
    """``draw()``, or, when it raises, a section that says it could not be drawn (and the failure recorded)."""
    try:
        return draw()
    except Exception as exc:  # noqa: BLE001 - a bug in one section must not cost the page or the run's exit
        return failed_section(name, title, exc, failures)


def vline(ax: Axes, x: float, label: str, color: str, style: str = "--") -> None:
    ax.axvline(x, color=color, linestyle=style, linewidth=1.6, label=label)


def bars(ax: Axes, labels: Sequence[str], values: Sequence[float], color: str, unit: str) -> None:
    container = ax.bar(labels, values, color=color, width=0.6)
    # A white backing keeps a value readable where a median line crosses it.
    ax.bar_label(container, labels=[f"{ms(v)} {unit}" for v in values], padding=2, fontsize=9,
                 bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.85})
    ax.margins(y=0.15)  # room for the value labels above the tallest bar


# --- the page ------------------------------------------------------------------------------------------------

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #1a1a1a;
  background: #fff; max-width: 1000px; margin: 0 auto; padding: 20px 24px 40px; line-height: 1.45; }
h1 { font-size: 1.7rem; margin: 0 0 .2rem; }
h2 { font-size: 1.2rem; margin: 1.8rem 0 .5rem; padding-bottom: .2rem; border-bottom: 1px solid #ddd; }
.columns h2 { margin-top: .8rem; }
.lede { color: #444; margin: 0; }
.headline { font-size: 1.35em; font-weight: 600; margin: 0.6em 0; }
.columns { display: grid; grid-template-columns: 1fr 1fr; gap: 0 2rem; }
table { border-collapse: collapse; font-size: .92rem; width: 100%; }
th, td { text-align: left; vertical-align: top; padding: .22rem .5rem; border-bottom: 1px solid #eee; }
th { font-weight: 600; }
tbody th { font-weight: normal; color: #444; }
.facts td.num { text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.badge { display: inline-block; font-weight: 700; font-size: .8rem; padding: 0 .45em; border-radius: 3px; }
tr.pass .badge { background: #e3f5e6; color: #136c2e; }
tr.fail .badge { background: #fde8e8; color: #a11111; }
tr.fail td { background: #fff7f7; }
tr.unknown .badge { background: #eeeeee; color: #444; }
tr.finding .badge { background: #fff3d6; color: #7a4b00; }
figure.chart { margin: 0; }
figure.chart svg { display: block; width: 100%; height: auto; }
figcaption { margin-top: .3rem; font-size: .98rem; }
.missing { padding: .5rem .8rem; background: #fff4e5; border-left: 4px solid #e69500; }
dl.texts { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1rem; font-size: .92rem; }
dl.texts dt { color: #444; }
dl.texts dd { margin: 0; white-space: pre-wrap; }
details { font-size: .9rem; margin-top: .5rem; }
table.chunks code { white-space: pre-wrap; }
section.noise { background: #fff4e5; border-left: 4px solid #e69500; padding: .2rem 1rem .4rem; margin-top: 1rem; }
section.noise h2 { border: none; margin-top: .6rem; color: #8a4b00; }
section.quiet p { color: #136c2e; }
td.range { color: #666; font-size: .85rem; white-space: nowrap; }
table.meta td { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: .85rem; word-break: break-all; }
footer { margin-top: 2rem; color: #777; font-size: .85rem; }
@page { margin: 14mm; }
@media print {
  body { max-width: none; padding: 0; font-size: 10pt; }
  section, figure.chart, table { break-inside: avoid; }
  details { display: none; }
}
"""

# Lets a headless browser prove every chart really laid out: the test reads data-rendered from the dumped DOM
# and data-box (page coordinates) to look for ink in the screenshot where each chart should be.
RENDER_PROBE = """
window.addEventListener("load", function () {
  var rendered = 0;
  document.querySelectorAll("figure.chart").forEach(function (figure) {
    var svg = figure.querySelector("svg");
    if (!svg) { return; }
    var rect = svg.getBoundingClientRect(), box = svg.getBBox();
    if (rect.width > 0 && rect.height > 0 && box.width > 0 && box.height > 0) {
      rendered += 1;
      figure.setAttribute("data-box", [rect.left + window.scrollX, rect.top + window.scrollY,
                                       rect.width, rect.height].map(Math.round).join(","));
    }
  });
  document.body.setAttribute("data-rendered", String(rendered));
});
"""
