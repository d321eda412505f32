"""Checks of call.json (one call of six turns, cache on and off), from the files alone.

Each check takes the run folder (a RunFolder read once, or its path), returns the detail it verified or raises
voice_llm.core.checks.base's :class:`CheckFailed` with the numbers that broke the relation (or :class:`NotCheckable`).
Every relation here is an invariant: times of one answer on one clock, token counts, the brief's cache hit < no
cache; a file that measured nothing (no turn) or holds impossible numbers (negative, inf, NaN) fails, it is no
evidence. Registered in voice_llm.capabilities.conversation.CAPABILITY, so `call` is checked whatever else is left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from voice_llm.core.checks.base import CheckFailed, NotCheckable, finite_number, require
from voice_llm.core.run.folder import RunFolder
from voice_llm.core.util.artifacts import CALL
from voice_llm.core.util.stats import median

__all__ = ["CheckFailed", "NotCheckable", "check_call_cache_keeps_turns_fast", "check_call_order",
           "check_call_same_prompts"]
_require = require
_CALL_TIMES = ("ttft_ms", "first_sentence_ms", "total_ms")


def _runs(out: RunFolder | Path) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]], int]:
    doc = RunFolder.of(out).json(CALL)
    on, off, turns = doc["cache_on"], doc["cache_off"], len(doc["turns"])
    _require(turns > 0, f"{CALL} scripts no turn: nothing was measured")
    _require(len(on) == turns and len(off) == turns,
             f"{turns} turns scripted, {len(on)} with the cache on and {len(off)} with it off")
    for label, rows in (("cache on", on), ("cache off", off)):
        for row in rows:
            for key in _CALL_TIMES:
                if key == "first_sentence_ms" and row[key] is None:
                    continue
                _require(finite_number(row[key], f"{label} turn {row['turn']} {key}") >= 0,
                         f"{label} turn {row['turn']}: {key} {row[key]} is negative")
    return on, off, turns


def check_call_order(out: RunFolder | Path) -> str:
    """Invariant: ttft <= first sentence <= total, the times of one answer on one clock."""
    on, off, turns = _runs(out)
    for label, rows in (("cache on", on), ("cache off", off)):
        for row in rows:
            first = row["first_sentence_ms"]
            _require(row["ttft_ms"] <= (first if first is not None else row["total_ms"]) <= row["total_ms"],
                     f"{label} turn {row['turn']}: ttft {row['ttft_ms']:.1f} <= first sentence {first} <= "
                     f"total {row['total_ms']:.1f} ms does not hold")
    return f"ttft <= first sentence <= total in all {2 * turns} turns"


def _unknown(out: RunFolder | Path, key: str) -> str | None:
    """Why call.json's ``key`` is null, as the step wrote it (``unknown``: a server without llama-server's
    timings); None when the file says nothing (one from before ``unknown``, or the number was measured)."""
    unknown = RunFolder.of(out).json(CALL).get("unknown")
    reason = unknown.get(key) if isinstance(unknown, Mapping) else None
    return reason if isinstance(reason, str) and reason else None


def check_call_same_prompts(out: RunFolder | Path) -> str:
    """The cache-off run replays the cache-on conversation, so each turn's prompt has the same tokens:
    what the cache-on turn prefilled plus what it reused equals what the cache-off turn prefilled. Invariant:
    token counts, the same for any machine. Not checkable without them (a server with no timings)."""
    on, off, turns = _runs(out)
    if any(row["prompt_n"] is None for row in (*on, *off)):
        why = _unknown(out, "prompt_n") or "the server does not report the tokens it computed"
        raise NotCheckable(f"prompt_n is null: {why}")
    for a, b in zip(on, off):
        _require(b["cache_n"] in (0, None), f"cache off turn {b['turn']} reused {b['cache_n']} tokens")
        _require(a["prompt_n"] + (a["cache_n"] or 0) == b["prompt_n"],
                 f"turn {a['turn']}: cache on {a['prompt_n']} + {a['cache_n']} cached != cache off {b['prompt_n']}")
    grows = all(later["prompt_n"] > earlier["prompt_n"] for earlier, later in zip(off, off[1:]))
    _require(grows, f"the conversation did not grow turn by turn: {[r['prompt_n'] for r in off]}")
    return f"same prompts in both runs, growing {off[0]['prompt_n']} -> {off[-1]['prompt_n']} tokens"


def check_call_cache_keeps_turns_fast(out: RunFolder | Path) -> str:
    """Invariant (the brief's cache hit < no cache): every later cache-on turn reused tokens, and its median
    first-token time is below the cache-off turns'."""
    on, off, turns = _runs(out)
    _require(turns >= 2, "fewer than two turns: nothing to reuse")
    counted = all(row["cache_n"] is not None for row in on[1:])  # null: the server does not say what it reused
    for row in on[1:]:
        _require(not counted or row["cache_n"] > 0, f"cache on turn {row['turn']} reused nothing (cache_n 0)")
    hit = median([r["ttft_ms"] for r in on[1:]])  # the project's one median rule, as the report's
    miss = median([r["ttft_ms"] for r in off[1:]])
    cache_off = _unknown(out, "cache_off")
    if cache_off is not None:
        # The server may have reused the cache in the cache-off run too (cache_prompt is llama-server's field, and
        # no cache_n shows it was honoured): the comparison would rest on the server, not on the evidence.
        raise NotCheckable(f"{cache_off}; turns 2-{turns}: median ttft {hit:.0f} ms with the cache, {miss:.0f} ms "
                           "in the run asked not to use it")
    _require(hit < miss, f"turns 2-{turns}: median ttft {hit:.0f} ms with the cache, {miss:.0f} ms without")
    reused = "" if counted else " (cache_n not reported by the server)"
    return f"turns 2-{turns}: median ttft {hit:.0f} ms with the cache vs {miss:.0f} ms without{reused}"
