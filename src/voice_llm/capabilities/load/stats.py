"""What a load step showed, computed from its raw per-turn samples alone (never from Locust's histogram).

Pure and standard library only: the master uses it to decide when to stop, the `load` command to write
load.json, and `check` to recompute load.json from the raw samples CSV.

Rules (docs/load.md "Calls under load"):
* a step's measured turns are those that *started* in its measured window (phase ``measure``); warm-up and
  drain turns are kept in the CSV but never counted;
* a turn the caller barged in on (``cancelled``) is not a failure; if the cut came before its first sentence it
  has no first-sentence time and is left out of goodput and of the first-sentence percentiles;
* goodput = turns with no error and the first sentence within the budget / turns that could be judged;
* the sweep stops after a step whose first-sentence p90 exceeds the budget or whose errors exceed 1 %;
* verdict: max callers = the largest step with goodput >= 95 % over at least MIN_JUDGED_TURNS judged turns; with
  no step that has that many, there is no verdict (and the line says how to get one).

Dialing callers (``load --dial URL``, metric ``heard_gap_ms``): the same rules on the heard gap each caller's ear
measured (dial.json turns[i].heard.gap_ms) instead of the first sentence; a call the agent refused (close code
1013) or that failed is an error sample (never a slow turn); a caller whose dialer fell more than
LATE_FRAMES_SHARE of its frames behind real time makes its step generator-bound.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from voice_llm.core.util import stats  # standard library only, like this module
from voice_llm.core.util.stats import gaps_ms, percentile  # the one nearest-rank rule; p50 is the median

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
# The misses MIN_JUDGED_TURNS judged turns may hold and still pass GOODPUT_TARGET: 1 of 20.
ALLOWED_MISSES = MIN_JUDGED_TURNS - math.ceil(GOODPUT_TARGET * MIN_JUDGED_TURNS - 1e-9)
PERCENTILES = (50, 90, 99)
# The metric each mode judges its turns on (the sample's column), and the SLO's name in load.json.
TEXT_METRIC = "first_sentence_ms"
DIAL_METRIC = "heard_gap_ms"
# A dialer tick that runs more than one 20 ms frame late is a late frame (dial.json playout.late_frames; the
# recording never skips one, so the gaps stay on the call clock, but the caller's audio went out late). Above 1 %
# of a call's frames the caller was not keeping real time: its step measured the generator, not the agent.
LATE_FRAMES_SHARE = 0.01

# The stages of voice-llm's agent's per-turn breakdown (agent/server.py Turn: VAD speech end -> first audio sent,
# exported as voice_llm.breakdown.<stage>_ms on its invoke_agent span), in the order they happen in a turn.
AGENT_STAGES = ("endpoint_wait", "stt", "handoff", "request_to_first_token", "first_token_to_first_segment",
                "segment_to_first_audio", "audio_to_sent")
# How the verdict line and the report name each stage.
STAGE_LABELS = {"endpoint_wait": "end-of-turn wait", "stt": "STT", "handoff": "hand-offs",
                "request_to_first_token": "LLM first token", "first_token_to_first_segment": "LLM first clause",
                "segment_to_first_audio": "TTS", "audio_to_sent": "sending"}
# A stage "grew" from the first step only by more than this (ms): below it the difference is one frame of the
# agent's 32 ms VAD window or scheduling noise on a loaded machine, not a saturating stage.
STAGE_GROWTH_MIN_MS = 40.0


def stage_column(stage: str) -> str:
    return f"agent_{stage}_ms"


# The raw sample, one row per turn; the CSV's columns in this order.
SAMPLE_FIELDS = (
    "slots", "step", "callers", "phase", "worker", "caller", "call", "turn", "start",
    "ttft_ms", "first_sentence_ms", "e2e_ms", "tokens", "itl_p50_ms", "itl_p99_ms",
    "prompt_n", "cache_n", "error", "cancelled", "prompt_ms",
    # dialing callers (load --dial): the call clock's speech end and first heard sound (ms since the call's
    # sample 0), the gap between them, the call's frames and late frames (on each of its turns), a refusal
    # (close code 1013), the barge-in on this turn's reply, the agent's own latency when its spans came
    "heard_gap_ms", "speech_end_ms", "first_sound_ms", "call_frames", "late_frames", "refused",
    "barge_in", "barge_in_heard_after_onset_ms", "agent_reported_ms",
    # the call's Twilio streamSid and the wall time of its call-clock 0 (the agent's spans are matched to the call
    # by the one and put on its clock by the other), and the agent's own stage times of this turn (its spans'
    # voice_llm.breakdown.<stage>_ms, load --dial --otlp-listen)
    "stream_sid", "t0_epoch_ns", *(f"agent_{stage}_ms" for stage in AGENT_STAGES),
    # why a turn the caller heard could not be timed (dial's late-tick rule: the caller's own tick ran late there);
    # such a turn is neither judged nor an error: the instrument missed it, not the agent (2026-12-07: one late tick
    # counted as an error had stopped a 2-caller step at 4.8 % errors whose judged turns passed)
    "unjudged",
)
DIAL_FIELDS = SAMPLE_FIELDS[SAMPLE_FIELDS.index("heard_gap_ms"):]


def _spread(values: Sequence[float]) -> dict[str, float | None]:
    return {f"p{q}": percentile(values, q) for q in PERCENTILES}


def _present(samples: Iterable[Mapping[str, Any]], key: str) -> list[float]:
    return [float(s[key]) for s in samples if s.get(key) is not None]


def judged(sample: Mapping[str, Any], metric: str = TEXT_METRIC) -> bool:
    """Can this turn be judged against the budget? Not if the caller cut it before its first sentence (a
    barge-in is the caller's choice, not the server's failure), nor a turn the caller heard but could not time
    (``unjudged``: its own tick ran late). An error (a refused call too) is judged: a miss."""
    if sample.get("unjudged"):
        return False
    return bool(sample.get("error")) or sample.get(metric) is not None


def good(sample: Mapping[str, Any], slo_ms: float, metric: str = TEXT_METRIC) -> bool:
    return not sample.get("error") and sample.get(metric) is not None and float(sample[metric]) <= slo_ms


def error_reasons(samples: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many turns failed with each error text (a refusal's text names the close code and the agent's reason)."""
    counts: dict[str, int] = {}
    for s in samples:
        if s.get("error"):
            counts[str(s["error"])] = counts.get(str(s["error"]), 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _calls(samples: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, int], Mapping[str, Any]]:
    """One sample per call (worker, caller, call): the call-level columns (frames, late frames) are on each turn."""
    calls: dict[tuple[str, str, int], Mapping[str, Any]] = {}
    for s in samples:
        if s.get("call_frames") is not None:
            calls.setdefault((str(s["worker"]), str(s["caller"]), int(s["call"])), s)
    return calls


def behind(sample: Mapping[str, Any]) -> bool:
    """Did this call's dialer fall behind real time (late frames above LATE_FRAMES_SHARE of its frames)?"""
    frames, late = sample.get("call_frames"), sample.get("late_frames")
    return bool(frames) and late is not None and late > LATE_FRAMES_SHARE * frames


def _dial_summary(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What only dialing callers have: the heard gaps, the dialers' real time, refusals, barge-ins honoured (the
    heard channel fell silent after the caller cut in: dial.json barge_in.heard_after_onset_ms is a number)."""
    calls = _calls(samples)
    barges = [s for s in samples if s.get("barge_in")]
    return {
        "heard_gap_ms": _spread(_present(samples, DIAL_METRIC)),
        "refused": sum(1 for s in samples if s.get("refused")),
        "calls": len(calls),
        "late_frames": sum(int(s["late_frames"] or 0) for s in calls.values()),
        "call_frames": sum(int(s["call_frames"]) for s in calls.values()),
        "calls_behind": sum(1 for s in calls.values() if behind(s)),
        "barge_ins": {"n": len(barges),
                      "honoured": sum(1 for s in barges if s.get("barge_in_heard_after_onset_ms") is not None),
                      "heard_after_onset_ms": _spread(_present(barges, "barge_in_heard_after_onset_ms"))},
        "agent_reported_ms": _spread(_present(samples, "agent_reported_ms")),
        # the agent's own stage times (its spans): the median of each stage over the step's turns that have it
        **agent_stages(samples),
    }


def agent_stages(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The median of each agent stage over the turns whose spans said it (one median rule), and how many turns
    that was; None for a stage no turn has (the agent sent no spans, or none matched)."""
    with_stages = [s for s in samples if not s.get("error") and any(
        s.get(stage_column(stage)) is not None for stage in AGENT_STAGES)]
    return {"agent_stage_turns": len(with_stages),
            "agent_stages_ms": {stage: _median(_present(with_stages, stage_column(stage))) for stage in AGENT_STAGES}}


def _median(values: Sequence[float]) -> float | None:
    return stats.median(values) if values else None


def stage_growth(steps: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Which agent stage grew most from the first step with stage times (1 caller, normally) to each later step:
    per later step the growth of each stage's median (ms), and the stage that grew most when it grew by more than
    STAGE_GROWTH_MIN_MS. None when fewer than two steps have stage times (nothing to compare)."""
    timed = [s for s in steps if s.get("agent_stage_turns")]
    if len(timed) < 2:
        return None
    base = timed[0]
    rows = []
    for step in timed[1:]:
        growth = {stage: round(step["agent_stages_ms"][stage] - base["agent_stages_ms"][stage], 3)
                  for stage in AGENT_STAGES if step["agent_stages_ms"].get(stage) is not None
                  and base["agent_stages_ms"].get(stage) is not None}
        most = max(growth, key=lambda stage: (growth[stage], -AGENT_STAGES.index(stage)), default=None)
        rows.append({"callers": step["callers"], "growth_ms": growth,
                     "grew_most": most if most is not None and growth[most] > STAGE_GROWTH_MIN_MS else None})
    return {"from_callers": base["callers"], "min_growth_ms": STAGE_GROWTH_MIN_MS, "steps": rows}


def saturating_stage(steps: Sequence[Mapping[str, Any]], at_callers: int | None) -> dict[str, Any] | None:
    """The stage that grew most at ``at_callers`` (the first step past the verdict; else the last step with stage
    times): {"stage", "callers", "growth_ms"}; None when no stage grew past STAGE_GROWTH_MIN_MS there. When the first
    step past the verdict is the first timed step itself (max callers = 0: nothing grew *to* it), the last step with
    stage times says which stage grows with the callers (a --no-stop sweep went on past it)."""
    growth = stage_growth(steps)
    if growth is None:
        return None
    if at_callers == growth["from_callers"]:
        at_callers = None
    rows = [r for r in growth["steps"] if at_callers is None or r["callers"] == at_callers]
    row = rows[-1] if rows else None
    if row is None or row["grew_most"] is None:
        return None
    return {"stage": row["grew_most"], "callers": row["callers"], "growth_ms": row["growth_ms"][row["grew_most"]],
            "from_callers": growth["from_callers"]}


def largest_stage(step: Mapping[str, Any]) -> dict[str, Any] | None:
    """The agent's largest stage (median ms over the step's turns with stage times) in one step: {"stage", "ms",
    "callers"}; None without stage times. What a verdict of 0 can still name: when the first step already misses
    the SLO nothing grew *to* it, but the stage that takes most of the gap at 1 caller is where to cut first."""
    times = {stage: ms for stage, ms in (step.get("agent_stages_ms") or {}).items()
             if stage in AGENT_STAGES and isinstance(ms, (int, float))}
    if not step.get("agent_stage_turns") or not times:
        return None
    stage = max(times, key=lambda s: (times[s], -AGENT_STAGES.index(s)))
    return {"stage": stage, "ms": times[stage], "callers": step["callers"]}


def largest_stage_words(steps: Sequence[Mapping[str, Any]]) -> str:
    """'; at 1 caller the agent's largest stage: STT 970 ms median of a 2178 ms heard gap' for the first judged step
    (what a verdict of 0 with nothing grown names: the verdict line and the report say it alike); '' without stage
    times."""
    first = next((s for s in steps if s.get("judged")), None)
    largest = largest_stage(first) if first else None
    if first is None or largest is None:
        return ""
    gap = (first.get("heard_gap_ms") or {}).get("p50")
    of = f" of a {gap:.0f} ms heard gap" if isinstance(gap, (int, float)) else ""
    return (f"; at {callers_text(largest['callers'])} the agent's largest stage: "
            f"{STAGE_LABELS.get(largest['stage'], largest['stage'])} {largest['ms']:.0f} ms median{of}")


def summarize_step(samples: Sequence[Mapping[str, Any]], slo_ms: float, window_s: float,
                   metric: str = TEXT_METRIC) -> dict[str, Any]:
    """Percentiles, errors, cancels and goodput of one step's measured turns, judged on ``metric`` (the first
    sentence of text callers; the heard gap of dialing callers, who also get their own numbers)."""
    turns = len(samples)
    errors = sum(1 for s in samples if s.get("error"))
    cancelled = sum(1 for s in samples if s.get("cancelled"))
    judged_turns = [s for s in samples if judged(s, metric)]
    good_turns = sum(1 for s in judged_turns if good(s, slo_ms, metric))
    dial = _dial_summary(samples) if metric == DIAL_METRIC else {}
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
        "error_reasons": error_reasons(samples),
        "unjudged": sum(1 for s in samples if s.get("unjudged")),
        **dial,
    }


def callers_text(n: Any) -> str:
    """"1 caller", "4 callers": a count of callers as every line of load says it."""
    return f"{n} caller{'' if n == 1 else 's'}"


def stop_reason(step: Mapping[str, Any], slo_ms: float, metric: str = TEXT_METRIC) -> str | None:
    """Why the sweep stops after this step, or None to go on."""
    p90 = step[metric]["p90"]
    if p90 is not None and p90 > slo_ms:
        what = "heard-gap" if metric == DIAL_METRIC else "first-sentence"
        return f"{what} p90 {p90:.0f} ms > budget {slo_ms:.0f} ms at {callers_text(step['callers'])}"
    if step["error_rate"] > MAX_ERROR_RATE:
        return f"errors {100 * step['error_rate']:.1f} % > {100 * MAX_ERROR_RATE:.0f} % at {callers_text(step['callers'])}"
    if step["turns"] == 0:
        return f"no turn started in the measured window at {callers_text(step['callers'])} (lengthen --step-s)"
    return None


def generator_bound(cpu: Mapping[str, Mapping[str, float]], summary: Mapping[str, Any] | None = None) -> bool:
    """Was any worker busier than GENERATOR_BOUND_SHARE of one core during the measured window, or (dialing
    callers, ``summary`` of the step) did a caller's dialer fall behind real time?"""
    return any(w.get("share", 0.0) >= GENERATOR_BOUND_SHARE for w in cpu.values()) or \
        bool((summary or {}).get("calls_behind"))


def limited_by(step: Mapping[str, Any], slots: int | None) -> str:
    """The most likely limit of a step that missed the goodput target, from what was recorded beside it."""
    if step.get("generator_bound"):
        return "generator"
    if step.get("refused"):
        return "the agent's call limit (calls refused, close code 1013)"
    if slots is not None and step["callers"] > slots:
        return "slots"
    busy = (step.get("host") or {}).get("cpu_busy")
    if busy is not None and busy >= HOST_BUSY_SHARE:
        return "cpu"
    return "agent" if "calls" in step else "server"  # a dialing step (it counts calls) measured the agent


def failed_early(step: Mapping[str, Any]) -> bool:
    """Has this step, on fewer than MIN_JUDGED_TURNS judged turns, already missed more than the target allows in
    MIN_JUDGED_TURNS (ALLOWED_MISSES)? Then any MIN_JUDGED_TURNS of its turns hold those misses too and goodput
    over them is below the target: the step fails whatever its remaining turns would have shown, the same result
    the 20-turn rule gives whenever this fires (so no bias towards failing, only sooner)."""
    judged_turns = step.get("judged", 0)
    return judged_turns < MIN_JUDGED_TURNS and judged_turns - step.get("good", 0) > ALLOWED_MISSES


def window_end(samples: Iterable[Mapping[str, Any]], step: int, slo_ms: float, metric: str = TEXT_METRIC,
               enough: int = MIN_JUDGED_TURNS, early: bool = False) -> str | None:
    """Why ``step``'s measured window ends now, from the turns of it reported so far: ``"judged"`` once
    ``enough`` of them are judged (a step can be judged on them: --step-s is only the longest window), ``"failed
    early"`` (``early``: dialing callers) once more missed than the target allows (:func:`failed_early`); None: go
    on. It depends on how many turns were reported, never on what the passing ones measured, and the drain then
    waits for every turn that started in the window, so the step's numbers are those of all its turns."""
    judged_turns = [s for s in samples if s.get("step") == step and s.get("phase") == "measure" and judged(s, metric)]
    if len(judged_turns) >= enough:
        return "judged"
    good_turns = sum(1 for s in judged_turns if good(s, slo_ms, metric))
    if early and failed_early({"judged": len(judged_turns), "good": good_turns}):
        return "failed early"
    return None


def short_of_turns(step: Mapping[str, Any], step_s: float, early: bool = False) -> str | None:
    """What the master says of a step whose longest window (``step_s``) ended before it could be judged; None for
    a step that was judged (:func:`decided`)."""
    if decided(step, early):
        return None
    return (f"{step.get('judged', 0)} judged turns when the longest window ({step_s:g} s) ended, fewer than the "
            f"{MIN_JUDGED_TURNS} a step is judged on: this step has no verdict")


def warmed(samples: Iterable[Mapping[str, Any]], step: int, callers: int) -> bool:
    """Has each of the step's ``callers`` finished a turn that started in its warm-up? A caller new to the step
    may land on a slot whose KV cache does not yet hold the system prompt: its first turn prefills the whole prompt
    (the 12 documents: ~3,000 tokens, 19 s on an idle 2-core box, 42 s on a loaded one), a one-time cost of a cold
    slot that stalls the other slots' decoding too; the measured window starts after it."""
    done = {(s.get("worker"), s.get("caller")) for s in samples if s.get("step") == step and s.get("phase") == "warmup"}
    return len(done) >= callers


def warm_callers(samples: Iterable[Mapping[str, Any]], step: int) -> int:
    """How many of the step's callers have finished a turn that started in its warm-up (:func:`warmed`)."""
    return len({(s.get("worker"), s.get("caller")) for s in samples
                if s.get("step") == step and s.get("phase") == "warmup"})


class WarmUpTooLong(Exception):
    """A caller finished no turn within the warm-up's cap: the window is not opened (its first turn, on a cold
    slot, would be judged)."""


def warm_up(wait: Callable[[float, Callable[[], bool]], None], samples: Callable[[], Sequence[Mapping[str, Any]]],
            step: int, callers: int, warmup_s: float, cap_s: float,
            clock: Callable[[], float] = time.monotonic) -> float:
    """The text callers' warm-up (docs/load.md): ``warmup_s``, and then until each of the ``callers`` has finished
    a turn that started in it (:func:`warmed`), however long a cold slot's prefill takes (82 s under load was seen);
    the measured window opens only then, so no caller's first, cold, turn of the step is judged, and a turn that
    started before the window opened is a warm-up turn, never judged. ``wait(seconds, enough)`` sleeps until
    ``enough()`` or the time is up. Returns the warm-up's length in seconds; raises WarmUpTooLong past ``cap_s``
    (a bound no turn outlives: each ends at its no-content timeout, as an error, which counts as finished)."""
    t0 = clock()
    wait(warmup_s, lambda: False)
    wait(max(0.0, cap_s - (clock() - t0)), lambda: warmed(samples(), step, callers))
    if not warmed(samples(), step, callers):
        done = warm_callers(samples(), step)
        raise WarmUpTooLong(f"{done} of {callers_text(callers)} finished a turn within the "
                            f"warm-up's {cap_s:.0f} s (its longest: a first turn's lead-in and no-content timeout "
                            "included); the measured window was not opened, as a cold slot's first turn would be "
                            "judged in it: is the server answering?")
    return clock() - t0


def decided(step: Mapping[str, Any], early: bool) -> bool:
    """Is the step judged: on at least MIN_JUDGED_TURNS turns, or (``early``: dialing callers) failed early."""
    return step.get("judged", 0) >= MIN_JUDGED_TURNS or (early and failed_early(step))


def verdict(steps: Sequence[Mapping[str, Any]], slots: int | None, early: bool = False) -> dict[str, Any]:
    """Max callers = the largest step with goodput >= 95 % over at least MIN_JUDGED_TURNS judged turns; and what
    limited the first step past it. ``max_callers`` is None (no verdict) when no step was judged on enough turns:
    a step with fewer can neither pass nor show a limit. ``early`` (dialing callers): a step that failed early
    (:func:`failed_early`) is judged too, a failing one."""
    enough = [s for s in steps if decided(s, early)]
    passing = [s for s in enough if s.get("judged", 0) >= MIN_JUDGED_TURNS and s["goodput"] is not None
               and s["goodput"] >= GOODPUT_TARGET]
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
        **({"failed_early": [s["callers"] for s in steps if failed_early(s)], "allowed_misses": ALLOWED_MISSES,
            # the agent's stage that grew most from the first step to the first step past the verdict (or to the
            # last step when none failed): what limits the agent, from its own spans (None: no spans, or no stage
            # grew past STAGE_GROWTH_MIN_MS)
            "saturating_stage": saturating_stage(steps, beyond[0]["callers"] if beyond else None)}
           if early else {}),
    }


def slots_label(slots: int | None) -> str:
    if slots is None:
        return "server at --url"
    return f"{slots} slot" if slots == 1 else f"{slots} slots"
