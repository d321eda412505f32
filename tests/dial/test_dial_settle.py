"""After the hang-up, dial keeps its OTLP receiver open until the agent's spans report every line it spoke
(voice_llm.capabilities.dial.step._settle), not only until the receiver has been quiet for half a second: a starved agent (seen:
the preemptive agent at nice 10 on a busy machine) exports its turn span later than that, and the turn would lose
the agent's numbers. The spans here are posted by a thread to a real receiver, late on purpose."""

from __future__ import annotations

import threading
import time

import pytest
from fakeagent import _post, span_body

from voice_llm.capabilities.dial import otlp
from voice_llm.capabilities.dial.step import Tracing, _settle

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


@pytest.mark.parametrize("early, late", [([], [1]), ([1], [2])], ids=["the only span late", "the last of two late"])
def test_every_lines_span_is_kept_when_the_last_comes_after_half_a_second_of_silence(early: list[int],
                                                                                     late: list[int]) -> None:
    tracing = Tracing("127.0.0.1:0")
    try:
        _post_later(tracing, early, 0.0).join(5)  # the earlier turns' spans, each at its turn's end
        poster = _post_later(tracing, late, LATE_S)  # the last one, late after the hang-up
        _settle(tracing, turns=len(early) + len(late))
        assert otlp.reporting_spans(tracing.receiver.spans()) == len(early) + len(late)
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
