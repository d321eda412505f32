"""load.json's top as one value: what its turns are judged on, typed once (voice_llm.core.run.blocks).

The rule "a dial sweep is judged on the heard gap, a text sweep on the first sentence" was worked out four times
(load/checks.py, load/report.py, load/compare.py, load/cli.py), each with its own idea of a file without a mode
(one of load_schema_version 1) or without a budget. Here it is :attr:`LoadDoc.judged_on`, read once from the
file's ``mode`` and its two budgets; the sweeps and their steps are kept as the file holds them (``sweeps``) for
the code that walks them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from voice_llm.capabilities.load.stats import DIAL_METRIC, TEXT_METRIC
from voice_llm.core.run.blocks import Document, as_is, flag, number, text, tuple_of, typed, whole
from voice_llm.core.util.artifacts import LOAD

__all__ = ["DIAL_MODE", "Judged", "LOAD_SCHEMA_VERSION", "LoadDoc", "TEXT_MODE", "judged_on"]

# load.json's own shape (beside the run's schema_version that run.meta.stamp adds): 2 added the dialing callers
# (mode "dial": judged on heard_gap_ms against slo_heard_ms) and each step's error_reasons; 3 the agent's stage
# times; 4: text steps end at their 20th judged turn and fail early as dialing ones do (the verdict's failed_early),
# window.ended/warmup_s; dialing steps keep the host CPU per process (``processes``: agent, server, workers, master)
# with the sweep's ``processes_found``, and the call each caller makes (caller.lines, think_ms, think_share); 5: a
# dialing turn heard but not timed (a late tick of its dialer) is neither judged nor an error: each step's
# ``unjudged`` counts them, the samples' ``unjudged`` column says why.
LOAD_SCHEMA_VERSION = 5

DIAL_MODE = "dial"  # load --dial: real calls on the line, each turn judged on the gap its caller heard
TEXT_MODE = "text"  # LLM requests judged on the first sentence (a file from before modes says none: text)


@dataclass(frozen=True)
class Judged:
    """What a sweep's turns are judged on: the samples' column (``metric``), its budget and its name."""

    metric: str
    slo_ms: float | None  # None: the file states no budget for it (check refuses that; compare says so)
    name: str
    budget_key: str  # the file's key of the budget

    @property
    def dialing(self) -> bool:
        return self.metric == DIAL_METRIC

    @property
    def callers(self) -> str:
        return "dialing callers" if self.dialing else "text callers"


@dataclass(frozen=True, kw_only=True)
class LoadDoc(Document):
    """load.json: a load run's settings, its verdicts per sweep (``sweeps``, as the file holds them)."""

    NAME: ClassVar[str] = LOAD
    SHAPE_KEY: ClassVar[str] = "load_schema_version"
    SHAPE: ClassVar[int] = LOAD_SCHEMA_VERSION
    load_schema_version: int | None = typed(whole)  # None: version 1, from before it was stated
    mode: str | None = typed(text)  # None: a file from before modes (text callers)
    metric: str | None = typed(text)
    dial_url: str | None = typed(text)
    slo_heard_ms: float | None = typed(number)
    late_frames_share: float | None = typed(number)
    window_ends: str | None = typed(text)
    warmup_ends: str | None = typed(text)
    slo_first_sentence_ms: float | None = typed(number)
    goodput_target: float | None = typed(number)
    max_error_rate: float | None = typed(number)
    generator_bound_share: float | None = typed(number)
    min_judged_turns: int | None = typed(whole)
    step_s: float | None = typed(number)
    warmup_s: float | None = typed(number)
    callers: tuple[int, ...] = typed(tuple_of(whole), default=())
    stop_on_budget: bool | None = typed(flag)  # None: a file from before --no-stop (it stopped on the budget)
    workers: Any = typed(as_is)  # how many local workers, or "remote"
    caller: Any = typed(as_is)
    samples_csv: str | None = typed(text)
    interrupted: str | None = typed(text)  # None: every planned sweep ran to its end
    sweeps: tuple[Any, ...] = typed(tuple_of(as_is), default=())

    @property
    def version(self) -> int:
        return self.load_schema_version if self.load_schema_version is not None else 1

    @property
    def dialing(self) -> bool:
        return self.mode == DIAL_MODE

    @property
    def judged_on(self) -> Judged:
        """The heard gap against slo_heard_ms for a dialing sweep (mode dial), else the first sentence against
        slo_first_sentence_ms: the one rule of what a sweep is judged on."""
        if self.dialing:
            return Judged(DIAL_METRIC, self.slo_heard_ms, "heard gap", "slo_heard_ms")
        return Judged(TEXT_METRIC, self.slo_first_sentence_ms, "first sentence", "slo_first_sentence_ms")


def judged_on(doc: LoadDoc | Mapping[str, Any]) -> Judged:
    """What the sweeps of ``doc`` (load.json, parsed or as read) are judged on: :attr:`LoadDoc.judged_on`."""
    return (doc if isinstance(doc, LoadDoc) else LoadDoc.parse(doc)).judged_on
