"""Checks of call.json and of load.json against its raw samples, from the files alone.

Each check returns the detail it verified or raises :class:`CheckFailed` with the numbers that broke the
relation. load.json is recomputed from load_samples.csv with the same rules (voice_llm.load.stats): nearest-rank
percentiles are always one of the samples, and the CSV keeps every float exactly, so they must agree exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from voice_llm.artifacts import CALL, LOAD, LOAD_SAMPLES, inside, read_json
from voice_llm import spread
from voice_llm.load import stats
from voice_llm.load.samples import read_samples

WINDOW_SLACK_S = 2.0  # the phase message reaches a worker a little after the master's clock changed phase
_COMPARED = ("turns", "errors", "cancelled", "judged", "good", "goodput", "good_turns_per_s", "ttft_ms",
             "first_sentence_ms", "itl_ms", "itl_p99_max_ms", "workers")


class CheckFailed(Exception):
    """The relation does not hold; the message has the numbers."""


def _require(condition: bool, detail: str) -> None:
    if not condition:
        raise CheckFailed(detail)


# --- call.json ------------------------------------------------------------------------------------------------


def _runs(out: Path) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]], int]:
    doc = read_json(out / CALL)
    on, off, turns = doc["cache_on"], doc["cache_off"], len(doc["turns"])
    _require(len(on) == turns and len(off) == turns,
             f"{turns} turns scripted, {len(on)} with the cache on and {len(off)} with it off")
    return on, off, turns


def check_call_order(out: Path) -> str:
    on, off, turns = _runs(out)
    for label, rows in (("cache on", on), ("cache off", off)):
        for row in rows:
            first = row["first_sentence_ms"]
            _require(row["ttft_ms"] <= (first if first is not None else row["total_ms"]) <= row["total_ms"],
                     f"{label} turn {row['turn']}: ttft {row['ttft_ms']:.1f} <= first sentence {first} <= "
                     f"total {row['total_ms']:.1f} ms does not hold")
    return f"ttft <= first sentence <= total in all {2 * turns} turns"


def check_call_same_prompts(out: Path) -> str:
    """The cache-off run replays the cache-on conversation, so each turn's prompt has the same tokens:
    what the cache-on turn prefilled plus what it reused equals what the cache-off turn prefilled."""
    on, off, turns = _runs(out)
    for a, b in zip(on, off):
        _require(b["cache_n"] in (0, None), f"cache off turn {b['turn']} reused {b['cache_n']} tokens")
        _require(a["prompt_n"] + (a["cache_n"] or 0) == b["prompt_n"],
                 f"turn {a['turn']}: cache on {a['prompt_n']} + {a['cache_n']} cached != cache off {b['prompt_n']}")
    grows = all(later["prompt_n"] > earlier["prompt_n"] for earlier, later in zip(off, off[1:]))
    _require(grows, f"the conversation did not grow turn by turn: {[r['prompt_n'] for r in off]}")
    return f"same prompts in both runs, growing {off[0]['prompt_n']} -> {off[-1]['prompt_n']} tokens"


def check_call_cache_keeps_turns_fast(out: Path) -> str:
    on, off, turns = _runs(out)
    _require(turns >= 2, "fewer than two turns: nothing to reuse")
    for row in on[1:]:
        _require((row["cache_n"] or 0) > 0, f"cache on turn {row['turn']} reused nothing (cache_n {row['cache_n']})")
    hit = spread.median([r["ttft_ms"] for r in on[1:]])  # the project's one median rule, as the report's
    miss = spread.median([r["ttft_ms"] for r in off[1:]])
    _require(hit < miss, f"turns 2-{turns}: median ttft {hit:.0f} ms with the cache, {miss:.0f} ms without")
    return f"turns 2-{turns}: median ttft {hit:.0f} ms with the cache vs {miss:.0f} ms without"


# --- load.json ------------------------------------------------------------------------------------------------


def _load(out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    doc = read_json(out / LOAD)
    return doc, read_samples(inside(out, doc.get("samples_csv", LOAD_SAMPLES)))  # never a file outside OUT


def _measured(samples: Sequence[Mapping[str, Any]], slots: Any, step: int) -> list[Mapping[str, Any]]:
    return [s for s in samples if s["slots"] == slots and s["step"] == step and s["phase"] == "measure"]


def check_load_matches_samples(out: Path) -> str:
    doc, samples = _load(out)
    slo = doc["slo_first_sentence_ms"]
    count = 0
    for sweep in doc["sweeps"]:
        for step in sweep["steps"]:
            window = step["window"]
            again = stats.summarize_step(_measured(samples, sweep["slots"], step["step"]), slo,
                                         window["end"] - window["start"])
            for key in _COMPARED:
                _require(again[key] == step[key], f"slots {sweep['slots']}, {step['callers']} callers: {key} is "
                                                  f"{step[key]!r} in {LOAD} but {again[key]!r} from the samples")
            count += 1
    return f"{count} steps recomputed from {len(samples)} raw samples"


def check_load_verdict(out: Path) -> str:
    doc = read_json(out / LOAD)  # the verdict follows from load.json's steps: the raw samples are not needed
    verdicts = []
    for sweep in doc["sweeps"]:
        again = stats.verdict(sweep["steps"], sweep["slots"])
        _require(again == sweep["verdict"], f"slots {sweep['slots']}: verdict {sweep['verdict']} but the steps say {again}")
        if doc.get("stop_on_budget", True):
            reasons = [stats.stop_reason(s, doc["slo_first_sentence_ms"]) for s in sweep["steps"]]
            _require(all(r is None for r in reasons[:-1]), f"slots {sweep['slots']}: the sweep went on after {reasons}")
        callers = [s["callers"] for s in sweep["steps"]]
        _require(callers == sorted(set(callers)), f"slots {sweep['slots']}: steps not strictly upward: {callers}")
        verdicts.append(f"{sweep['slots']} slots: {again['max_callers']}")
    return "max callers " + ", ".join(verdicts)


def check_load_windows(out: Path) -> str:
    """Warm-up dropped: every counted turn started inside its step's measured window, every warm-up turn before it."""
    doc, samples = _load(out)
    for sweep in doc["sweeps"]:
        workers = {s["worker"] for s in samples if s["slots"] == sweep["slots"]}
        _require(workers <= set(sweep["workers"]), f"samples from workers not in the sweep: {workers - set(sweep['workers'])}")
        for step in sweep["steps"]:
            start, end = step["window"]["start"], step["window"]["end"]
            for s in (s for s in samples if s["slots"] == sweep["slots"] and s["step"] == step["step"]):
                if s["phase"] == "measure":
                    _require(start - WINDOW_SLACK_S <= s["start"] <= end + WINDOW_SLACK_S,
                             f"a measured turn started at {s['start']:.1f}, outside {start:.1f}..{end:.1f}")
                elif s["phase"] == "warmup":
                    _require(s["start"] <= start + WINDOW_SLACK_S, f"a warm-up turn started at {s['start']:.1f}, after {start:.1f}")
    return f"{len(samples)} samples in their windows"


def check_load_turn_order(out: Path) -> str:
    _, samples = _load(out)
    timed = [s for s in samples if s["ttft_ms"] is not None]
    for s in timed:
        first = s["first_sentence_ms"] if s["first_sentence_ms"] is not None else s["ttft_ms"]
        _require(s["ttft_ms"] <= first <= s["e2e_ms"],
                 f"{s['caller']} turn {s['turn']}: ttft {s['ttft_ms']:.1f} <= first sentence {s['first_sentence_ms']} "
                 f"<= end {s['e2e_ms']:.1f} ms does not hold")
    return f"ttft <= first sentence <= end in {len(timed)} turns"


CALL_CHECKS: tuple[tuple[str, Callable[[Path], str]], ...] = (
    ("call: ttft <= first sentence <= total", check_call_order),
    ("call: both runs send the same growing prompts", check_call_same_prompts),
    ("call: the cache keeps later turns fast", check_call_cache_keeps_turns_fast),
)
LOAD_CHECKS: tuple[tuple[str, Callable[[Path], str]], ...] = (
    ("load: every step recomputed from the raw samples", check_load_matches_samples),
    ("load: verdict and stop rule follow from the steps", check_load_verdict),
    ("load: warm-up dropped, turns in their windows", check_load_windows),
    ("load: ttft <= first sentence <= end per turn", check_load_turn_order),
)
# (name, the step whose artifacts it reads, check) for voice_llm.check: run only when the run includes the step.
CHECKS: tuple[tuple[str, str, Callable[[Path], str]], ...] = (
    *((name, "call", run) for name, run in CALL_CHECKS),
    *((name, "load", run) for name, run in LOAD_CHECKS),
)
