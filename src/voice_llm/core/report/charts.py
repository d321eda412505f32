"""The core's charts: one builder per core artifact, each drawing its section of ``report.html``
(voice_llm.core.report.page lays the page out and places these among the capabilities' sections).

Each builder takes the artifact's typed value (voice_llm.core.run.artifacts: the one parse, which the checks and the
metrics read too; :data:`KIND_OF` says which) and returns a :class:`voice_llm.core.report.style.Chart`. The parse refuses a
malformed file (ArtifactError: "not available") and says when a step measured nothing (NoDataError: "no data", a
null, NaN or empty list where the numbers go), as page.py's docstring describes; a builder adds only what its own
drawing needs (the four cache requests, a prefill number left null).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from voice_llm.core.errors import ArtifactError, NoDataError
from voice_llm.core.report import style
from voice_llm.core.report.style import BLUE, GREEN, GREY, ORANGE, RED, TIME_AXIS, WIDE, Chart
from voice_llm.core.run import artifacts as typed
from voice_llm.core.util.artifacts import CACHE, CANCEL, PREFILL

if TYPE_CHECKING:  # matplotlib is imported when a chart is drawn (style.figure), not with this module
    from matplotlib.axes import Axes

__all__ = ["KIND_OF", "cache_chart", "cancel_chart", "prefill_chart", "sentence_chart", "ttft_chart"]


# --- sentence stream -----------------------------------------------------------------------------------------


def sentence_chart(doc: typed.Sentence) -> Chart:
    ttft, total = doc.ttft_ms, doc.total_ms
    first, smart = doc.first_sentence_ms, doc.smart_first_sentence_ms
    chunks = [(chunk.t_ms, chunk.text) for chunk in doc.chunks]

    fig = style.figure(WIDE)
    ax = fig.add_subplot()
    if chunks:
        times = [t for t, _ in chunks]
        # Characters so far show both when chunks arrive (the dots) and how much text a TTS could already speak.
        received = np.cumsum([len(text) for _, text in chunks])
        ax.step(times, received, where="post", color=GREY, linewidth=1)
        ax.plot(times, received, "o", color=GREY, markersize=3, label=f"{len(chunks)} chunks")
    style.vline(ax, ttft, f"first token: {style.ms(ttft)} ms", BLUE, "-")
    if first is not None:
        style.vline(ax, first, f"first sentence, brief's rule: {style.ms(first)} ms", ORANGE, "--")
    if smart is not None:
        style.vline(ax, smart, f"first sentence, smart splitter: {style.ms(smart)} ms", GREEN, ":")
    style.vline(ax, total, f"end of answer: {style.ms(total)} ms", RED, "-.")
    ax.set_xlim(0, max([total, *(t for t, _ in chunks), 1.0]) * 1.02)  # 1 ms at least: never a zero-width axis
    ax.set_ylim(bottom=0)
    ax.set_xlabel(TIME_AXIS)
    ax.set_ylabel("characters received")
    ax.legend(loc="upper left")
    return Chart(fig, _sentence_caption(ttft, first, smart, total), _sentence_text_html(doc, chunks))


def _sentence_caption(ttft: float, first: float | None, smart: float | None, total: float) -> str:
    tail = f"the first token came at {style.ms(ttft)} ms and the answer ended at {style.ms(total)} ms."
    if first is None and smart is None:
        return f"No whole sentence was found, so a voice assistant would wait for the end; {tail}"
    options = []
    if first is not None:
        options.append(f"after {style.ms(first)} ms with the brief's rule")
    if smart is not None:
        options.append(f"after {style.ms(smart)} ms with the smart splitter")
    return f"A voice assistant could start speaking the first sentence {' or '.join(options)}; {tail}"


def _sentence_text_html(doc: typed.Sentence, chunks: Sequence[tuple[float, str]]) -> str:
    rows = "".join(
        f'<tr><td class="num">{style.ms(t)}</td><td><code>{style.esc(text)}</code></td></tr>\n' for t, text in chunks
    )
    return (
        '<dl class="texts">\n'
        f"<dt>first sentence, brief's rule</dt><dd>{style.esc(doc.first_sentence or '—')}</dd>\n"
        f"<dt>first sentence, smart splitter</dt><dd>{style.esc(doc.doc.get('smart_first_sentence') or '—')}</dd>\n"
        f"<dt>whole answer</dt><dd>{style.esc(doc.text or '—')}</dd>\n</dl>\n"
        f"<details><summary>all {len(chunks)} chunks</summary>\n"
        '<table class="chunks"><thead><tr><th>t (ms)</th><th>text</th></tr></thead><tbody>\n'
        f"{rows}</tbody></table>\n</details>\n"
    )


# --- time to first token -------------------------------------------------------------------------------------


def ttft_chart(doc: typed.Ttft) -> Chart:
    runs = doc.runs
    ttfts, totals = [run.ttft_ms for run in runs], [run.total_ms for run in runs]
    tokens = [run.tokens for run in runs]
    ttft_p50, total_p50 = doc.ttft_p50, doc.total_p50

    fig = style.figure(WIDE)
    left, right = fig.subplots(1, 2)
    names = [str(i + 1) for i in range(len(runs))]
    style.bars(left, names, ttfts, BLUE, "ms")
    left.axhline(ttft_p50, color=ORANGE, linestyle="--")
    left.set_title(f"time to first token (dashed: median {style.ms(ttft_p50)} ms)")
    left.set_xlabel("run")
    # Token counts under each run: a longer answer explains a longer total.
    total_names = [name if n is None else f"{name}\n{style.count(n)} tok" for name, n in zip(names, tokens)]
    style.bars(right, total_names, totals, GREY, "ms")
    right.axhline(total_p50, color=ORANGE, linestyle="--")
    right.set_title(f"time to the whole answer (dashed: median {style.ms(total_p50)} ms)")
    right.set_xlabel("run (answer length in tokens)")
    for ax in (left, right):
        ax.set_ylabel("time (ms)")
    caption = (
        f"Over {len(runs)} runs the first token arrived after {style.ms(ttft_p50)} ms (median) "
        f"and the whole answer after {style.ms(total_p50)} ms."
    )
    return Chart(fig, caption)


# --- prefill cost --------------------------------------------------------------------------------------------


def _fit_line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float] | None:
    """Least-squares slope and intercept, or None when the points cannot define a line."""
    if len(x) < 2 or np.ptp(x) == 0:
        return None
    slope, intercept = np.polyfit(np.asarray(x, dtype=float), np.asarray(y, dtype=float), 1)
    return float(slope), float(intercept)


def _rate_text(fit: tuple[float, float] | None) -> str:
    if fit is None:
        return "no fit: needs at least two different prompt sizes"
    slope = fit[0]
    if slope <= 0:
        return f"fit slope {slope:.3f} ms/token: no positive prefill rate"
    return f"prefill: {slope:.2f} ms/token ≈ {style.count(1000 / slope)} tokens/s"


def _measured(value: float | None, i: int, key: str) -> float:
    """A prefill number the chart needs: null is a step that measured nothing there ("no data")."""
    if value is None:
        raise NoDataError(f"{PREFILL}[{i}]: {key!r} is null")
    return value


def _prefill_chart_client_only(rows: Sequence[typed.PrefillRow]) -> Chart:
    """Without the server's token counts (not llama-server): first-token time against the number of documents."""
    points = sorted((float(row.docs), _measured(row.ttft_ms, i, "ttft_ms")) for i, row in enumerate(rows))
    docs, ttft = (list(column) for column in zip(*points))
    fig = style.figure(WIDE)
    ax = fig.add_subplot()
    ax.plot(docs, ttft, "s--", color=ORANGE, markersize=6, linewidth=1, label="ttft_ms (measured by the client)")
    _prefill_axes(ax, "documents in the system prompt")
    reason = next((row.unknown["prompt_n"] for row in rows if "prompt_n" in row.unknown), None)
    caption = (f"{style.count(docs[-1])} documents cost {style.ms(ttft[-1])} ms before the first word, against {style.ms(ttft[0])} ms "
               f"with {style.count(docs[0])}; prompt token counts are not shown ({reason or 'the server sent none'}).")
    return Chart(fig, caption)


def prefill_chart(doc: typed.Prefill) -> Chart:
    rows = doc.rows
    # Null with a reason (a server without timings) draws from the client clock; a missing key is malformed (the
    # parse refuses it).
    if any(row.prompt_n is None or row.prompt_ms is None for row in rows):
        return _prefill_chart_client_only(rows)
    points = sorted(
        (_measured(row.prompt_n, i, "prompt_n"), _measured(row.prompt_ms, i, "prompt_ms"),
         _measured(row.ttft_ms, i, "ttft_ms"), float(row.docs))
        for i, row in enumerate(rows)
    )
    prompt_n, prompt_ms, ttft, docs = (list(column) for column in zip(*points))
    fit = _fit_line(prompt_n, prompt_ms)

    fig = style.figure(WIDE)
    ax = fig.add_subplot()
    if fit is not None:
        xs = np.array([0.0, max(prompt_n) * 1.05])
        ax.plot(xs, fit[0] * xs + fit[1], color=BLUE, linewidth=1, alpha=0.7, label="least-squares fit of prompt_ms")
    ax.plot(prompt_n, prompt_ms, "o", color=BLUE, markersize=7, label="prompt_ms (server prefill time)")
    ax.plot(prompt_n, ttft, "s--", color=ORANGE, markersize=6, linewidth=1, label="ttft_ms (measured by the client)")
    for x, y, d in zip(prompt_n, ttft, docs):
        ax.annotate(f"{style.count(d)} docs", (x, y), textcoords="offset points", xytext=(6, 6), fontsize=9)
    ax.text(0.99, 0.04, _rate_text(fit), transform=ax.transAxes, ha="right", va="bottom", fontsize=10,
            bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "#bbbbbb"})
    _prefill_axes(ax, "prompt size (prompt_n, tokens)")
    return Chart(fig, _prefill_caption(points[-1], fit))


def _prefill_axes(ax: Axes, xlabel: str) -> None:
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.margins(x=0.08, y=0.12)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("time (ms)")
    ax.legend(loc="upper left")


def _prefill_caption(largest: tuple[float, float, float, float], fit: tuple[float, float] | None) -> str:
    prompt_n, _, ttft, docs = largest
    sentence = f"{style.count(docs)} documents ({style.count(prompt_n)} prompt tokens) cost {style.ms(ttft)} ms before the first word"
    if fit is not None and fit[0] > 0:
        sentence += f"; the server reads the prompt at about {style.count(1000 / fit[0])} tokens/s"
    return sentence + "."


# --- prompt cache --------------------------------------------------------------------------------------------

_CACHE_CASES = (
    ("first", "first"),
    ("second", "second\n(identical)"),
    ("changed_suffix", "changed\nsuffix"),
    ("changed_prefix", "changed\nprefix"),
)


def _cache_chart_client_only(doc: typed.Cache, ttft: Mapping[str, float]) -> Chart:
    """Without the server's token counts: the first-token times alone show what the cache did."""
    fig = style.figure(WIDE)
    ax = fig.add_subplot()
    style.bars(ax, [label for _, label in _CACHE_CASES], list(ttft.values()), BLUE, "ms")
    ax.set_title("time to first token")
    ax.set_ylabel("time (ms)")
    ax.set_xlabel("request")
    unknown = doc.unknown
    caption = (
        f"Re-sending the same prompt got the first token after {style.ms(ttft['second'])} ms instead of "
        f"{style.ms(ttft['first'])} ms; changing its end cost {style.ms(ttft['changed_suffix'])} ms and changing its start "
        f"{style.ms(ttft['changed_prefix'])} ms. Token counts are not shown "
        f"({unknown.get('prompt_n') or 'the server sent none'})."
    )
    return Chart(fig, caption)


def _case(doc: typed.Cache, key: str) -> typed.CacheCase:
    case = doc.case(key)
    if case is None:  # the chart draws the four requests the step makes; a file without one is not its shape
        raise ArtifactError(f"{CACHE} has no {key!r}: the chart draws all four requests")
    return case


def cache_chart(doc: typed.Cache) -> Chart:
    cases = {key: _case(doc, key) for key, _ in _CACHE_CASES}
    ttft = {key: case.ttft_ms for key, case in cases.items()}
    if any("prompt_n" in case.doc and case.prompt_n is None for case in cases.values()):
        return _cache_chart_client_only(doc, ttft)
    missing = [key for key, case in cases.items() if case.prompt_n is None]
    if missing:
        raise ArtifactError(f"{CACHE} {missing[0]}: 'prompt_n' is missing")
    prompt_n = {key: float(case.prompt_n or 0.0) for key, case in cases.items()}
    cache_n = {key: case.cache_n for key, case in cases.items()}
    labels = [label for _, label in _CACHE_CASES]

    fig = style.figure(WIDE)
    left, right = fig.subplots(1, 2)
    style.bars(left, labels, list(ttft.values()), BLUE, "ms")
    left.set_title("time to first token")
    left.set_ylabel("time (ms)")
    # Evaluated and reused tokens side by side: together they show what the cache saved.
    x = np.arange(len(labels))
    evaluated = right.bar(x - 0.2, list(prompt_n.values()), width=0.4, color=ORANGE, label="prompt_n (evaluated)")
    right.bar_label(evaluated, labels=[style.count(v) for v in prompt_n.values()], padding=2, fontsize=9)
    if all(v is not None for v in cache_n.values()):
        reused = [v or 0.0 for v in cache_n.values()]
        cached = right.bar(x + 0.2, reused, width=0.4, color=GREEN, label="cache_n (reused from cache)")
        right.bar_label(cached, labels=[style.count(v) for v in reused], padding=2, fontsize=9)
    right.set_xticks(x, labels)
    right.set_title("prompt tokens")
    right.set_ylabel("tokens")
    # Headroom above the tallest bar so the legend never covers a bar.
    right.set_ylim(0, max(max(prompt_n.values()), *(v or 0.0 for v in cache_n.values())) * 1.45 or 1)
    right.legend(loc="upper center", ncols=2)
    for ax in (left, right):
        ax.set_xlabel("request")
    caption = (
        f"Re-sending the same prompt got the first token after {style.ms(ttft['second'])} ms instead of "
        f"{style.ms(ttft['first'])} ms ({style.count(prompt_n['second'])} of {style.count(prompt_n['first'])} prompt tokens "
        f"evaluated); changing its end cost {style.ms(ttft['changed_suffix'])} ms and changing its start "
        f"{style.ms(ttft['changed_prefix'])} ms."
    )
    return Chart(fig, caption)


# --- cancellation --------------------------------------------------------------------------------------------


def cancel_chart(doc: typed.Cancel) -> Chart:
    max_tokens, received = float(doc.max_tokens), float(doc.received_tokens)
    closed, idle_after = doc.closed_at_ms, doc.slot_idle_after_ms
    if closed is None:  # the answer ended before the cut: no cut to draw ("no data", with the step's reason)
        raise NoDataError(f"{CANCEL}: {doc.unknown.get('closed_at_ms') or 'closed_at_ms is null'}")
    chunks = [(chunk.t_ms, chunk.text) for chunk in doc.chunks or ()]
    idle_at = None if idle_after is None else closed + idle_after

    fig = style.figure((WIDE[0], 2.9))
    ax = fig.add_subplot()
    # Two lanes: what the client saw, and how long the server slot stayed busy.
    ax.barh(1, closed, left=0, height=0.5, color=BLUE, alpha=0.25, label="client receiving")
    if chunks:
        ax.vlines([t for t, _ in chunks], 0.78, 1.22, color=BLUE, linewidth=1, label=f"{len(chunks)} chunks received")
    busy_until = closed if idle_at is None else idle_at
    ax.barh(0, busy_until, left=0, height=0.5, color=GREY, alpha=0.3, label="server slot busy")
    style.vline(ax, closed, f"client closed: {style.ms(closed)} ms", RED, "--")
    if idle_at is not None:
        style.vline(ax, idle_at, f"slot idle: {style.ms(idle_at)} ms", GREEN, "-")
    ax.set_yticks([0, 1], ["server slot", "client stream\n(request sent at 0)"])
    ax.set_ylim(-0.6, 1.6)
    ax.set_xlim(0, max(busy_until, 1.0) * 1.25)
    ax.grid(axis="y", visible=False)
    ax.set_xlabel(TIME_AXIS)
    ax.set_title(f"{style.count(received)} of {style.count(max_tokens)} tokens received", loc="left")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
    return Chart(fig, _cancel_caption(doc, received, max_tokens, closed, idle_after))


def _cancel_caption(doc: typed.Cancel, received: float, max_tokens: float, closed: float,
                    idle_after: float | None) -> str:
    start = f"The client hung up at {style.ms(closed)} ms after {style.count(received)} of {style.count(max_tokens)} tokens"
    unknown = doc.unknown
    if idle_after is None and unknown.get("slot_idle_after_ms"):
        middle = f"and {unknown['slot_idle_after_ms']}"
    elif idle_after is None:
        middle = "and the server slot was not seen idle afterwards"
    else:
        middle = f"and the server slot was idle again {style.ms(idle_after)} ms later"
    logged = doc.cancel_logged
    end = "" if not isinstance(logged, bool) else (
        "; the server log shows the cancel" if logged else "; the server log does not show the cancel"
    )
    return f"{start}, {middle}{end}."


# The typed value each builder draws: voice_llm.core.report.page gives a core section its file's value, parsed once per
# folder (RunFolder.artifact).
KIND_OF: Mapping[Any, type[typed.Artifact]] = {
    sentence_chart: typed.Sentence, ttft_chart: typed.Ttft, prefill_chart: typed.Prefill, cache_chart: typed.Cache,
    cancel_chart: typed.Cancel,
}
