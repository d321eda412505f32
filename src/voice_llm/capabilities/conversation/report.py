"""report.html's section of `call`: one caller's six turns, first token and first sentence, cache on and off.

``call_section`` (registered in voice_llm.capabilities.conversation.CAPABILITY) takes the parsed call.json and returns a style.Chart,
drawn in the one report style (voice_llm.core.report.style): its palette, its ms formatting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from voice_llm.core.report import style
from voice_llm.core.report.style import BLUE, GREY, WIDE, mapping
from voice_llm.core.util import stats
from voice_llm.core.util.artifacts import CALL

if TYPE_CHECKING:  # matplotlib is imported when a chart is drawn (style.figure), not with this module
    from matplotlib.figure import Figure


def call_section(doc: Any) -> style.Chart:
    """report.html's call section, from call.json."""
    return style.Chart(*call_chart(mapping(doc, CALL)))


def call_chart(doc: Mapping[str, Any]) -> tuple[Figure, str, str]:
    on, off = doc["cache_on"], doc["cache_off"]
    turns = [row["turn"] for row in on]
    fig = style.figure(WIDE)
    ax = fig.add_subplot()
    for rows, label, color in ((off, "cache off", GREY), (on, "cache on", BLUE)):
        ax.plot(turns, [r["ttft_ms"] for r in rows], "o-", color=color, label=f"first token, {label}")
        ax.plot(turns, [r["first_sentence_ms"] if r["first_sentence_ms"] is not None else r["total_ms"] for r in rows],
                "s--", color=color, alpha=0.6, label=f"first sentence, {label}")
    ax.set_xticks(turns)
    ax.set_xlabel("turn of the call")
    ax.set_ylabel("ms after the request")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left")
    later_on = [r["ttft_ms"] for r in on[1:]]
    later_off = [r["ttft_ms"] for r in off[1:]]
    grew = (f"the prompt grew from {off[0]['prompt_n']} to {off[-1]['prompt_n']} tokens"
            if off[0]["prompt_n"] is not None and off[-1]["prompt_n"] is not None
            else "the server did not say its prompt tokens (no timings)")
    caption = (
        f"{len(turns)} turns with {len(doc['docs'])} documents in the system prompt; {grew}. Turn 1 is a miss in "
        f"both runs. Turns 2–{len(turns)}: "
        f"first token {style.ms(stats.median(later_on))} ms (median) with the cache, "
        f"{style.ms(stats.median(later_off))} ms without — the cache keeps each turn close to a short prompt "
        "only if the conversation is sent back unchanged."
    ) if len(turns) > 1 else f"one turn: first token {style.ms(on[0]['ttft_ms'])} ms with the cache."
    rows = [[str(a["turn"]), a["user"], style.ms(a["ttft_ms"]), style.ms(a["first_sentence_ms"]), f"{_count(a['prompt_n'])} + {_count(a['cache_n'])}",
             style.ms(b["ttft_ms"]), style.ms(b["first_sentence_ms"]), _count(b["prompt_n"])] for a, b in zip(on, off)]
    extra = style.table(["turn", "caller says", "ttft on", "1st sentence on", "prefilled + cached on", "ttft off",
                    "1st sentence off", "prefilled off"], rows, "call-turns")
    return fig, caption, extra


def _count(value: Any) -> str:
    """A token count, or "not said" when the server reported none (a server without timings: call.json's unknown)."""
    return "not said" if value is None else str(value)
