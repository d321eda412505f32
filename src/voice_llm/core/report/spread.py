"""The spread chart: every sample of every time metric as a dot, the median as a bar, one row per metric, for one
run (report.html's spread section, contributed by the repeats capability) or two (compare.html). A log time axis,
because a 20 ms cache hit and a 6 s prefill belong on one chart and a spread is a ratio: the same relative spread
looks the same width wherever it lies."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from voice_llm.core.analysis import metrics
from voice_llm.core.report import style

if TYPE_CHECKING:  # matplotlib is imported when a chart is drawn (style.figure), not with this module
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class SpreadSeries:
    name: str
    found: Mapping[str, metrics.Measured]
    color: str


def time_metrics(series: Sequence[SpreadSeries]) -> list[metrics.Metric]:
    keys = {key for s in series for key in s.found}
    return [m for m in metrics.all_metrics() if m.key in keys and m.unit == "ms"]


def spread_figure(series: Sequence[SpreadSeries]) -> Figure:
    rows = time_metrics(series)
    if not rows:
        raise ValueError("no time metric to draw")
    fig = style.figure((10.0, 0.9 + 0.34 * len(rows) * max(1, len(series))))
    ax = fig.add_subplot()
    band = 0.6 / max(1, len(series))
    for index, s in enumerate(series):
        offset = (index - (len(series) - 1) / 2) * band
        first = True
        for row, metric in enumerate(rows):
            measured = s.found.get(metric.key)
            if measured is None:
                continue
            y = len(rows) - 1 - row + offset
            # A zero cannot sit on a log axis; a sub-0.1 ms sample is drawn at 0.1 ms.
            xs = [max(v, 0.1) for v in measured.samples]
            ax.plot(xs, [y] * len(xs), "o", color=s.color, markersize=4, alpha=0.75,
                    label=f"{s.name}: each sample" if first else None)
            ax.plot([max(measured.median, 0.1)], [y], "|", color=s.color, markersize=14, markeredgewidth=2.2,
                    label=f"{s.name}: median" if first else None)
            if len(xs) > 1:
                ax.hlines(y, min(xs), max(xs), color=s.color, linewidth=1, alpha=0.5)
            first = False
    ax.set_yticks(range(len(rows)), [m.label for m in reversed(rows)])
    ax.set_xscale("log")
    ax.set_xlabel("time (ms, log scale)")
    ax.grid(axis="y", visible=False)
    ax.legend(loc="upper left", ncols=max(1, len(series)))
    return fig


def spread_caption(series: Sequence[SpreadSeries]) -> str:
    parts = []
    for s in series:
        counts = sorted({len(m.samples) for m in s.found.values()})
        widest = max(((m.spread or 0.0, m.metric.label) for m in s.found.values() if m.metric.unit == "ms"),
                     default=(0.0, "—"))
        parts.append(f"{s.name[:1].upper()}{s.name[1:]}: {'/'.join(map(str, counts))} samples per metric, widest spread {widest[0]:.0%} "
                     f"({widest[1]})")
    return ("Every measurement as a dot and the median (the number reported) as a bar; the spread is "
            "(max − min) / median. " + "; ".join(parts) + ".")

