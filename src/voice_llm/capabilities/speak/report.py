"""The speak step's two charts in report.html, drawn in the one report style (voice_llm.core.report.style) from
audio.json: one playback timeline per strategy, and the TTFA per strategy. Registered as sections in
voice_llm.capabilities.speak.CAPABILITY; the report page resolves them by name and never imports this module's package.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any


from voice_llm.core.report import style
from voice_llm.capabilities.speak.artifact import AUDIO, median_run
from voice_llm.engines.speech_out.segmenting import STRATEGY_LABELS

if TYPE_CHECKING:  # matplotlib is imported when a chart is drawn (style.figure), not with this module
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

def _strategies(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    """audio.json's strategies, each with at least one run; an empty step is "no data", not a malformed file."""
    strategies = doc["strategies"]
    if not isinstance(strategies, Mapping):
        raise TypeError(f"'strategies' should be a JSON object, got {type(strategies).__name__}")
    if not strategies:
        raise style.NoDataError(f"{AUDIO} has no strategy: the speak step saved no run")
    empty = [name for name, entry in strategies.items() if not entry["runs"]]
    if empty:
        raise style.NoDataError(f"{AUDIO}: strategy {', '.join(empty)} has no run")
    return strategies


def _summary_value(summary: Mapping[str, Any], key: str, stat: str, strategy: str) -> float:
    found = summary[key]
    return style.number(found, stat, f"{AUDIO} {strategy} summary {key}")


# --- charts --------------------------------------------------------------------------------------------------


def _lane(ax: Axes, y: float, spans: Sequence[tuple[float, float]], colors: Sequence[str], height: float = 0.6) -> None:
    if spans:
        ax.broken_barh([(start, max(end - start, 0.0)) for start, end in spans], (y - height / 2, height),
                       facecolors=list(colors), edgecolor="white", linewidth=0.5)


def _timeline_axes(ax: Axes, strategy: str, run: Mapping[str, Any]) -> None:
    segments = run["segments"]
    palette = [style.BLUE, style.PURPLE]
    shade = [palette[s["index"] % 2] for s in segments]
    chunks = [c["t_ms"] for c in run["chunks"]]
    ax.plot(chunks, [3] * len(chunks), "|", color=style.GREY, markersize=7)
    ax.plot([s["text_ready_ms"] for s in segments], [3] * len(segments), "v", color=style.ORANGE, markersize=7)
    _lane(ax, 2, [(s["synth_start_ms"], s["synth_end_ms"]) for s in segments], shade)
    colors = {s["index"]: shade[i] for i, s in enumerate(segments)}
    _lane(ax, 1, [(p["start_ms"], p["end_ms"]) for p in run["played"]], [colors[p["segment"]] for p in run["played"]])
    _lane(ax, 1, [(s["at_ms"], s["at_ms"] + s["ms"]) for s in run["stalls"]], [style.RED] * len(run["stalls"]), 0.9)
    ax.axvline(run["ttft_ms"], color=style.BLUE, linestyle=":", linewidth=1.2)
    ax.axvline(run["ttfa_ms"], color=style.GREEN, linestyle="-", linewidth=1.6)
    ax.set_yticks([1, 2, 3], ["playback", "synthesis", "text"])
    ax.set_ylim(0.4, 3.6)
    stalls = f"{run['stall_count']} stalls, {style.ms(run['stall_ms'])} ms" if run["stall_count"] else "no stall"
    ax.set_title(f"{STRATEGY_LABELS.get(strategy, strategy)}: first audio {style.ms(run['ttfa_ms'])} ms, {stalls}, "
                 f"end heard {style.ms(run['end_ms'])} ms (run {run['run']})", loc="left")


def timeline_chart(data: Any) -> style.Chart:
    """One timeline per strategy (its median-TTFA run): chunks arriving and segments complete (text), each
    segment's synthesis, and what the caller hears (playback, stalls in red)."""
    doc = style.mapping(data, AUDIO)
    strategies = _strategies(doc)
    for name, entry in strategies.items():  # the times drawn: a null or NaN is "no data", not a crash
        for index, run in enumerate(entry["runs"]):
            style.number(run, "ttfa_ms", f"{AUDIO} {name} runs[{index}]")
        run = entry["runs"][median_run(entry["runs"])]
        for key in ("ttft_ms", "end_ms"):
            style.number(run, key, f"{AUDIO} {name} run {run.get('run')}")
    fig = style.figure((10.0, 1.55 * len(strategies) + 0.6))
    axes = fig.subplots(len(strategies), 1, sharex=True, squeeze=False)[:, 0]
    end = 0.0
    for ax, (strategy, entry) in zip(axes, strategies.items()):
        run = entry["runs"][median_run(entry["runs"])]
        _timeline_axes(ax, strategy, run)
        end = max(end, run["end_ms"])
    axes[-1].set_xlim(0, max(end, 1.0) * 1.02)
    axes[-1].set_xlabel(style.TIME_AXIS)
    caption = (
        "Per strategy, its median run: grey ticks are chunks arriving, orange triangles the moments a segment's "
        "text was complete, the middle lane each segment's synthesis, the bottom lane what the caller hears "
        "(segments alternate blue and purple; red is a stall, silence after the first sound). Dotted: first token; "
        f"green: first audio. Engine {doc['engine']}, {doc['sample_rate']} Hz; {doc['playback_model']}."
    )
    return style.Chart(fig, caption)


def ttfa_chart(data: Any) -> style.Chart:
    """TTFA per strategy (median, min-max whiskers) beside the time its first segment's text was complete."""
    doc = style.mapping(data, AUDIO)
    found = _strategies(doc)
    strategies = list(found)
    summaries = {s: found[s]["summary"] for s in strategies}
    value = lambda s, key, stat: _summary_value(summaries[s], key, stat, s)  # noqa: E731
    ttfa = [value(s, "ttfa_ms", "median") for s in strategies]
    text = [value(s, "first_text_ms", "median") for s in strategies]
    low = [value(s, "ttfa_ms", "median") - value(s, "ttfa_ms", "min") for s in strategies]
    high = [value(s, "ttfa_ms", "max") - value(s, "ttfa_ms", "median") for s in strategies]
    ttft = min(value(s, "ttft_ms", "median") for s in strategies)
    fig = style.figure(style.WIDE)
    ax = fig.add_subplot()
    x = list(range(len(strategies)))
    ready = ax.bar([i - 0.2 for i in x], text, width=0.4, color=style.ORANGE, label="first segment's text complete")
    heard = ax.bar([i + 0.2 for i in x], ttfa, width=0.4, color=style.GREEN, label="first audio (TTFA)",
                   yerr=[low, high], capsize=4, ecolor=style.GREY)
    for bars, values in ((ready, text), (heard, ttfa)):
        ax.bar_label(bars, labels=[f"{style.ms(v)} ms" for v in values], padding=2, fontsize=9)
    ax.axhline(ttft, color=style.BLUE, linestyle=":", label=f"first token: {style.ms(ttft)} ms")
    ax.set_xticks(x, [STRATEGY_LABELS.get(s, s) for s in strategies])
    ax.set_ylabel("time (ms)")
    ax.set_ylim(0, max(1.0, *(a + b for a, b in zip(ttfa, high))) * 1.25)  # never a zero-height axis
    ax.legend(loc="upper right")
    best = strategies[ttfa.index(min(ttfa))]
    caption = (
        f"Medians of {doc['repeat']} runs per strategy (whiskers: min to max). The caller hears the first sound "
        f"earliest with '{STRATEGY_LABELS.get(best, best)}' ({style.ms(min(ttfa))} ms); waiting for the whole answer "
        f"takes {style.ms(ttfa[strategies.index('whole')])} ms. The gap between a pair of bars is the synthesis of "
        "the first segment while the answer was still streaming."
    ) if "whole" in strategies else f"Medians of {doc['repeat']} runs per strategy."
    return style.Chart(fig, caption)
