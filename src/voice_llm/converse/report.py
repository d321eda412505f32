"""The converse step's report.html sections, drawn in report_html's style: a per-turn waterfall on the caller's
timeline (0 = the caller stopped talking), the stereo waveform of converse/call.wav with each turn's gap marked,
and one summary row, "the caller hears the assistant N ms after they stop talking (median, p90 over turns)".

:func:`section_html` is the whole thing for a run folder and never raises for a missing or malformed
converse.json or call.wav (the section says "no data: <reason>" or "not available: <reason>" like the others);
:func:`waterfall_chart` alone takes the parsed converse.json, as report_html's sections take their artifact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from voice_llm.report import style
from voice_llm.run.folder import RunFolder
from voice_llm.util import stats
from voice_llm.util.artifacts import inside, read_json
from voice_llm.converse import gap
from voice_llm.converse import TITLE, WAVE_TITLE
from voice_llm.converse.checks import ARTIFACT, RECORDING
from voice_llm.errors import ArtifactError, OutputDirError

if TYPE_CHECKING:  # matplotlib is imported when a chart is drawn (style.figure)
    from matplotlib.axes import Axes

_CALLER_AXIS = "ms after the caller stopped talking (true end of speech)"
_CALL_AXIS = "call clock (s since the first caller frame was fed)"
_ENVELOPE_MS = 10.0  # the waveform is drawn as its min..max per 10 ms: a 30 s call is 3000 points per channel
_PLAYBACK_SHOWN_MS = 900.0  # of each reply's playback, the waterfall shows this much past its start

# The waterfall's spans, in the order they chain from the caller's speech to the first sound: label, from event,
# to event, colour, opacity. "caller speech" runs from the true start to the true end.
_SPANS = (
    ("caller speech", "speech_start", "speech_end", style.GREY, 0.35),
    ("endpoint wait", "speech_end", "turn_detected", style.ORANGE, 1.0),
    ("STT", "turn_detected", "stt_end", style.PURPLE, 1.0),
    ("request -> first token (prefill)", "stt_end", "first_token", style.BLUE, 1.0),
    ("first token -> first segment text", "first_token", "first_segment_text", style.BLUE, 0.45),
    ("synthesis of the first segment", "first_segment_text", "first_audio_ready", style.GREEN, 0.45),
    ("audio -> playback", "first_audio_ready", "playback_start", style.GREEN, 0.7),
)
_NEEDED = ("speech_start", "speech_end", "turn_detected", "stt_end", "first_token", "first_segment_text",
           "first_audio_ready", "playback_start")


def _turns(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    turns = style.rows(doc.get("turns"), f"{ARTIFACT} turns")
    return [style.mapping(turn, f"{ARTIFACT} turns[{i}]") for i, turn in enumerate(turns)]


def _drawn(doc: Mapping[str, Any]) -> tuple[list[tuple[Mapping[str, Any], dict[str, float]]], list[str]]:
    """The turns that have every event of the gap (with those events), and the names of those that do not."""
    drawn, skipped = [], []
    for turn in _turns(doc):
        where = f"{ARTIFACT} turn {turn.get('index')}"
        events = style.mapping(turn.get("events"), f"{where} events")
        times = {key: style.optional_number(events, key, f"{where} events") for key in (*_NEEDED, "playback_end")}
        if any(times[key] is None for key in _NEEDED):
            skipped.append(str(turn.get("index")))
            continue
        drawn.append((turn, times))  # type: ignore[arg-type]
    if not drawn:
        raise style.NoDataError(f"{ARTIFACT}: no turn reached the assistant's first sound (turns {', '.join(skipped)})")
    return drawn, skipped


def mouth_to_ear(doc: Mapping[str, Any]) -> tuple[float, float, int]:
    """(median, p90, turns) of the summary's mouth_to_ear_ms."""
    summary = style.mapping(doc.get("summary"), f"{ARTIFACT} summary")
    found = style.mapping(summary.get("mouth_to_ear_ms"), f"{ARTIFACT} summary mouth_to_ear_ms")
    where = f"{ARTIFACT} summary mouth_to_ear_ms"
    return style.number(found, "median", where), style.number(found, "p90", where), int(style.number(found, "n", where))


def summary_sentence(doc: Mapping[str, Any]) -> str:
    median, p90, n = mouth_to_ear(doc)
    return (f"The caller hears the assistant {style.ms(median)} ms after they stop talking (median; p90 "
            f"{style.ms(p90)} ms over {n} turn{'' if n == 1 else 's'}).")


def summary_row_html(doc: Mapping[str, Any]) -> str:
    """The section's one summary row: mouth-to-ear, median and p90 over the turns."""
    median, p90, n = mouth_to_ear(doc)
    cell = (f'<td class="num">the caller hears the assistant {style.esc(style.ms(median))} ms after they stop '
            f"talking (median; p90 {style.esc(style.ms(p90))} ms over {n} turns)</td>")
    return f'<table class="facts"><tr><th>mouth to ear</th>{cell}</tr></table>\n'


# --- the waterfall ------------------------------------------------------------------------------------------------


def _waterfall_axes(ax: Axes, rows: Sequence[tuple[Mapping[str, Any], dict[str, float]]]) -> float:
    """One row per turn (turn 1 on top), times relative to that turn's true end of speech; returns the x extent."""
    right = 0.0
    marked: set[str] = set()

    def once(label: str) -> str | None:  # each legend entry once
        if label in marked:
            return None
        marked.add(label)
        return label

    for row, (turn, t) in enumerate(rows):
        y = len(rows) - row
        zero = t["speech_end"]
        for label, start, end, color, alpha in _SPANS:
            a, b = t[start] - zero, t[end] - zero
            ax.broken_barh([(min(a, b), abs(b - a))], (y - 0.3, 0.6), facecolors=color, alpha=alpha,
                           edgecolor="white", linewidth=0.5, label=label if row == 0 else None)
        barge = turn.get("barge_in") if isinstance(turn.get("barge_in"), Mapping) else None
        stop = style.optional_number(barge, "playback_silent", "barge_in") if barge else None
        end = stop if stop is not None else t["playback_end"]
        shown = min(end if end is not None else t["playback_start"] + _PLAYBACK_SHOWN_MS,
                    t["playback_start"] + _PLAYBACK_SHOWN_MS)
        ax.broken_barh([(t["playback_start"] - zero, shown - t["playback_start"])], (y - 0.3, 0.6),
                       facecolors=style.GREEN, edgecolor="white", linewidth=0.5,
                       label="playback (what the caller hears)" if row == 0 else None)
        if barge:
            onset = style.optional_number(barge, "onset_true", "barge_in")
            if onset is not None:
                ax.plot([onset - zero], [y], "v", color=style.RED, markersize=8,
                        label=once("caller barges in"))
            if stop is not None:
                ax.plot([stop - zero], [y], "|", color=style.RED, markersize=14, markeredgewidth=2,
                        label=once("assistant silent"))
        endpoint = style.optional_number(turn["events"], "endpoint", "events")
        if endpoint is not None and abs(endpoint - t["turn_detected"]) > 0.5:  # preemptive: committed before it
            ax.plot([endpoint - zero], [y], "|", color=style.GREY, markersize=14, markeredgewidth=2,
                    label=once("endpoint (a preemptive reply waits for it)"))
        gap_ms = t["playback_start"] - zero
        ax.annotate(f"{style.ms(gap_ms)} ms", (gap_ms, y + 0.32), fontsize=9, ha="left", va="bottom")
        right = max(right, shown - zero)
    ax.axvline(0, color=style.GREY, linewidth=1)
    ax.set_yticks([len(rows) - i for i in range(len(rows))], [f"turn {turn.get('index')}" for turn, _ in rows])
    ax.set_ylim(0.4, len(rows) + 0.8)
    return right


def waterfall_chart(doc: Mapping[str, Any]) -> style.Chart:
    """Per turn, on the caller's timeline: their speech, the endpoint wait, STT, prefill, the first segment's
    text and synthesis, playback, and a barge-in; the caption and the summary row give mouth-to-ear."""
    doc = style.mapping(doc, ARTIFACT)
    rows, skipped = _drawn(doc)
    sentence, row = summary_sentence(doc), summary_row_html(doc)
    fig = style.figure((10.0, 0.75 * len(rows) + 1.9))
    ax = fig.add_subplot()
    right = _waterfall_axes(ax, rows)
    left = min(t["speech_start"] - t["speech_end"] for _, t in rows)
    ax.set_xlim(max(left, -2500.0) * 1.05, right * 1.05 + 50)
    ax.set_xlabel(_CALLER_AXIS)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=4, fontsize=8, frameon=False)
    settings = doc.get("settings") if isinstance(doc.get("settings"), Mapping) else {}
    setup = ", ".join(part for part in (
        f"endpoint {settings['endpoint_ms']} ms" if "endpoint_ms" in settings else "",
        f"strategy {settings['strategy']}" if "strategy" in settings else "",
        f"STT {settings['stt']}" if "stt" in settings else "",
        f"preemptive {'on' if settings.get('preemptive') else 'off'}") if part)
    parts = _median_parts(rows)
    caption = (
        f"{sentence} Each row is one turn on the caller's own timeline: 0 is the last sample of their speech, the "
        "number is the silence they heard. The coloured spans add up to it: " + parts + f". Playback is drawn for its "
        f"first {_PLAYBACK_SHOWN_MS / 1000:.1f} s. Run: {setup}."
        + (f" Turns {', '.join(skipped)} never reached a first sound and are not drawn." if skipped else "")
    )
    return style.Chart(fig, caption, row)


def _median_parts(rows: Sequence[tuple[Mapping[str, Any], dict[str, float]]]) -> str:
    """The median of each span over the drawn turns, in the chain's order."""
    out = []
    for label, start, end, _, _ in _SPANS[1:]:
        out.append(f"{label} {style.ms(stats.median([t[end] - t[start] for _, t in rows]))} ms")
    return ", ".join(out) + " (medians)"


# --- the waveform ---------------------------------------------------------------------------------------------


def _envelope(samples: np.ndarray, rate: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(block start times in s, min, max) of the samples in blocks of _ENVELOPE_MS, in full-scale units."""
    block = max(1, int(rate * _ENVELOPE_MS / 1000))
    count = -(-len(samples) // block)
    padded = np.zeros(count * block, np.float64)
    padded[: len(samples)] = samples / gap.FULL_SCALE
    blocks = padded.reshape(count, block)
    return np.arange(count) * block / rate, blocks.min(axis=1), blocks.max(axis=1)


def waveform_chart(doc: Mapping[str, Any], call: gap.Call) -> style.Chart:
    """The stereo recording, caller above and assistant below on the call clock, with each turn's reported gap
    shaded (speech end -> playback start), its length written, and barge-ins marked."""
    doc = style.mapping(doc, ARTIFACT)
    rows, _ = _drawn(doc)
    fig = style.figure((10.0, 3.8))
    top, bottom = fig.subplots(2, 1, sharex=True)
    for ax, samples, label, color in ((top, call.caller, "caller (left)", style.GREY),
                                      (bottom, call.assistant, "assistant (right)", style.BLUE)):
        x, low, high = _envelope(samples, call.sample_rate)
        ax.fill_between(x, low, high, color=color, linewidth=0, step="post")
        ax.set_ylim(-1.0, 1.0)
        ax.set_ylabel(label)
        ax.set_yticks([])
    for turn, t in rows:
        for ax in (top, bottom):
            ax.axvspan(t["speech_end"] / 1000, t["playback_start"] / 1000, color=style.ORANGE, alpha=0.25, linewidth=0)
        bottom.annotate(f"{style.ms(t['playback_start'] - t['speech_end'])} ms",
                        ((t["speech_end"] + t["playback_start"]) / 2000, 0.75), ha="center", fontsize=8)
        barge = turn.get("barge_in") if isinstance(turn.get("barge_in"), Mapping) else None
        for key in ("onset_true", "playback_silent"):
            value = style.optional_number(barge, key, "barge_in") if barge else None
            if value is not None:
                (top if key == "onset_true" else bottom).axvline(value / 1000, color=style.RED, linewidth=1.2,
                                                                  linestyle="-" if key == "onset_true" else "--")
    bottom.set_xlim(0, call.frames / call.sample_rate)
    bottom.set_xlabel(_CALL_AXIS)
    measured = gap.measure_turns(call, [float(turn.get("caller_offset_ms") or 0.0) for turn in _turns(doc)])
    on_file = ", ".join("–" if m.gap_ms is None else style.ms(m.gap_ms) for m in measured)
    caption = (
        f"Caller above, assistant below, {call.sample_rate} Hz, {call.frames / call.sample_rate:.1f} s (min..max per "
        f"{_ENVELOPE_MS:.0f} ms). Orange: each turn's gap as converse.json reports it, from the caller's true end of "
        f"speech to the assistant's first sample; measured on this file from the samples alone: {on_file} ms. Red: a "
        "barge-in's true onset (solid, caller) and the moment the assistant's channel went silent (dashed). The "
        "caller channel is clean, as after echo cancellation."
    )
    return style.Chart(fig, caption)


# --- the sections ---------------------------------------------------------------------------------------------


def _no_data(name: str, title: str, reason: str, what: str = "no data") -> str:
    return (f'<section id="section-{name}">\n<h2>{style.esc(title)}</h2>\n'
            f'<p class="missing">{what}: {style.esc(reason)}</p>\n</section>\n')


def section_html(out: Path) -> str:
    """Both sections for the run folder ``out``: the waterfall (with the summary row) and the waveform. A
    missing or malformed converse.json or call.wav gives the section's "no data" or "not available" line, never
    an exception; a failure of the drawing code itself is raised (report_html records it)."""
    try:
        doc = style.mapping(read_json(out / ARTIFACT), ARTIFACT)
        chart = waterfall_chart(doc)
    except style.NoDataError as exc:
        return _no_data("converse", TITLE, str(exc)) + _no_data("converse-wave", WAVE_TITLE, str(exc))
    except ArtifactError as exc:
        return _no_data("converse", TITLE, str(exc)) + _no_data("converse-wave", WAVE_TITLE, str(exc))
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        reason = f"{ARTIFACT} is malformed ({type(exc).__name__}: {exc})"
        return _no_data("converse", TITLE, reason) + _no_data("converse-wave", WAVE_TITLE, reason)
    html = style.chart_section_html("converse", TITLE, chart)
    try:
        recording = doc.get("recording") if isinstance(doc.get("recording"), Mapping) else {}
        call = gap.read_call(inside(out, str(recording.get("path", RECORDING))))
        wave = waveform_chart(doc, call)
    except (ArtifactError, OutputDirError, KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        return html + _no_data("converse-wave", WAVE_TITLE, str(exc), "not available")
    return html + style.chart_section_html("converse-wave", WAVE_TITLE, wave)


def waveform_section(folder: RunFolder) -> style.Chart:
    """The waveform section for report.html (registered with no artifact of its own: it reads converse.json and
    the recording it names from the run folder, each once). A missing file is the section's "not available"."""
    doc = style.mapping(folder.json(ARTIFACT), ARTIFACT)
    recording = doc.get("recording") if isinstance(doc.get("recording"), Mapping) else {}
    try:
        call = gap.read_call(inside(folder.path, str(recording.get("path", RECORDING))))
    except OutputDirError as exc:
        raise ArtifactError(str(exc)) from exc
    return waveform_chart(doc, call)
