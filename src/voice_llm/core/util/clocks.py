"""The wall clock and perf_counter read as one instant.

Why: a span's times are epoch ns (OTLP), the call's are perf_counter; the offset between the two clocks is taken
by reading both. Read one after the other, a thread switch between the reads (the GIL's 5 ms interval, more on a
loaded 2-core machine) puts the whole switch into the offset: a test's agent and the dialer in one process under
``pytest -n 4`` saw a 69.6 ms "offset" between two readings of the same machine's clocks, and the receiver took it
for the sender's clock running ahead. So the wall clock is read between two perf_counter readings, a few times,
and the pair with the tightest bracket is taken (its perf time the bracket's middle): the error is then at most
half that bracket, microseconds unless every try was preempted.
"""

from __future__ import annotations

import time

TRIES = 5


def perf_and_epoch_ns() -> tuple[float, int]:
    """(perf_counter seconds, epoch ns) of one instant, as above."""
    best: tuple[float, float, int] | None = None
    for _ in range(TRIES):
        before = time.perf_counter()
        wall = time.time_ns()
        after = time.perf_counter()
        if best is None or after - before < best[0]:
            best = (after - before, (before + after) / 2, wall)
    assert best is not None
    return best[1], best[2]


def epoch_ns_of(perf: float) -> int:
    """The epoch ns of an earlier perf_counter reading ``perf``."""
    now_perf, now_wall = perf_and_epoch_ns()
    return now_wall - int((now_perf - perf) * 1e9)


__all__ = ["epoch_ns_of", "perf_and_epoch_ns"]
