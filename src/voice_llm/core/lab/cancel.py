"""Step 7: barge-in — close the connection 0.5 s into a long answer and time how long the server takes to stop."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from voice_llm.core import sse
from voice_llm.core.scenario import brief, prompts
from voice_llm.core.util import stats
from voice_llm.core.client.api import JSONPoller, slots_processing
from voice_llm.core.util.artifacts import CANCEL
from voice_llm.core.client.capabilities import SOURCE_METRICS, SOURCE_SLOTS, fetch, requests_in_flight
from voice_llm.core.errors import MeasurementError
from voice_llm.core.run.context import RAW_DIR, LabContext
from voice_llm.core.lab.evidence import Evidence

MAX_TOKENS = brief.CANCEL_MAX_TOKENS
CLOSE_AFTER_MS = brief.CANCEL_CLOSE_AFTER_MS
IDLE_TIMEOUT_S = 30.0
# Between two /slots polls. Small against a token time (10-25 ms here), large enough that the polls do not keep a
# core of the two busy while the server is stopping.
POLL_INTERVAL_S = 0.002
CANCEL_LOG_MARK = "cancel task"


def _busy(slots: Any) -> bool:
    """Whether a /slots answer (a list of slot objects) shows a slot processing; any other shape is no answer to
    trust (a string or an object would otherwise read as "idle")."""
    processing = slots_processing(slots)
    if processing is None:
        raise MeasurementError(f"cancel: /slots answered {str(slots)[:80]!r}, not the list of slots (each with "
                               "is_processing)")
    return any(processing)


def wait_until_idle(poller: JSONPoller, since: float, timeout_s: float = IDLE_TIMEOUT_S,
                    interval_s: float = POLL_INTERVAL_S) -> float:
    """Poll /slots (``poller``: one kept-alive connection) every ``interval_s`` until no slot is processing.

    Returns the ms from ``since`` (a ``time.perf_counter()`` reading) to the arrival of the first answer that
    showed every slot idle: an upper bound on when the slot went idle, late by at most one interval and one poll.
    """
    while True:
        slots = poller.get()
        answered = time.perf_counter()
        if not _busy(slots):
            return (answered - since) * 1000.0
        if answered - since > timeout_s:
            raise MeasurementError(f"cancel: the slot was still processing {timeout_s:g} s after the connection was closed")
        time.sleep(interval_s)


def wait_until_no_request(ctx: LabContext, gauge: str, since: float, timeout_s: float = IDLE_TIMEOUT_S,
                          interval_s: float = POLL_INTERVAL_S) -> float:
    """For a server with no /slots but a Prometheus requests-in-flight gauge (llama-server --metrics, vLLM):
    the ms from ``since`` until a /metrics page showed no request in flight."""
    while True:
        found, body = fetch(ctx.client, "/metrics")
        answered = time.perf_counter()
        if not found.ok:
            raise MeasurementError(f"cancel: /metrics stopped answering ({found.status or found.note})")
        try:
            in_flight = requests_in_flight(body.decode("utf-8", "replace"), gauge)
        except ValueError as exc:
            raise MeasurementError(f"cancel: /metrics cannot be read: {exc}") from exc
        if not in_flight:
            return (answered - since) * 1000.0
        if answered - since > timeout_s:
            raise MeasurementError(f"cancel: /metrics still showed a request {timeout_s:g} s after the close")
        time.sleep(interval_s)


def stop_source(ctx: LabContext) -> tuple[str | None, str]:
    """How the server's stop can be seen: /slots, /metrics, or not at all (with the reason)."""
    return ctx.capabilities.stop_source() if ctx.capabilities is not None else (SOURCE_SLOTS, "")


def _closed_at(result: sse.StreamResult) -> float:
    """The close itself on the request's clock (a perf_counter reading), not when the reader returned."""
    return (result.started_at or 0.0) + (result.closed_at_ms or 0.0) / 1000.0


def ms_per_token(chunks: Sequence[sse.Chunk]) -> float | None:
    """The answer's own decode speed: the mean time between its received tokens (None with fewer than two)."""
    if len(chunks) < 2:
        return None
    return (chunks[-1].t_ms - chunks[0].t_ms) / (len(chunks) - 1)


def _log_size(log: Path | None) -> int:
    try:
        return log.stat().st_size if log else 0
    except FileNotFoundError:
        return 0


def _cancel_logged(log: Path | None, offset: int, wait_s: float = 1.0) -> bool | None:
    """Did the server log 'cancel task' after ``offset``? None when the server's log is not ours to read
    (a server given by --url, one voice-llm did not start, or its log went away during the step)."""
    if log is None:
        return None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(log, "rb") as fh:
                fh.seek(offset)
                if CANCEL_LOG_MARK.encode() in fh.read():
                    return True
        except FileNotFoundError:
            return None
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


class TooEarlyCutError(MeasurementError):
    """The busy machine let fewer than two tokens through before the cut: not a measurement of stopping."""


# A cut the busy machine made too early is made again, at most this often per repeat, before the step gives up,
# after a pause: a neighbour's burst of CPU (another process taking one of the server's cores stalls a server that
# runs a thread per core to a few tokens a second) is usually over by then.
CUT_ATTEMPTS = 5
CUT_RETRY_PAUSE_S = 1.0


def _cut(ctx: LabContext, messages: list[dict[str, str]], suffix: str) -> sse.StreamResult:
    # No X-Conversation-Id header: with it the server keeps generating after a disconnect.
    return ctx.request(f"cancel{suffix}", messages, max_tokens=MAX_TOKENS, cache_prompt=True,
                       stop_after_ms=CLOSE_AFTER_MS)


def not_cut(result: sse.StreamResult) -> str:
    """Why nothing was cancelled when the answer ended before the cut (a server over ~500 tokens/s writes the
    brief's 256 tokens in less than 0.5 s): the reason cancel.json gives for its null close and idle time."""
    return (f"the answer finished ({len(result.chunks)} tokens in {result.total_ms:.0f} ms) before the "
            f"{CLOSE_AFTER_MS:.0f} ms cut, so nothing was cancelled: this server is too fast for the brief's request")


def _finished(ctx: LabContext, result: sse.StreamResult, suffix: str) -> dict[str, Any]:
    """cancel.json of an answer that ended before the cut: what arrived, the close and the idle time null with
    the reason (check: not checkable), so the lab goes on to its other steps, check and report."""
    reason = not_cut(result)
    ctx.progress.note(f"cancel: {reason}")
    return {"max_tokens": MAX_TOKENS, "received_tokens": len(result.chunks), "closed_at_ms": None,
            "slot_idle_after_ms": None, "cancel_logged": None, "token_ms": ms_per_token(result.chunks),
            "poll_interval_ms": POLL_INTERVAL_S * 1000.0, "raw": f"{RAW_DIR}/cancel{suffix}.sse",
            "chunks": [chunk.as_dict() for chunk in result.chunks],
            "unknown": {key: reason for key in ("closed_at_ms", "slot_idle_after_ms", "cancel_logged")}}


def measure(ctx: LabContext, number: int = 1) -> dict[str, Any]:
    """One cut; ``number`` is the repeat (it names the raw streams)."""
    suffix = stats.repeat_suffix(number)
    messages = prompts.chat(prompts.ONE_SENTENCE_SYSTEM, prompts.CANCEL_REQUEST)
    # Put the prompt in the slot's KV cache first, so the measured request is generating tokens well before the
    # cut even on a busy machine: what is measured is how fast generation stops, not prefill.
    ctx.request(f"cancel-warmup{suffix}", messages, max_tokens=1, cache_prompt=True)
    source, reason = stop_source(ctx)
    if source == SOURCE_SLOTS:
        with ctx.client.poller("/slots") as poller:
            # Start from an idle slot, or the idle time below measures someone else's request.
            wait_until_idle(poller, time.perf_counter())
            offset = _log_size(ctx.server_log)
            result = _cut(ctx, messages, suffix)
            if not result.closed_early:
                return _finished(ctx, result, suffix)
            idle_ms: float | None = wait_until_idle(poller, _closed_at(result))
    else:  # no /slots (not llama-server): the stop is seen on /metrics, or not at all
        offset = _log_size(ctx.server_log)
        result = _cut(ctx, messages, suffix)
        if not result.closed_early:
            return _finished(ctx, result, suffix)
        gauge = ctx.capabilities.busy_gauge if ctx.capabilities is not None else None
        idle_ms = wait_until_no_request(ctx, gauge, _closed_at(result)) if source == SOURCE_METRICS and gauge else None
    if len(result.chunks) < 2:  # two at least: the gap between them is the token time the idle time is held to
        raise TooEarlyCutError(
            f"cancel: only {len(result.chunks)} token(s) arrived in the first {CLOSE_AFTER_MS:.0f} ms (the server "
            "is busy or slow), too few to show an answer running at its own speed when it was cut; rerun "
            "`voice-llm cancel` when the machine is idle"
        )
    evidence = Evidence(ctx.capabilities)
    evidence.client("received_tokens", "closed_at_ms", "token_ms")
    logged = _cancel_logged(ctx.server_log, offset)
    document = {
        "max_tokens": MAX_TOKENS,
        "received_tokens": len(result.chunks),
        "closed_at_ms": result.closed_at_ms,
        "slot_idle_after_ms": evidence.take("slot_idle_after_ms", idle_ms, source, reason),
        "cancel_logged": evidence.take("cancel_logged", logged, "server log",
                                       "the server's log is not ours to read (a server given by --url)"),
        "token_ms": ms_per_token(result.chunks),
        "poll_interval_ms": POLL_INTERVAL_S * 1000.0,
        "raw": f"{RAW_DIR}/cancel{suffix}.sse",  # which stream this cut is, when the document is another repeat
        "chunks": [chunk.as_dict() for chunk in result.chunks],
        **evidence.as_dict(),
    }
    # A cancelled request never sends timings; the server was busy with it until its slot went idle. When that
    # cannot be seen, its compute is unknown and not counted (a server without timings shows no compute at all).
    if idle_ms is not None:
        ctx.ledger.add_busy((result.closed_at_ms or 0.0) + idle_ms)
    return document


RANGE_FIELDS = ("received_tokens", "closed_at_ms", "slot_idle_after_ms")


def summary_document(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    # The median cut by the slot's idle time; by the close time when the server's stop was not observable; by the
    # tokens received when an answer ended before the cut (its close is null).
    by = next(key for key in ("slot_idle_after_ms", "closed_at_ms", "received_tokens")
              if all(r[key] is not None for r in repeats))
    middle = stats.median_index([r[by] for r in repeats])
    document = {**repeats[middle], **stats.summarize(repeats, RANGE_FIELDS, RANGE_FIELDS)}
    # The median repeat's own values, not each field's median: together they are one cut (and its chunks).
    document.update({key: repeats[middle][key] for key in RANGE_FIELDS})
    # One 'cancel task' missing from the log is a failed cancel, whichever repeat it was.
    logged = [r.get("cancel_logged") for r in repeats]
    document["cancel_logged"] = False if False in logged else repeats[middle].get("cancel_logged")
    document["median_repeat"] = middle + 1
    document["repeats"] = repeats
    return document


def measure_retrying(ctx: LabContext, number: int) -> dict[str, Any]:
    """One repeat's cut, made again when the machine stalled the answer before the cut (with three repeats on a
    shared machine one stall would otherwise throw away the other cuts); the count of such cuts is kept."""
    for attempt in range(1, CUT_ATTEMPTS + 1):
        try:
            document = measure(ctx, number)
        except TooEarlyCutError:
            if attempt == CUT_ATTEMPTS:
                raise
            time.sleep(CUT_RETRY_PAUSE_S)
            continue
        document["discarded_cuts"] = attempt - 1
        return document
    raise AssertionError("unreachable")


def run(ctx: LabContext) -> list[Path]:
    repeats = [measure_retrying(ctx, number) for number in range(1, ctx.options.repeat + 1)]
    return [ctx.write_json(CANCEL, summary_document(repeats))]
