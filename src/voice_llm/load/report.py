"""The report.html section of `load` (callers x slots, the verdict); call's is voice_llm.call.report's.

The chart takes the parsed artifact and returns (figure, caption, extra HTML); ``load_section`` (registered in
voice_llm.load.CAPABILITY) gives report.html the same as a style.Chart. Drawn in the one report style
(voice_llm.report.style): its palette, its ms formatting.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any


from voice_llm.load.stats import AGENT_STAGES, STAGE_LABELS, slots_label
from voice_llm.report import style
from voice_llm.report.style import GREY, RED, SERIES, mapping
from voice_llm.util.artifacts import LOAD

if TYPE_CHECKING:  # matplotlib is imported when a chart is drawn (style.figure), not with this module
    from matplotlib.figure import Figure


def load_section(doc: Any) -> style.Chart:
    """report.html's load section, from load.json."""
    return style.Chart(*load_chart(mapping(doc, LOAD)))


# --- load -----------------------------------------------------------------------------------------------------


def _sweep_label(sweep: Mapping[str, Any]) -> str:
    if str(sweep.get("url") or "").startswith(("ws://", "wss://")):  # dialing callers: the agent is measured
        return "the agent"
    return slots_label(sweep.get("slots"))


def no_data_reason(sweep: Mapping[str, Any]) -> str | None:
    """Why a sweep has nothing to draw (no step, no turn, or every turn failed), or None when it has data. An
    empty step is a result (the window was too short for a turn, or the server refused every turn): it is shown
    as such, never drawn as a line of nothing."""
    steps = sweep.get("steps") or []
    ended = f" ({sweep['interrupted']})" if sweep.get("interrupted") else ""
    if not steps:
        return f"no step was measured{ended}"
    if not any(s.get("turns") for s in steps):
        return (f"no turn started in any measured window (steps of {len(steps)}; the first turn's prefill and the "
                f"callers' think time can be longer than a short --step-s){ended}")
    if all(s.get("errors") == s.get("turns") for s in steps):
        return (f"all {sum(s['turns'] for s in steps)} measured turns failed (the error of each is in "
                f"load_samples.csv){ended}")
    return None


def _grew(verdict: Mapping[str, Any]) -> str:
    grew = verdict.get("saturating_stage")
    if not grew:
        return ""
    return (f"; the agent's stage that grew most: {STAGE_LABELS.get(grew['stage'], grew['stage'])} at "
            f"{grew['callers']} callers (+{grew['growth_ms']:.0f} ms)")


def _verdict_words(sweep: Mapping[str, Any]) -> str:
    verdict = sweep["verdict"]
    if verdict.get("max_callers") is None:
        return (f"{_sweep_label(sweep)}: no verdict (fewer than {verdict.get('min_judged_turns', '?')} judged turns "
                f"in every step){_grew(verdict)}")
    limit = f" (limited by {verdict['limited_by']})" if verdict.get("limited_by") else ""
    limit += _grew(verdict)
    rests = f", on {verdict['judged_turns']} judged turns" if verdict.get("judged_turns") is not None else ""
    return f"{_sweep_label(sweep)}: max callers = {verdict['max_callers']}{rests}{limit}"


def _max_callers(sweep: Mapping[str, Any]) -> str:
    """The legend's verdict: a number, or "no verdict" (never "max callers None") when no step had enough turns."""
    found = sweep["verdict"].get("max_callers")
    return "no verdict" if found is None else f"max callers {found}"


def _no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes, color=GREY)
    ax.set_xticks([])
    ax.set_yticks([])


def _judged_on(doc: Mapping[str, Any]) -> tuple[str, float, str]:
    """The metric the turns are judged on, its budget and its name: the heard gap of dialing callers (mode dial),
    else the first sentence."""
    if doc.get("mode") == "dial":
        return "heard_gap_ms", float(doc["slo_heard_ms"]), "heard gap"
    return "first_sentence_ms", float(doc["slo_first_sentence_ms"]), "first sentence"


def load_chart(doc: Mapping[str, Any]) -> tuple[Figure, str, str]:
    metric, slo, what = _judged_on(doc)
    target = float(doc["goodput_target"])
    drawn = [sweep for sweep in doc["sweeps"] if no_data_reason(sweep) is None]
    timed = next((sw for sw in drawn if any(s.get("agent_stage_turns") for s in sw["steps"])), None)
    fig = style.figure((15.0, 4.0) if timed is not None else (10.0, 4.0))
    left, right, *third = fig.subplots(1, 3 if timed is not None else 2)
    if timed is not None:
        _draw_stages(third[0], timed)
    all_callers: set[int] = set()
    for color, sweep in zip(SERIES, drawn):
        steps = sweep["steps"]
        callers = [s["callers"] for s in steps]
        all_callers.update(callers)
        label = _sweep_label(sweep)
        left.plot(callers, [s[metric]["p90"] for s in steps], "o-", color=color, label=f"{label}: p90")
        left.plot(callers, [s[metric]["p50"] for s in steps], "o--", color=color, alpha=0.6, label=f"{label}: p50")
        right.plot(callers, [100 * s["goodput"] if s["goodput"] is not None else None for s in steps], "o-",
                   color=color, label=f"{label}: {_max_callers(sweep)}")
    shown = [v for sw in drawn for s in sw["steps"] for v in s[metric].values() if v]
    if not drawn or not shown:
        reasons = "; ".join(f"{_sweep_label(sw)}: {no_data_reason(sw) or f'no {what} in any turn'}"
                            for sw in doc["sweeps"]) or "load.json holds no sweep"
        for ax in (left, right):
            _no_data(ax, f"no data\n{reasons}")
    else:
        left.axhline(slo, color=RED, linestyle=":", label=f"budget {slo:.0f} ms")
        right.axhline(100 * target, color=RED, linestyle=":", label=f"goodput target {100 * target:.0f} %")
        ticks = sorted(all_callers)
        for ax in (left, right):
            ax.set_xscale("log", base=2)
            # Explicit limits: a log axis whose lines have gaps (a step without a first sentence) has no data limits.
            ax.set_xlim(ticks[0] / 1.4, ticks[-1] * 1.4)
            ax.set_xticks(ticks, [str(c) for c in ticks])
            ax.set_xlabel("concurrent callers")
            ax.legend(loc="best", fontsize=8)
        left.set_ylabel(f"{what} (ms)")
        if max(shown + [slo]) > 20 * min(shown + [slo]):
            left.set_yscale("log")  # a budget of 1 s and an overloaded step of minutes on one readable axis
        else:
            left.set_ylim(bottom=0)
        right.set_ylabel("goodput (% of turns within budget)")
        right.set_ylim(0, 105)
    verdicts = "; ".join(_verdict_words(s) for s in doc["sweeps"]) or "no sweep"
    caller = doc.get("caller", {})
    ended = f" The run ended early: {doc['interrupted']}." if doc.get("interrupted") else ""
    if doc.get("mode") == "dial":
        caption = (f"{verdicts}. Each caller dials the agent at {doc.get('dial_url')}: {caller.get('turns', '?')}-line "
                   f"calls in real time (voice-llm dial), one after another; the heard gap is measured at the "
                   f"caller's ear, from the end of their speech to the first sound heard. Steps of {doc['step_s']:g} s "
                   f"measured after {doc['warmup_s']:g} s warm-up.{ended}")
        return fig, caption, _load_tables(doc)
    caption = (f"{verdicts}. Each caller runs the {caller.get('dialogue', '?')} call with {caller.get('docs', '?')} "
               f"documents, thinking between turns as long as speaking takes; {style.percent(caller.get('barge_in_share'))} of "
               f"turns are barged in. Steps of {doc['step_s']:g} s measured after {doc['warmup_s']:g} s warm-up.{ended}")
    return fig, caption, _load_tables(doc)


# One colour per agent stage (the report palette, then its lighter shades for the last ones).
_STAGE_COLORS = (*SERIES[:5], GREY, "#bbbbbb")


def _draw_stages(ax: Any, sweep: Mapping[str, Any]) -> None:
    """The agent's own stage times per step (the median of each over the step's turns with spans), stacked in the
    order they happen in a turn: the stage that grows with the callers is the band that widens."""
    steps = [s for s in sweep["steps"] if s.get("agent_stage_turns")]
    x = list(range(len(steps)))
    bottom = [0.0] * len(steps)
    for color, stage in zip(_STAGE_COLORS, AGENT_STAGES):
        values = [s["agent_stages_ms"].get(stage) or 0.0 for s in steps]
        ax.bar(x, values, bottom=bottom, color=color, width=0.6, label=STAGE_LABELS[stage])
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(x, [f"{s['callers']}\n({s['agent_stage_turns']} turns)" for s in steps])
    ax.set_xlabel("concurrent callers")
    ax.set_ylabel("the agent's stage medians (ms, its own spans)")
    ax.set_ylim(bottom=0)
    grew = (sweep.get("verdict") or {}).get("saturating_stage")
    if grew:
        ax.set_title(f"grew most: {STAGE_LABELS.get(grew['stage'], grew['stage'])} "
                     f"(+{grew['growth_ms']:.0f} ms at {grew['callers']} callers)", fontsize=9)
    ax.legend(loc="upper left", fontsize=7)


def _stages_table(sweep: Mapping[str, Any]) -> str:
    """The stage medians per step and each one's growth from the first timed step (ms)."""
    steps = [s for s in sweep["steps"] if s.get("agent_stage_turns")]
    if not steps:
        return ""
    base = steps[0]["agent_stages_ms"]
    rows = []
    for s in steps:
        cells = []
        for stage in AGENT_STAGES:
            value, first = s["agent_stages_ms"].get(stage), base.get(stage)
            grown = "" if s is steps[0] or value is None or first is None else f" ({value - first:+.0f})"
            cells.append(style.ms(value) + grown)
        rows.append([str(s["callers"]), str(s["agent_stage_turns"]), *cells])
    header = ["callers", "turns with spans", *(STAGE_LABELS[stage] for stage in AGENT_STAGES)]
    return ("<p>The agent's own stage times (median per step, from its spans; in brackets the growth from "
            f"{steps[0]['callers']} caller{'' if steps[0]['callers'] == 1 else 's'}, ms):</p>\n"
            + style.table(header, rows, "load-stages"))


_ROLE_LABELS = {"agent": "agent", "server": "LLM server", "workers": "Locust workers + dial calls",
                "master": "Locust master"}


def _processes_table(sweep: Mapping[str, Any]) -> str:
    """Host CPU per process over each step's measured window (load.proccpu): CPU seconds and share of one core."""
    steps = [s for s in sweep["steps"] if isinstance(s.get("processes"), Mapping)]
    if not steps:
        return ""
    roles = [r for r in _ROLE_LABELS if any(r in s["processes"] for s in steps)]

    def cell(row: Any) -> str:
        if not isinstance(row, Mapping) or row.get("cpu_s") is None:
            return "–"
        share = row.get("share")
        return f"{row['cpu_s']:.1f} s" + ("" if share is None else f" ({share:.2f} core)")

    rows = [[str(s["callers"]), f"{s['processes'].get('wall_s', 0):.0f} s",
             *(cell(s["processes"].get(r)) for r in roles)] for s in steps]
    return ("<p>Host CPU per process over each measured window (CPU seconds and share of one core; each a process "
            "tree; load.json's processes_found says which pids and how they were found):</p>\n"
            + style.table(["callers", "window", *(_ROLE_LABELS[r] for r in roles)], rows, "load-cpu"))


def _dial_row(s: Mapping[str, Any]) -> list[str]:
    heard, barge = s["heard_gap_ms"], s.get("barge_ins") or {}
    load = (s.get("host") or {}).get("loadavg_1m")
    late = f"{s['late_frames']} of {s['call_frames']}" + (" generator-bound" if s["generator_bound"] else "")
    errors = "; ".join(f"{n} {why}" for why, n in (s.get("error_reasons") or {}).items()) or "0"
    return [str(s["callers"]), f"{s['turns']} ({s['judged']})",
            f"{style.ms(heard['p50'])}/{style.ms(heard['p90'])}/{style.ms(heard['p99'])}", style.percent(s["goodput"]),
            errors, str(s.get("refused", 0)), late,
            f"{barge.get('honoured', 0)} of {barge.get('n', 0)}", "–" if load is None else f"{load:.2f}"]


def _load_tables(doc: Mapping[str, Any]) -> str:
    dial = doc.get("mode") == "dial"
    header = ["callers", "turns (judged)", "heard gap p50/p90/p99", "goodput", "errors", "refused", "late frames",
              "barge-ins honoured", "host load"] if dial else ["callers", "turns", "ttft p50/p90", "1st sentence p50/p90/p99", "token gap p50", "goodput",
              "good turns/s", "errors", "cancelled", "worker CPU", "host load"]
    parts = []
    for sweep in doc["sweeps"]:
        rows = []
        for s in sweep["steps"]:
            if dial:
                rows.append(_dial_row(s))
                continue
            first, ttft = s["first_sentence_ms"], s["ttft_ms"]
            share = max((w["share"] for w in s["cpu"].values()), default=None)
            cpu = "–" if share is None else f"{100 * share:.0f} %" + (" generator-bound" if s["generator_bound"] else "")
            load = (s.get("host") or {}).get("loadavg_1m")
            rows.append([str(s["callers"]), str(s["turns"]), f"{style.ms(ttft['p50'])}/{style.ms(ttft['p90'])}",
                         f"{style.ms(first['p50'])}/{style.ms(first['p90'])}/{style.ms(first['p99'])}", style.ms(s["itl_ms"]["p50"]),
                         style.percent(s["goodput"]),
                         "–" if s["good_turns_per_s"] is None else f"{s['good_turns_per_s']:.2f}",
                         str(s["errors"]), str(s["cancelled"]), cpu, "–" if load is None else f"{load:.2f}"])
        stopped = f" Stopped: {sweep['stopped']}." if sweep.get("stopped") else ""
        reason = no_data_reason(sweep)
        title = _verdict_words(sweep).replace(": ", " — ", 1)
        body = (f'<p class="missing">no data: {html.escape(reason)}</p>\n' if reason else "") + \
            (style.table(header, rows, "load-steps") if rows else "") + (_stages_table(sweep) + _processes_table(sweep) if dial else "")
        parts.append(f"<h3>{html.escape(title)}</h3><p>{html.escape(stopped)}</p>\n" + body)
    if not parts:
        parts.append(f'<p class="missing">no data: load.json holds no sweep{_ended(doc)}</p>\n')
    return "".join(parts)


def _ended(doc: Mapping[str, Any]) -> str:
    return f" ({doc['interrupted']})" if doc.get("interrupted") else ""
