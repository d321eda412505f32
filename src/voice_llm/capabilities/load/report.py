"""The report.html section of `load` (callers x slots, the verdict) and load's section of compare.html.

report.html (``load_section``, registered in voice_llm.capabilities.load.CAPABILITY): two charts, each with a caption saying
what it shows and why it matters: the judged metric (the heard gap of dialing callers, else the first sentence)
p50/p90 per step against its budget beside the goodput per step against its target (``load_chart``), and, when
the agent's spans came (load --dial --otlp-listen), the agent's stage medians per step stacked with the stage that
grew most (``stages_chart``); then the step tables. compare.html (``compare_section``, registered as load's
compare section): what voice_llm.capabilities.load.compare returned, both runs per step side by side. Drawn in the one report
style (voice_llm.core.report.style): its palette, its ms formatting.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any


from voice_llm.core.analysis.keynumbers import Headline
from voice_llm.core.errors import ArtifactError
from voice_llm.capabilities.load.doc import judged_on
from voice_llm.capabilities.load.stats import AGENT_STAGES, MIN_JUDGED_TURNS, STAGE_GROWTH_MIN_MS, STAGE_LABELS, callers_text, largest_stage_words, slots_label
from voice_llm.core.report import style
from voice_llm.core.report.style import GREY, RED, SERIES, mapping
from voice_llm.core.util.artifacts import LOAD

if TYPE_CHECKING:  # matplotlib is imported when a chart is drawn (style.figure), not with this module
    from matplotlib.figure import Figure

    from voice_llm.core.run.folder import RunFolder


def headline(folder: RunFolder) -> Headline | None:
    """The caller's number of a dialing sweep (registered as ``headline=``): the heard gap of its first step that
    heard any reply (the fewest callers, 1 by default), with how many turns it rests on; the report opens with it.
    None for a folder without load.json or with a text sweep (no caller's ear there)."""
    if not folder.is_file(LOAD):
        return None
    try:
        doc = mapping(folder.json(LOAD), LOAD)
    except ArtifactError as exc:
        return Headline(LOAD, missing=f"cannot be read: {exc}")
    if not judged_on(doc).dialing:
        return None
    for sweep in doc.get("sweeps") or []:
        for step in (sweep or {}).get("steps") or []:
            heard = (step or {}).get("heard_gap_ms") or {}
            if isinstance(heard.get("p50"), (int, float)):
                callers = step.get("callers")
                return Headline(LOAD, float(heard["p50"]),
                                float(heard["p90"]) if isinstance(heard.get("p90"), (int, float)) else None,
                                where=f"at {callers} caller{'' if callers == 1 else 's'}, over "
                                      f"{step.get('judged')} judged turns of the dialing sweep")
    return Headline(LOAD, missing="was not measured: no step of the dialing sweep in load.json heard a reply")


def load_section(doc: Any) -> str:
    """report.html's load section, from load.json: the judged metric and goodput per step (one chart), the agent's
    stage times per step (a second chart, when its spans came), each with its own caption, then the tables."""
    doc = mapping(doc, LOAD)
    fig, caption, tables = load_chart(doc)
    charts = [("load", style.Chart(fig, caption))]
    stages = stages_chart(doc)
    if stages is not None:
        charts.append(("loadstages", style.Chart(*stages)))
    elif judged_on(doc).dialing:
        tables = f'<p class="notrun">{html.escape(no_stages_reason(doc))}</p>\n' + tables
    last_name, last = charts[-1]
    charts[-1] = (last_name, style.Chart(last.figure, last.caption, tables))  # the tables after the last chart
    return style.charts_section_html("load", section_title(doc), charts)


def section_title(doc: Mapping[str, Any]) -> str:
    """The section's title names what the turns are judged on (the heard gap of dialing callers, else the first
    sentence)."""
    return f"Calls under load: how many callers within the {_judged_on(doc)[2]} budget"


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
            f"{callers_text(grew['callers'])} (+{grew['growth_ms']:.0f} ms)")


def _verdict_words(sweep: Mapping[str, Any]) -> str:
    verdict = sweep["verdict"]
    if verdict.get("max_callers") is None:
        return (f"{_sweep_label(sweep)}: no verdict (fewer than {verdict.get('min_judged_turns', '?')} judged turns "
                f"in every step){_grew(verdict)}")
    limit = f" (limited by {verdict['limited_by']})" if verdict.get("limited_by") else ""
    limit += _grew(verdict)
    if verdict["max_callers"] == 0 and not verdict.get("saturating_stage"):
        limit += largest_stage_words(sweep.get("steps") or [])
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
    """The metric the turns are judged on, its budget and its name (LoadDoc.judged_on)."""
    judged = judged_on(doc)
    if judged.slo_ms is None:
        raise ArtifactError(f"{LOAD} has no {judged.budget_key}: no budget to draw")
    return judged.metric, judged.slo_ms, judged.name


def callers_axis(ax: Any, callers: Sequence[int]) -> None:
    """The callers on x: a doubling sweep (1, 2, 4, 8) on a log2 axis, so each step is one width; steps of one
    more caller (1, 2, 3, ...: the dialing sweep) on a plain one."""
    ticks = sorted(set(callers))
    doubling = len(ticks) >= 3 and all(b >= 2 * a for a, b in zip(ticks, ticks[1:]))
    if doubling:
        ax.set_xscale("log", base=2)
        # Explicit limits: a log axis whose lines have gaps (a step without a first sentence) has no data limits.
        ax.set_xlim(ticks[0] / 1.4, ticks[-1] * 1.4)
    else:
        ax.set_xlim(ticks[0] - 0.5, ticks[-1] + 0.5)
    ax.set_xticks(ticks, [str(c) for c in ticks])
    ax.set_xlabel("concurrent callers")


def time_scale(ax: Any, shown: Sequence[float], slo: float) -> None:
    """A log time axis when the times span more than 20x (a budget of 1 s and an overloaded step of minutes on one
    readable axis), else linear from 0."""
    if max([*shown, slo]) > 20 * min([*shown, slo]):
        from matplotlib.ticker import FuncFormatter

        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: style.ms(value)))  # 1,000 ms, not 10^3
    else:
        ax.set_ylim(bottom=0)


def _why_caption(doc: Mapping[str, Any], what: str, slo: float, target: float) -> str:
    """What the chart shows and why it matters, in the words of the rule (docs/load.md "Calls under load")."""
    judged = ("the gap each caller heard, from the end of their speech to the first sound of the reply, at their ear"
              if judged_on(doc).dialing else
              "the time to the first whole sentence (when a voice assistant could start speaking)")
    return (f"Left: per step, {judged}: p50 (dashed) and p90 (solid) against the {slo:.0f} ms budget (dotted). "
            f"Right: goodput, the share of judged turns within the budget (an error or refused call counts as a "
            f"miss), against the {100 * target:.0f} % target. Why it matters: the verdict is the most callers whose "
            f"goodput holds the target on at least {doc.get('min_judged_turns', MIN_JUDGED_TURNS)} judged turns; the "
            f"step where the p90 crosses the budget is where callers start to wait.")


def load_chart(doc: Mapping[str, Any]) -> tuple[Figure, str, str]:
    """The judged metric's p50/p90 and the goodput per step, each sweep a colour; (figure, caption, tables)."""
    metric, slo, what = _judged_on(doc)
    target = float(doc["goodput_target"])
    drawn = [sweep for sweep in doc["sweeps"] if no_data_reason(sweep) is None]
    fig = style.figure(style.WIDE)
    left, right = fig.subplots(1, 2)
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
        for ax in (left, right):
            callers_axis(ax, sorted(all_callers))
            ax.legend(loc="best", fontsize=8)
        left.set_ylabel(f"{what} (ms)")
        time_scale(left, shown, slo)
        right.set_ylabel("goodput (% of turns within budget)")
        right.set_ylim(0, 105)
    verdicts = "; ".join(_verdict_words(s) for s in doc["sweeps"]) or "no sweep"
    caller = doc.get("caller", {})
    ended = f" The run ended early: {doc['interrupted']}." if doc.get("interrupted") else ""
    why = f" {_why_caption(doc, what, slo, target)}" if drawn and shown else ""
    if judged_on(doc).dialing:
        caption = (f"{verdicts}. Each caller dials the agent at {doc.get('dial_url')}: {caller.get('turns', '?')}-line "
                   f"calls in real time (voice-llm dial), one after another; the heard gap is measured at the "
                   f"caller's ear, from the end of their speech to the first sound heard. Steps of {doc['step_s']:g} s "
                   f"measured after {doc['warmup_s']:g} s warm-up.{why}{ended}")
        return fig, caption, _load_tables(doc)
    caption = (f"{verdicts}. Each caller runs the {caller.get('dialogue', '?')} call with {caller.get('docs', '?')} "
               f"documents, thinking between turns as long as speaking takes; {style.percent(caller.get('barge_in_share'))} of "
               f"turns are barged in. Steps of {doc['step_s']:g} s measured after {doc['warmup_s']:g} s warm-up.{why}{ended}")
    return fig, caption, _load_tables(doc)


# One colour per agent stage (the report palette, then its lighter shades for the last ones).
_STAGE_COLORS = (*SERIES[:5], GREY, "#bbbbbb")


def _timed_sweep(doc: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The sweep whose steps have the agent's stage times (dialing callers with --otlp-listen), or None."""
    drawn = [sweep for sweep in doc.get("sweeps") or [] if no_data_reason(sweep) is None]
    return next((sw for sw in drawn if any(s.get("agent_stage_turns") for s in sw["steps"])), None)


def stages_chart(doc: Mapping[str, Any]) -> tuple[Figure, str] | None:
    """The agent's own stage times per step, stacked (figure, caption); None when no step has them (text callers,
    or an agent whose spans did not come)."""
    sweep = _timed_sweep(doc)
    if sweep is None:
        return None
    fig = style.figure(style.WIDE)
    ax = fig.add_subplot()
    _draw_stages(ax, sweep)
    steps = [s for s in sweep["steps"] if s.get("agent_stage_turns")]
    grew = (sweep.get("verdict") or {}).get("saturating_stage")
    found = (f"{STAGE_LABELS.get(grew['stage'], grew['stage'])} grew most, by {grew['growth_ms']:.0f} ms at "
             f"{callers_text(grew['callers'])}" if grew else
             f"no stage grew by more than {STAGE_GROWTH_MIN_MS:.0f} ms" if len(steps) > 1 else
             "one step has them, so no stage can be seen to grow")
    caption = (f"The agent's own time per stage of a turn, from its VAD's speech end to its first audio sent (the "
               f"median of each stage over the turns of a step whose spans reached load's receiver; bars stacked in "
               f"the order the stages happen): {found}. Why it matters: the heard gap says when callers wait, this "
               f"says where: the band that widens with the callers is the stage that saturates first (the one to "
               f"give more cores, a smaller model or a second instance). The agent's stages start at its VAD's "
               f"speech end, so their sum is less than the heard gap by the line's and the playout's delays.")
    return fig, caption


def no_stages_reason(doc: Mapping[str, Any]) -> str:
    """Why a dialing sweep has no chart of the agent's stages."""
    spans = (doc.get("caller") or {}).get("agent_spans")
    if not isinstance(spans, Mapping):
        return ("The agent's stage times are not drawn: load received no spans (start the agent with --otlp "
                "http://HOST:PORT and load with --otlp-listen HOST:PORT to see which stage saturates).")
    matched = spans.get("turns_matched") or 0
    if not spans.get("spans"):
        return (f"The agent's stage times are not drawn: load listened on {spans.get('listen')} but the agent sent "
                "no span there.")
    return (f"The agent's stage times are not drawn: {matched} turns matched the agent's spans, none with "
            "voice-llm's stage breakdown (an agent such as pipecat reports one latency per turn, not its stages).")


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
    for i, total in enumerate(bottom):
        ax.annotate(f"{style.ms(total)} ms", (i, total), textcoords="offset points", xytext=(0, 3), ha="center",
                    fontsize=8)
    ax.set_xticks(x, [f"{s['callers']}\n({s['agent_stage_turns']} turns)" for s in steps])
    ax.set_xlim(-0.6, len(steps) - 0.4 + 1.2)  # room on the right for the legend
    ax.set_xlabel("concurrent callers (turns with the agent's spans)")
    ax.set_ylabel("the agent's stage medians (ms)")
    ax.set_ylim(0, max(bottom + [1.0]) * 1.15)
    grew = (sweep.get("verdict") or {}).get("saturating_stage")
    if grew:
        ax.set_title(f"grew most: {STAGE_LABELS.get(grew['stage'], grew['stage'])} "
                     f"(+{grew['growth_ms']:.0f} ms at {callers_text(grew['callers'])})", fontsize=9)
    ax.legend(loc="upper right", fontsize=8)


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
    dial = judged_on(doc).dialing
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


# --- compare.html: two load runs ----------------------------------------------------------------------------

A_COLOR, B_COLOR = SERIES[0], SERIES[1]  # compare.html's colours of run A and run B (its spread chart's)


def _holds(verdict: Mapping[str, Any] | None) -> int | None:
    found = (verdict or {}).get("max_callers")
    return found if isinstance(found, int) and not isinstance(found, bool) else None


def holds_more(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> str:
    """Which of the two runs holds more callers, in words (a run without a verdict holds no number)."""
    held_a, held_b = _holds(a), _holds(b)
    if held_a is None and held_b is None:
        return "neither run has a verdict (no step with enough judged turns), so neither holds a number of callers"
    if held_b is None:
        return f"only A has a verdict: A holds {held_a} callers, B no verdict"
    if held_a is None:
        return f"only B has a verdict: B holds {held_b} callers, A no verdict"
    if held_a == held_b:
        return f"both hold {held_a} callers"
    more, fewer = ("A", "B") if held_a > held_b else ("B", "A")
    return f"{more} holds more callers: {max(held_a, held_b)} against {min(held_a, held_b)} in {fewer}"


def _verdict_cell(verdict: Mapping[str, Any] | None) -> list[str]:
    verdict = verdict or {}
    grew = verdict.get("saturating_stage")
    return ["no verdict" if _holds(verdict) is None else str(verdict["max_callers"]),
            str(verdict.get("tested_up_to", "–")), str(verdict.get("limited_by") or "–"),
            (f"{STAGE_LABELS.get(grew['stage'], grew['stage'])} at {callers_text(grew['callers'])} "
             f"(+{grew['growth_ms']:.0f} ms)") if grew else "–"]


def _draw_side_by_side(time_ax: Any, good_ax: Any, entry: Mapping[str, Any], slo: float, target: float,
                       what: str) -> list[float]:
    """A's and B's bars per step (callers): p90 light with p50 solid inside it, and the goodput; the times drawn."""
    steps = {"A": {s["callers"]: s for s in entry.get("steps_a") or []},
             "B": {s["callers"]: s for s in entry.get("steps_b") or []}}
    callers = sorted(set(steps["A"]) | set(steps["B"]))
    x = list(range(len(callers)))
    shown: list[float] = []
    for offset, (run, color) in zip((-0.2, 0.2), (("A", A_COLOR), ("B", B_COLOR))):
        at = [i + offset for i, c in enumerate(callers) if c in steps[run]]
        rows = [steps[run][c] for c in callers if c in steps[run]]
        p90 = [r["p90"] if r["p90"] is not None else 0.0 for r in rows]
        p50 = [r["p50"] if r["p50"] is not None else 0.0 for r in rows]
        shown += [v for r in rows for v in (r["p50"], r["p90"]) if v]
        time_ax.bar(at, p90, width=0.38, color=color, alpha=0.35, label=f"{run}: p90")
        time_ax.bar(at, p50, width=0.38, color=color, label=f"{run}: p50")
        good = [100 * r["goodput"] if r["goodput"] is not None else 0.0 for r in rows]
        good_ax.bar(at, good, width=0.38, color=color, label=run)
        # the share over each bar, inside the top of a full one (above it would leave the axes); none says "–"
        for position, value, row in zip(at, good, rows):
            good_ax.annotate("–" if row["goodput"] is None else f"{value:.0f}", (position, min(value, 90.0)),
                             textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8,
                             color="white" if value > 90 else GREY)
        for position, row in zip(at, rows):
            if row["p90"] is None:  # a step with no timed turn (every call refused): said, not drawn as 0 ms
                time_ax.annotate("no timed\nturn", (position, 0), textcoords="offset points", xytext=(0, 4),
                                 ha="center", fontsize=7, color=GREY)
    labels = [str(c) for c in callers]
    for ax in (time_ax, good_ax):
        ax.set_xticks(x, labels)
        ax.set_xlabel("concurrent callers")
    time_ax.axhline(slo, color=RED, linestyle=":", label=f"budget {slo:.0f} ms")
    good_ax.axhline(100 * target, color=RED, linestyle=":", label=f"target {100 * target:.0f} %")
    time_ax.set_ylabel(f"{what} (ms)")
    if shown:
        time_scale(time_ax, shown, slo)
    else:
        time_ax.set_ylim(0, slo * 1.3)
    good_ax.set_ylabel("goodput (%)")
    good_ax.set_ylim(0, 100)
    # the legends above the axes: inside, they would cover a bar of a full step or a tall one
    time_ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.01), fontsize=8, ncols=3, frameon=False)
    good_ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.01), fontsize=8, ncols=3, frameon=False)
    name = entry.get("sweep")
    if name and name != "the agent":
        good_ax.text(1.0, 1.0, str(name), transform=good_ax.transAxes, ha="right", va="top", fontsize=9)
    return shown


def compare_section(result: Mapping[str, Any]) -> str:
    """compare.html's load section from what voice_llm.capabilities.load.compare returned: per sweep, both runs' p50/p90 and
    goodput per step side by side against the budget and the target, the two verdicts and which run holds more
    callers, then the steps both measured with compare's significance rule."""
    result = mapping(result, "load's comparison")
    what = str(result.get("what") or "judged time")
    title = f"Calls under load, B against A: how many callers within the {what} budget"
    entries = [e for e in result.get("verdicts") or [] if e.get("steps_a") is not None]
    lines = [str(line) for line in result.get("lines") or []]
    if not entries:  # not compared step by step (other budgets, an unreadable load.json): its line says why
        return style.missing_section_html("load", title, "; ".join(lines) or "no sweep measured in both runs",
                                          "not compared")
    slo, target = float(result["slo_ms"]), float(result["goodput_target"])
    fig = style.figure((style.WIDE[0], 3.4 * len(entries)))
    axes = fig.subplots(len(entries), 2, squeeze=False)
    for (time_ax, good_ax), entry in zip(axes, entries):
        _draw_side_by_side(time_ax, good_ax, entry, slo, target, what)
    held = "; ".join(f"{e['sweep']}: {holds_more(e.get('a'), e.get('b'))}" if len(entries) > 1 or
                     e.get("sweep") != "the agent" else holds_more(e.get("a"), e.get("b")) for e in entries)
    judged = ("the gap each caller heard at their ear" if result.get("mode") == "dial"
              else "the time to the first whole sentence")
    caption = (f"{held[0].upper()}{held[1:]}. Left: per step, {judged}, p50 (solid) inside p90 (light), run A blue "
               f"and run B orange, against the {slo:.0f} ms budget (dotted); right: each step's goodput (turns within "
               f"the budget) against the {100 * target:.0f} % target. Why it matters: a run holds a step while its "
               f"goodput stays over the target on enough judged turns, so where one run's bars cross the lines at "
               f"fewer callers, that stack holds fewer callers.")
    dial = result.get("mode") == "dial"  # only an agent has stages (text callers ask the LLM server alone)
    verdict_rows = [[f"{e['sweep']}, {run}", *_verdict_cell(e.get(run.lower()))[:None if dial else 3]]
                    for e in entries for run in ("A", "B")]
    extra = style.table(["run", "max callers", "tested up to", "limited by",
                         *(["the agent's stage that grew most"] if dial else [])], verdict_rows, "load-verdicts")
    step_rows = []
    for row in result.get("steps") or []:
        a, b = row["a"], row["b"]
        sig = {True: "significant", False: "within the noise", None: "cannot tell"}[row.get("significant")]
        if row.get("test"):
            sig += f" ({row['test']}, p={row['p_value']:.3g})" if row.get("p_value") is not None else f" ({row['test']})"
        step_rows.append([str(row["sweep"]), str(row["callers"]), f"{style.ms(a['p50'])}/{style.ms(a['p90'])}",
                          f"{style.ms(b['p50'])}/{style.ms(b['p90'])}", style.percent(a["goodput"]),
                          style.percent(b["goodput"]), f"{a['judged']} / {b['judged']}", sig])
    if step_rows:
        extra += (f"<p>The steps both runs measured (the {html.escape(what)} median compared with compare's rule: "
                  "the rank test from five turns a side, else the ranges):</p>\n"
                  + style.table(["sweep", "callers", f"A {what} p50/p90 (ms)", f"B {what} p50/p90 (ms)", "A goodput",
                                 "B goodput", "judged turns A / B", "B's median against A's"], step_rows,
                                "load-compare"))
    extra += ("<details><summary>in words</summary>\n<ul>\n"
              + "".join(f"<li>{html.escape(line)}</li>\n" for line in lines) + "</ul>\n</details>\n")
    return style.chart_section_html("load", title, style.Chart(fig, caption, extra))
