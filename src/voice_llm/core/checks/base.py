"""What a check is and what it can say, at the bottom of the checks: voice_llm.core.checks.core and every capability's
checks (tts.checks, repeats.checks, load.checks) import it, and it imports nothing of theirs (no import cycle).

A check is a function of the folder OUT (a :class:`voice_llm.core.run.folder.RunFolder`, or its path) that returns the
detail it verified, or raises (the core's and a capability's are registered alike, as
:class:`voice_llm.core.registry.CheckEntry`):

* :class:`CheckFailed` when an *invariant* is broken: a relation that holds on every honest run on any machine
  (times on one clock in order, a file equal to what it was derived from, token counts, a cut that cut, the
  brief's own relations first token < total, long prompt > short, cache hit < no cache). The run fails.
* :class:`Finding` when an *expectation* did not hold: a relation that depends on the machine or the model (which
  strategy is heard first, a time ratio, a time bound). It is reported with its numbers and never fails a run.
* :class:`NotCheckable` when the saved files cannot show the relation (the server did not expose a number).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PASS = "pass"
FAIL = "fail"
NOT_CHECKABLE = "not checkable"
FINDING = "finding"

_LABELS = {PASS: "PASS", FAIL: "FAIL", NOT_CHECKABLE: "N/C", FINDING: "FIND"}


@dataclass(frozen=True)
class CheckResult:
    """One relation: ``name`` says what was checked, ``detail`` the numbers it was checked on (or why it could
    not be). ``status`` is PASS, FAIL, FINDING (an expectation about the machine or model that did not hold here,
    with its numbers), or NOT_CHECKABLE when the files cannot show it — never a PASS."""

    name: str
    status: str
    detail: str

    @property
    def ok(self) -> bool:
        """Not failed: a finding and a relation that could not be checked did not fail either (counted apart)."""
        return self.status != FAIL

    @property
    def label(self) -> str:
        return _LABELS.get(self.status, "N/C")


class CheckFailed(Exception):
    """An invariant does not hold: the evidence is inconsistent. The message has the numbers."""


class NotCheckable(Exception):
    """Raised inside a check when the saved files cannot show the relation (the server did not expose it, ...);
    the message says why."""


class Finding(Exception):
    """An expectation that depends on the machine or the model did not hold on this run; the message has the
    numbers. Reported beside the passes and failures; never a failure."""


def require(condition: bool, detail: str) -> None:
    """An invariant: FAIL with ``detail`` when it does not hold."""
    if not condition:
        raise CheckFailed(detail)


def finite_number(value: Any, what: str) -> float:
    require(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
            f"{what} is not a finite number: {value!r}")
    return float(value)


def expect(condition: bool, detail: str, missed: list[str]) -> None:
    """An expectation: when it does not hold, ``detail`` joins ``missed`` (the check goes on with its invariants;
    :func:`unless_missed` turns what was missed into a finding at the end)."""
    if not condition:
        missed.append(detail)


def unless_missed(detail: str, missed: Sequence[str]) -> str:
    """The check's detail when every expectation held; else a :class:`Finding` naming what did not, with it."""
    if missed:
        raise Finding(f"{'; '.join(missed)} ({detail})")
    return detail
