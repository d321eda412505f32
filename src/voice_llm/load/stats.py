"""What a load step showed, computed from its raw per-turn samples alone (never from Locust's histogram).

Pure and standard library only: the master uses it to decide when to stop, the `load` command to write
load.json, and `check` to recompute load.json from the raw samples CSV.

Rules (README "Calls under load"):
* a step's measured turns are those that *started* in its measured window (phase ``measure``); warm-up and
  drain turns are kept in the CSV but never counted;
* a turn the caller barged in on (``cancelled``) is not a failure; if the cut came before its first sentence it
  has no first-sentence time and is left out of goodput and of the first-sentence percentiles;
* goodput = turns with no error and the first sentence within the budget / turns that could be judged;
* the sweep stops after a step whose first-sentence p90 exceeds the budget or whose errors exceed 1 %;
* verdict: max callers = the largest step with goodput >= 95 % over at least MIN_JUDGED_TURNS judged turns; with
  no step that has that many, there is no verdict (and the line says how to get one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from voice_llm.util import stats  # standard library only, like this module
from voice_llm.util.stats import gaps_ms, percentile  # the one nearest-rank rule; p50 is the median

GOODPUT_TARGET = 0.95
MAX_ERROR_RATE = 0.01
# Locust runs a worker's users on one gevent loop: past this share of one core a worker's timestamps are read
# late (a greenlet resumes only when the loop gets to it), so the step measured the generator, not the server.
GENERATOR_BOUND_SHARE = 0.8
HOST_BUSY_SHARE = 0.9
# A step passes only on at least this many judged turns. 20 = 1 / (1 - GOODPUT_TARGET): the fewest turns on which
# goodput can tell 95 % from 100 %, i.e. one late turn is allowed and a second is not. Below it one turn decides
# the step (3 judged turns: one late one is 67 %), so the verdict would rest on chance.
MIN_JUDGED_TURNS = 20
PERCENTILES = (50, 90, 99)

# The raw sample, one row per turn; the CSV's columns in this order.
SAMPLE_FIELDS = (
    "slots", "step", "callers", "phase", "worker", "caller", "call", "turn", "start",
    "ttft_ms", "first_sentence_ms", "e2e_ms", "tokens", "itl_p50_ms", "itl_p99_ms",
    "prompt_n", "cache_n", "error", "cancelled", "prompt_ms",
)


def _spread(values: Sequence[float]) -> dict[str, float | None]:
    return {f"p{q}": percentile(values, q) for q in PERCENTILES}


def _present(samples: Iterable[Mapping[str, Any]], key: str) -> list[float]:
    return [float(s[key]) for s in samples if s.get(key) is not None]


def judged(sample: Mapping[str, Any]) -> bool:
    """Can this turn be judged against the first-sentence budget? Not if the caller cut it before its first
    sentence (a barge-in is the caller's choice, not the server's failure)."""
    return bool(sample.get("error")) or sample.get("first_sentence_ms") is not None


def good(sample: Mapping[str, Any], slo_ms: float) -> bool:
    return not sample.get("error") and sample.get("first_sentence_ms") is not None and \
        float(sample["first_sentence_ms"]) <= slo_ms


def summarize_step(samples: Sequence[Mapping[str, Any]], slo_ms: float, window_s: float) -> dict[str, Any]:
    """Percentiles, errors, cancels and goodput of one step's measured turns."""
    turns = len(samples)
    errors = sum(1 for s in samples if s.get("error"))
    cancelled = sum(1 for s in samples if s.get("cancelled"))
    judged_turns = [s for s in samples if judged(s)]
    good_turns = sum(1 for s in judged_turns if good(s, slo_ms))
    return {
        "turns": turns,
        "errors": errors,
        "cancelled": cancelled,
        "error_rate": errors / turns if turns else 0.0,
        "judged": len(judged_turns),
        "good": good_turns,
        "goodput": good_turns / len(judged_turns) if judged_turns else None,
        "good_turns_per_s": good_turns / window_s if window_s > 0 else None,
        "ttft_ms": _spread(_present(samples, "ttft_ms")),
        "first_sentence_ms": _spread(_present(samples, "first_sentence_ms")),
        # The step's spread of each turn's median gap; the worst turn's p99 gap beside it.
        "itl_ms": _spread(_present(samples, "itl_p50_ms")),
        "itl_p99_max_ms": max(_present(samples, "itl_p99_ms"), default=None),
        "workers": sorted({str(s["worker"]) for s in samples}),
    }


def stop_reason(step: Mapping[str, Any], slo_ms: float) -> str | None:
    """Why the sweep stops after this step, or None to go on."""
    p90 = step["first_sentence_ms"]["p90"]
    if p90 is not None and p90 > slo_ms:
        return f"first-sentence p90 {p90:.0f} ms > budget {slo_ms:.0f} ms at {step['callers']} callers"
    if step["error_rate"] > MAX_ERROR_RATE:
        return f"errors {100 * step['error_rate']:.1f} % > {100 * MAX_ERROR_RATE:.0f} % at {step['callers']} callers"
    if step["turns"] == 0:
        return f"no turn started in the measured window at {step['callers']} callers (lengthen --step-s)"
    return None


def generator_bound(cpu: Mapping[str, Mapping[str, float]]) -> bool:
    """Was any worker busier than GENERATOR_BOUND_SHARE of one core during the measured window?"""
    return any(w.get("share", 0.0) >= GENERATOR_BOUND_SHARE for w in cpu.values())


def limited_by(step: Mapping[str, Any], slots: int | None) -> str:
    """The most likely limit of a step that missed the goodput target, from what was recorded beside it."""
    if step.get("generator_bound"):
        return "generator"
    if slots is not None and step["callers"] > slots:
        return "slots"
    busy = (step.get("host") or {}).get("cpu_busy")
    if busy is not None and busy >= HOST_BUSY_SHARE:
        return "cpu"
    return "server"


def verdict(steps: Sequence[Mapping[str, Any]], slots: int | None) -> dict[str, Any]:
    """Max callers = the largest step with goodput >= 95 % over at least MIN_JUDGED_TURNS judged turns; and what
    limited the first step past it. ``max_callers`` is None (no verdict) when no step was judged on enough turns:
    a step with fewer can neither pass nor show a limit."""
    enough = [s for s in steps if s.get("judged", 0) >= MIN_JUDGED_TURNS]
    passing = [s for s in enough if s["goodput"] is not None and s["goodput"] >= GOODPUT_TARGET]
    best = max(passing, key=lambda s: s["callers"], default=None)
    max_callers = best["callers"] if best else (0 if enough else None)
    beyond = [s for s in enough if s["callers"] > (max_callers or 0) and s["goodput"] < GOODPUT_TARGET]
    limit = limited_by(beyond[0], slots) if beyond else None
    return {
        "max_callers": max_callers,
        "goodput_target": GOODPUT_TARGET,
        "limited_by": limit,
        "tested_up_to": max((s["callers"] for s in steps), default=0),
        "min_judged_turns": MIN_JUDGED_TURNS,
        # the turns the verdict rests on: the passing step's (or, with none passing, the judged steps' fewest)
        "judged_turns": best["judged"] if best else min((s["judged"] for s in enough), default=None),
        "judged_per_step": [s.get("judged", 0) for s in steps],
    }


def slots_label(slots: int | None) -> str:
    if slots is None:
        return "server at --url"
    return f"{slots} slot" if slots == 1 else f"{slots} slots"
