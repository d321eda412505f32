"""The call as heard, in report.html: what the caller heard on the line, with the agent's own account beside it.

Two sections (registered in voice_llm.capabilities.dial.CAPABILITY after the first-audio chart, where converse's were):

* :func:`heard_chart` (dial.json): per turn the heard gap as a bar on the caller's own timeline (0 = the true end
  of their speech), with the agent's own breakdown underneath (its parts as it reported them, stacked from 0) and
  the line's share after them (heard - reported: transport, the phone's jitter delay, the tick, the agent VAD's lag
  behind the true end), so the two bars end together; a barge-in as the audio still heard after the caller cut in
  (0 = the onset), to the heard silence, with the clear marked. The summary sentence: "the caller hears the
  assistant N ms after they stop talking (median, p90 ...)".
* :func:`waveform_section` (the run folder: dial.json and the recording it names): the stereo waveform of the real
  recording, caller above and heard below, each turn's gap shaded, barge-ins marked, and the gaps measured again
  on the file from its samples alone (voice_llm.capabilities.dial.checks.measure, the checks' own rule).

matplotlib is imported only when a chart is drawn (voice_llm.core.report.style.figure). A missing or malformed file is
the section's "not available" (an ArtifactError), a call with no heard reply its "no data" (NoDataError).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from voice_llm.capabilities.dial import checks
from voice_llm.capabilities.dial.doc import DialDoc, Spread, Turn
from voice_llm.core.errors import ArtifactError
from voice_llm.core.report import style
from voice_llm.core.run.folder import RunFolder
from voice_llm.core.util import stats
from voice_llm.core.util.artifacts import DIAL

if TYPE_CHECKING:  # matplotlib is imported when a chart is drawn (style.figure)
    from matplotlib.axes import Axes

_CALLER_AXIS = "ms after the caller stopped talking (true end of their speech, from the samples sent)"
_BARGE_AXIS = "ms after the caller cut in (true onset of their speech)"
_CALL_AXIS = "call clock (s; 0 = sample 0 of dial/call.wav)"
_ENVELOPE_MS = 10.0  # the waveform drawn as its min..max per 10 ms (moved from converse/report.py)
FULL_SCALE = 32768.0
# The agent's parts in the order they chain (voice-llm's agent: docs/line.md "The agent"); any other part it reports
# is drawn after these, in its own order.
PARTS = (
    ("endpoint_wait", "endpoint wait", style.ORANGE, 1.0),
    ("stt", "STT", style.PURPLE, 1.0),
    ("request_to_first_token", "request -> first token", style.BLUE, 1.0),
    ("first_token_to_first_segment", "first token -> first segment", style.BLUE, 0.45),
    ("segment_to_first_audio", "synthesis of the first segment", style.GREEN, 0.45),
    ("audio_to_sent", "audio -> sent", style.GREEN, 0.7),
)
_OTHER_PART = (style.GREY, 0.6)
_SUM_TOLERANCE_MS = 1.0  # parts that sum to the reported latency within this are stacked as its breakdown


def as_doc(doc: DialDoc | Mapping[str, Any]) -> DialDoc:
    """dial.json as its type: the section is handed the file's document (voice_llm.core.report.page), the waveform the
    folder's parsed value."""
    return doc if isinstance(doc, DialDoc) else DialDoc.parse(doc)


def _spread(doc: DialDoc, key: str) -> Spread | None:
    summary = doc.summary
    if summary is None:
        raise ArtifactError(f"{DIAL} has no summary")
    return {"heard_gap_ms": summary.heard_gap_ms, "heard_minus_reported_ms": summary.heard_minus_reported_ms,
            "barge_in_heard_after_onset_ms": summary.barge_in_heard_after_onset_ms}[key]


def heard_numbers(doc: DialDoc) -> tuple[float, float, int]:
    """(median, p90, turns) of the summary's heard gap."""
    found = _spread(doc, "heard_gap_ms")
    if found is None or found.median is None or found.p90 is None:
        raise style.NoDataError(f"{DIAL} summary heard_gap_ms has no median: no turn's reply was heard")
    return found.median, found.p90, found.n or 0


def talked_over(doc: DialDoc, flag: str = "talked_over") -> int:
    """The turns the heard gap's summary left out as talked over (dial.json's settings.talked_over_rule), or with
    ``flag="late_tick"`` as near a late tick (settings.late_tick_rule); 0 in a dial.json from before they were told
    apart."""
    block = _spread(doc, "heard_gap_ms")
    value = None if block is None else block.talked_over if flag == "talked_over" else block.late_tick
    return value if value is not None and value > 0 else 0


def _median_of(doc: DialDoc, key: str) -> tuple[float | None, int]:
    block = _spread(doc, key)
    if block is None:
        return None, 0
    return block.median, block.n or 0


def summary_sentence(doc: DialDoc) -> str:
    """The section's sentence: what the caller hears, then what the agent says of itself and the line's share."""
    median, p90, n = heard_numbers(doc)
    over, late = talked_over(doc), talked_over(doc, "late_tick")
    left_out = f"; {over} turn{'' if over == 1 else 's'} talked over, left out" if over else ""
    left_out += f"; {late} turn{'' if late == 1 else 's'} near a late tick of the dialer's, left out" if late else ""
    text = (f"The caller hears the assistant {style.ms(median)} ms after they stop talking (median; p90 "
            f"{style.ms(p90)} ms over {n} turn{'' if n == 1 else 's'}{left_out}).")
    share, shared = _median_of(doc, "heard_minus_reported_ms")
    if share is not None:
        text += (f" The agent's own numbers leave out {style.ms(share)} ms of that (median over {shared} "
                 f"turn{'' if shared == 1 else 's'}): the line's share.")
    else:
        text += " The agent's own numbers were not reported, so the line's share is not known."
    barge, barged = _median_of(doc, "barge_in_heard_after_onset_ms")
    if barge is not None:
        text += (f" After cutting in, the caller still heard the assistant for {style.ms(barge)} ms (median over "
                 f"{barged} barge-in{'' if barged == 1 else 's'}).")
    return text


def summary_row_html(doc: DialDoc) -> str:
    median, p90, n = heard_numbers(doc)
    share, _ = _median_of(doc, "heard_minus_reported_ms")
    barge, _ = _median_of(doc, "barge_in_heard_after_onset_ms")
    line = style.table(("heard mouth to ear (median)", "p90", "turns", "line's share (heard - reported)",
                        "barge-in: heard after the onset"),
                       [(f"{style.ms(median)} ms", f"{style.ms(p90)} ms", str(n),
                         "not reported" if share is None else f"{style.ms(share)} ms",
                         "no barge-in" if barge is None else f"{style.ms(barge)} ms")], "facts")
    return line


# --- the heard gaps with the agent's account ---------------------------------------------------------------------


class _Row:
    """One turn's numbers for the chart (validated once)."""

    def __init__(self, turn: Turn) -> None:
        self.index = turn.index
        self.heard = turn.gap_ms is not None  # a turn whose reply was not heard is not drawn
        self.gap = turn.gap_ms if turn.gap_ms is not None else 0.0
        self.reported = turn.reported_ms
        self.parts = list((turn.agent_breakdown or {}).items())
        barge = turn.barge_in
        self.barge: tuple[float | None, float | None, str | None] | None = None
        if barge is not None:
            if barge.onset_ms is None:
                raise ArtifactError(f"{DIAL} turn {turn.index} barge_in has no onset_ms")
            cleared = barge.cleared_ms
            self.barge = (barge.heard_after_onset_ms, None if cleared is None else cleared - barge.onset_ms,
                          barge.words_heard)

    def stacked(self) -> list[tuple[str, float]] | None:
        """The agent's parts when they add up to what it reported (else None: drawn as one bar)."""
        known = [(k, v) for k, v in self.parts if v is not None]
        if self.reported is None or not known or abs(sum(v for _, v in known) - self.reported) > _SUM_TOLERANCE_MS:
            return None
        order = [k for k, *_ in PARTS]
        return sorted(known, key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))


def _rows(doc: DialDoc) -> tuple[list[_Row], list[str]]:
    rows: list[_Row] = []
    silent: list[_Row] = []
    for turn in doc.turns:
        row = _Row(turn)
        (rows if row.heard else silent).append(row)
    if not rows:
        raise style.NoDataError(f"{DIAL}: no turn's reply was heard (turns {', '.join(str(r.index) for r in silent)})")
    return rows, [str(r.index) for r in silent]


def _gap_axes(ax: Axes, rows: Sequence[_Row]) -> float:
    labels = {key: (label, color, alpha) for key, label, color, alpha in PARTS}
    marked: set[str] = set()

    def once(label: str) -> str | None:
        if label in marked:
            return None
        marked.add(label)
        return label

    right = 0.0
    ticks: list[float] = []
    names: list[str] = []
    for i, row in enumerate(rows):
        y = 2 * (len(rows) - i)
        ax.broken_barh([(0, row.gap)], (y - 0.35, 0.7), facecolors=style.RED, alpha=0.85,
                       label=once("heard gap (silence at the caller's ear)"))
        ax.annotate(f"{style.ms(row.gap)} ms", (row.gap, y), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=9)
        ticks.append(y)
        names.append(f"turn {row.index} heard")
        below = y - 0.9
        ticks.append(below)
        names.append("  agent's own")
        if row.reported is None:
            ax.annotate("agent's own numbers not reported", (0, below), va="center", fontsize=8, color=style.GREY)
        else:
            stacked = row.stacked()
            at = 0.0
            for key, value in stacked or [("reported", row.reported)]:
                label, color, alpha = labels.get(key, (key.replace("_", " "), *_OTHER_PART))
                if key == "reported":
                    label, color, alpha = "agent reported (no breakdown adding up to it)", style.BLUE, 0.35
                ax.broken_barh([(at, value)], (below - 0.3, 0.6), facecolors=color, alpha=alpha,
                               edgecolor="white", linewidth=0.5, label=once(label))
                at += value
            share = row.gap - row.reported
            ax.broken_barh([(min(at, at + share), abs(share))], (below - 0.3, 0.6), facecolors="none",
                           edgecolor=style.GREY, hatch="///", linewidth=0.8,
                           label=once("the line's share (heard - reported)"))
            ax.annotate(f"{'+' if share >= 0 else ''}{style.ms(share)} ms line", (max(at, at + share), below),
                        xytext=(4, 0), textcoords="offset points", va="center", fontsize=8, color=style.GREY)
            right = max(right, at)
        right = max(right, row.gap)
    ax.axvline(0, color=style.GREY, linewidth=1)
    ax.set_yticks(ticks, names)
    ax.set_ylim(min(ticks) - 0.8, max(ticks) + 0.8)
    return right


def _barge_axes(ax: Axes, rows: Sequence[_Row]) -> None:
    barged = [r for r in rows if r.barge is not None]
    ticks, names = [], []
    for i, row in enumerate(barged):
        after, cleared, words = row.barge  # type: ignore[misc]
        y = len(barged) - i
        if after is not None:
            ax.broken_barh([(0, after)], (y - 0.3, 0.6), facecolors=style.RED, alpha=0.6,
                           label="heard after the caller cut in" if i == 0 else None)
            ax.annotate(f"{style.ms(after)} ms" + (f" ({words!r} heard)" if words else ""), (after, y), xytext=(4, 0),
                        textcoords="offset points", va="center", fontsize=9)
        if cleared is not None:
            ax.plot([cleared], [y], "|", color=style.GREY, markersize=14, markeredgewidth=2,
                    label="clear received" if i == 0 else None)
        ticks.append(y)
        names.append(f"turn {row.index} barge-in")
    ax.axvline(0, color=style.GREY, linewidth=1)
    ax.set_yticks(ticks, names)
    ax.set_ylim(0.4, len(barged) + 0.6)
    ax.set_xlabel(_BARGE_AXIS)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def heard_chart(raw: DialDoc | Mapping[str, Any]) -> style.Chart:
    """Per turn the heard gap with the agent's own breakdown under it and the line's share; barge-ins below."""
    doc = as_doc(raw)
    rows, silent = _rows(doc)
    barges = [r for r in rows if r.barge is not None]
    height = 0.9 * len(rows) + 2.2 + (0.5 * len(barges) + 1.2 if barges else 0.0)
    fig = style.figure((10.0, height))
    if barges:
        ax, lower = fig.subplots(2, 1, height_ratios=(2 * len(rows) + 1, len(barges) + 1.5))
    else:
        ax, lower = fig.add_subplot(), None
    right = _gap_axes(ax, rows)
    ax.set_xlim(min(0.0, *(r.gap - (r.reported or 0.0) for r in rows)) - 50, right * 1.18 + 50)
    ax.set_xlabel(_CALLER_AXIS)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18 if barges else -0.28), ncol=3, fontsize=8, frameon=False)
    if lower is not None:
        _barge_axes(lower, rows)
    line, summary = doc.line, doc.summary
    conditions = ""
    if line.loss:
        conditions += (f", {line.loss:g} % of frames lost both ways (seed {line.seed}: "
                       f"{line.lost_up_frames} up, {line.lost_down_frames} down)")
    if line.echo_db is not None:
        conditions += f", speakerphone echo at {line.echo_db:g} dB after {line.echo_delay_ms or 0.0:g} ms"
    if summary is not None and summary.false_barge_ins:
        conditions += f"; {summary.false_barge_ins} false barge-in(s): the agent cut its own reply, the caller silent"
    if summary is not None and summary.cut_offs:
        conditions += (f"; {summary.cut_offs} cut-off(s): the agent was heard inside the caller's line "
                       f"({_cut_offs(doc)})")
    elif summary is not None and "cut_offs" not in summary.absent:
        conditions += ("; cut-offs: not measurable (see dial.json unknown)" if summary.cut_offs is None
                       else "; no cut-off (nothing heard inside the caller's speech)")
    url = doc.agent.url if doc.agent is not None and doc.agent.url is not None else "unknown"
    webrtc = line.extra.get("webrtc") if isinstance(line.extra.get("webrtc"), Mapping) else None
    codec = webrtc.get("codec") if webrtc is not None and isinstance(webrtc.get("codec"), Mapping) else {}
    negotiated = f"{codec.get('name', 'a codec')} as negotiated, decoded to " if webrtc is not None else ""
    setup = (f"{line.protocol} line, {negotiated}{line.codec} at {line.rate} Hz, phone jitter delay "
             f"{line.jitter_ms} ms{conditions}; agent {url}")
    parts = _median_parts(rows)
    caption = (
        f"{summary_sentence(doc)} Each turn: the red bar is the silence the caller heard, measured at their ear (the "
        "recording); under it the agent's own account on its own clock, its parts stacked from 0 as it reported them, "
        "then the line's share, hatched, so both bars end at the heard gap."
        + (f" Agent's parts (medians): {parts}." if parts else "")
        + (" Below, each barge-in: the assistant audio still heard after the caller began to speak, up to the heard "
           "silence (the buffer ran dry or was cleared)." if barges else "")
        + f" Run: {setup}."
        + (f" Turns {', '.join(silent)}: no reply heard, not drawn." if silent else "")
    )
    return style.Chart(fig, caption, summary_row_html(doc))


def _cut_offs(doc: DialDoc) -> str:
    """"turn 1 at 2,510 ms, 1,480 ms before the caller's end (in its planned pause)", for each cut-off turn."""
    found = []
    for turn in doc.turns:
        at = turn.cut_off_at
        if not turn.cut_off or at is None:
            continue
        t, left = at.t_ms, at.caller_speech_left_ms
        paused = t is not None and any(start <= t < end for start, end in turn.caller.pauses_ms)
        found.append(f"turn {turn.index} at {style.ms(t)} ms, {style.ms(left)} ms before the caller's end"
                     + (" (in its planned pause)" if paused else "") if t is not None and left is not None
                     else f"turn {turn.index}")
    return "; ".join(found)


def _median_parts(rows: Sequence[_Row]) -> str:
    found: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.stacked() or []:
            found.setdefault(key, []).append(value)
    names = {key: label for key, label, *_ in PARTS}
    return ", ".join(f"{names.get(k, k)} {style.ms(stats.median(v))} ms" for k, v in found.items())


# --- the waveform of the recording -------------------------------------------------------------------------------


def _envelope(samples: np.ndarray, rate: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(block start times in s, min, max) of the samples in blocks of _ENVELOPE_MS, in full-scale units."""
    block = max(1, int(rate * _ENVELOPE_MS / 1000))
    count = max(1, -(-len(samples) // block))
    padded = np.zeros(count * block, np.float64)
    padded[: len(samples)] = samples / FULL_SCALE
    blocks = padded.reshape(count, block)
    return np.arange(count) * block / rate, blocks.min(axis=1), blocks.max(axis=1)


def waveform_chart(doc: DialDoc, call: checks.Recording, measured: Sequence[checks.Measured]) -> style.Chart:
    """The stereo recording, caller above and heard below on the call clock; each turn's heard gap shaded (caller's
    speech end -> first heard sound, as dial.json states it), barge-ins marked (onset solid on the caller, heard
    silence dashed and clear dotted on the heard channel)."""
    fig = style.figure((10.0, 3.8))
    top, bottom = fig.subplots(2, 1, sharex=True)
    for ax, samples, label, color in ((top, call.left, "caller (left)", style.GREY),
                                      (bottom, call.right, "heard (right)", style.BLUE)):
        x, low, high = _envelope(samples, call.rate)
        ax.fill_between(x, low, high, color=color, linewidth=0, step="post")
        ax.set_ylim(-1.0, 1.0)
        ax.set_ylabel(label)
        ax.set_yticks([])
    for turn in doc.turns:
        end = turn.caller.speech_end_ms
        first = turn.heard.first_sound_ms if turn.heard is not None else None
        if first is not None:
            for ax in (top, bottom):
                ax.axvspan(end / 1000, first / 1000, color=style.ORANGE, alpha=0.3, linewidth=0)
            bottom.annotate(f"{style.ms(first - end)} ms", ((end + first) / 2000, 0.72), ha="center", fontsize=8)
        barge = turn.barge_in
        if barge is not None:
            for value, ax, dash in ((barge.onset_ms, top, "-"), (barge.heard_silent_ms, bottom, "--"),
                                    (barge.cleared_ms, bottom, ":")):
                if value is not None:
                    ax.axvline(value / 1000, color=style.RED, linewidth=1.2, linestyle=dash)
    bottom.set_xlim(0, call.frames / call.rate)
    bottom.set_xlabel(_CALL_AXIS)
    on_file = ", ".join("–" if m.first_sound is None or m.speech_end is None
                        else style.ms(call.ms(m.first_sound - m.speech_end)) for m in measured)
    caption = (
        f"The recording at the caller's ear: caller above (what was sent), heard below (what left the phone's playout "
        f"buffer, frame by frame as it played), {call.rate} Hz, {call.frames / call.rate:.1f} s, min..max per "
        f"{_ENVELOPE_MS:.0f} ms. Orange: each turn's heard gap as {DIAL} states it; measured again on this file from "
        f"its samples alone: {on_file} ms. Red: a barge-in's onset (solid, caller), the heard silence (dashed) and the "
        "clear (dotted)."
    )
    return style.Chart(fig, caption)


def waveform_section(folder: RunFolder) -> style.Chart | str:
    """The waveform section (registered with no artifact of its own): dial.json and the recording it names, read
    from the run folder through its jail; a refused file is the section's "not available". A folder without a dial
    call of this run gets no section (as the optional "dial" section above it): the empty string."""
    folder = RunFolder.of(folder)
    if not folder.exists(DIAL) or not folder.membership().belongs(DIAL):
        return ""
    doc = folder.artifact(DialDoc)
    try:
        call = checks.recording(folder, doc)
        lengths = [len(w) for w in checks.caller_wavs(folder, doc)]
        measured = checks.measure(call, doc, lengths, clears=checks.clear_samples(folder, doc, call.rate))
    except checks.CheckFailed as exc:  # the files disagree with dial.json in a way that cannot be drawn
        raise ArtifactError(str(exc)) from exc
    return waveform_chart(doc, call, measured)
