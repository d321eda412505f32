"""After the hang-up, dial keeps its OTLP receiver open until the agent's spans report every line it spoke
(voice_llm.dial.step._settle), not only until the receiver has been quiet for half a second: a starved agent (seen:
the preemptive agent at nice 10 on a busy machine) exports its turn span later than that, and the turn would lose
the agent's numbers. The spans here are posted by a thread to a real receiver, late on purpose."""

from __future__ import annotations

import threading
import time

from fakeagent import _post, span_body

from voice_llm.dial import otlp
from voice_llm.dial.step import Tracing, _settle

LATE_S = 1.2  # later than the 0.5 s of quiet the old rule waited for, well inside the caps


def _post_later(tracing: Tracing, turns: list[int], delay_s: float,
                cancel: threading.Event | None = None) -> threading.Thread:
    def post() -> None:
        if (cancel or threading.Event()).wait(delay_s):
            return
        for turn in turns:
            now = time.perf_counter()
            _post(tracing.endpoint, span_body(turn, now - 1.0, now))

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread


def test_a_turn_span_exported_after_half_a_second_of_silence_is_kept() -> None:
    tracing = Tracing("127.0.0.1:0")
    try:
        poster = _post_later(tracing, [1], LATE_S)
        _settle(tracing, turns=1)
        assert otlp.reporting_spans(tracing.receiver.spans()) == 1
        poster.join(5)
    finally:
        tracing.stop()


def test_the_wait_goes_on_until_every_line_has_its_span() -> None:
    tracing = Tracing("127.0.0.1:0")
    try:
        _post_later(tracing, [1], 0.0).join(5)  # the first turn's span, at its turn's end
        poster = _post_later(tracing, [2], LATE_S)  # the last one, late after the hang-up
        _settle(tracing, turns=2)
        assert otlp.reporting_spans(tracing.receiver.spans()) == 2
        poster.join(5)
    finally:
        tracing.stop()


def test_an_agent_that_sends_nothing_is_waited_for_only_up_to_the_silent_cap() -> None:
    """Bounded: with no body at all, _settle returns at its silent cap (here 0.3 s), long before a span that would
    come at 60 s (cancelled afterwards)."""
    tracing = Tracing("127.0.0.1:0")
    cancel = threading.Event()
    try:
        poster = _post_later(tracing, [1], 60.0, cancel)
        _settle(tracing, turns=1, silent_cap_s=0.3)
        assert otlp.reporting_spans(tracing.receiver.spans()) == 0
    finally:
        cancel.set()
        poster.join(5)
        tracing.stop()
