"""A dial run in the core's tables: its key numbers (report.json's heard mouth-to-ear median and p90, barge-in heard
after the onset, heard minus the agent's own number, the count of cut-offs) and its metrics for ``voice-llm compare``
(the heard mouth-to-ear and the barge-in's heard time, with their samples). Registered as ``key_numbers=`` and ``metrics=``
in voice_llm.capabilities.dial.CAPABILITY.

How the turns of one call are treated (issue 31 item 5): each heard turn is one sample. The turns of a call are
different lines answered by different replies, not repeats of one measurement, so their spread holds the lines'
differences as well as the line's noise; compare's rules apply to them unchanged (the rank test from five turns a
side, else the ranges, a single turn "cannot tell"), which makes a verdict on two calls conservative: a change is
significant only when it stands out of the line-to-line variation. For the same reason their spread is not taken
as the machine's noise (``Metric.repeats`` False: voice_llm.core.analysis.noise leaves it out). The number compared is the summary's median;
a summary that is not the median of its own turns is refused (ArtifactError), never compared: compare then names
the metric as measured in one run only, and ``check`` fails the file.
"""

from __future__ import annotations

from typing import Any

from voice_llm.core.analysis.keynumbers import KeyNumber
from voice_llm.core.analysis.metrics import Metric, number
from voice_llm.capabilities.dial.doc import DialDoc, Spread
from voice_llm.core.errors import ArtifactError
from voice_llm.core.util import stats
from voice_llm.core.util.artifacts import DIAL

HEARD_KEY = "heard_mouth_to_ear_ms"
BARGE_KEY = "barge_in_heard_after_onset_ms"
CUT_OFFS_KEY = "cut_offs"


def _stated(block: Spread | None, key: str, samples: list[float]) -> float:
    """The summary's median of ``key``, which must be the median of ``samples`` (the one median rule)."""
    if block is None or block.median is None or not samples:
        raise ArtifactError(f"{DIAL} has no {key} median to compare")
    median = number(block.median)
    if median != stats.median(samples):
        raise ArtifactError(f"{DIAL} summary.{key}.median {median:g} is not the median of its turns "
                            f"({stats.median(samples):g}): `voice-llm check` fails it; not compared")
    return median


def read_heard(raw: Any) -> tuple[float, list[float]]:
    """(the summary's median heard gap, every heard turn's gap): one sample per heard turn."""
    doc = DialDoc.parse(raw)
    samples = doc.heard_gaps()
    return _stated(doc.summary.heard_gap_ms if doc.summary else None, "heard_gap_ms", samples), samples


def read_barge_in(raw: Any) -> tuple[float, list[float]]:
    """(the summary's median heard-after-onset, every barge-in's): one sample per barged-in turn."""
    doc = DialDoc.parse(raw)
    samples = [b.heard_after_onset_ms for _, _, b in doc.barge_ins() if b.heard_after_onset_ms is not None]
    return _stated(doc.summary.barge_in_heard_after_onset_ms if doc.summary else None,
                   "barge_in_heard_after_onset_ms", samples), samples


def metrics() -> tuple[Metric, ...]:
    """What the caller hears: the silence after they stop talking, and the audio still heard after they cut in.
    Both delay what the caller hears (audible), so a change of NOTICE_MS or more is "a listener would notice"."""
    return (
        Metric(HEARD_KEY, "heard mouth-to-ear", "ms", DIAL, True, read_heard, repeats=False),
        Metric(BARGE_KEY, "barge-in heard after onset", "ms", DIAL, True, read_barge_in, repeats=False),
    )


def key_numbers() -> tuple[KeyNumber, ...]:
    """report.json's fields of a dial run (only when dial.json is there). A median of nothing is null there
    (dial.json writes ``{"median": null, "n": 0}``). The heard mouth-to-ear's median and p90 are the report's
    headline (voice_llm.core.analysis.keynumbers.headline): the caller's number, measured at the caller's ear on a real
    line (the lab's converse step, or `voice-llm dial`)."""
    return (
        KeyNumber(HEARD_KEY, "heard mouth-to-ear, median over turns", "ms", DIAL,
                  ("summary", "heard_gap_ms", "median"), optional=True, headline="median"),
        KeyNumber("heard_mouth_to_ear_p90_ms", "heard mouth-to-ear, p90 over turns", "ms", DIAL,
                  ("summary", "heard_gap_ms", "p90"), optional=True, headline="p90"),
        KeyNumber(BARGE_KEY, "barge-in: audio heard after the caller cut in (median)", "ms", DIAL,
                  ("summary", "barge_in_heard_after_onset_ms", "median"), optional=True),
        KeyNumber("heard_minus_reported_ms", "heard minus the agent's own latency (median): the line's share", "ms",
                  DIAL, ("summary", "heard_minus_reported_ms", "median"), optional=True),
        # a count, not a time (no compare metric: one call's turns are 0 or 1 each, nothing for a rank test); null
        # when no turn's heard channel could show it (dial.json's unknown says why)
        KeyNumber(CUT_OFFS_KEY, "cut-offs: turns the agent was heard inside the caller's line", "turns", DIAL,
                  ("summary", "cut_offs"), optional=True),
    )
