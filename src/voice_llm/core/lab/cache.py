"""Step 5: the KV cache — the same long prompt twice, then one line changed at the end and at the front.

With ``--repeat N`` the whole sequence (hi, first, second, changed_suffix, changed_prefix) is made N times, in
that order each time; each case's brief fields are the medians over the repeats, with ``_min``/``_max`` beside
the times, and ``repeats`` keeps every sequence as measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from voice_llm.core.scenario import brief, prompts
from voice_llm.core.util import stats
from voice_llm.core.util.artifacts import CACHE
from voice_llm.core.errors import MeasurementError
from voice_llm.core.scenario.kb import load_kb
from voice_llm.core.run.context import LabContext
from voice_llm.core.lab.evidence import SOURCE_TIMINGS, Evidence, timing

CASES = ("first", "second", "changed_suffix", "changed_prefix")
MEDIAN_FIELDS = ("prompt_n", "cache_n", "ttft_ms", "total_ms")
RANGE_FIELDS = ("ttft_ms", "total_ms")


def measure(ctx: LabContext, system: str, number: int = 1,
            evidence: Evidence | None = None) -> dict[str, dict[str, Any]]:
    """One sequence in the brief's order; ``number`` is the repeat (it names the raw streams)."""
    suffix = stats.repeat_suffix(number)
    question = prompts.SATURDAY_QUESTION
    # The slot reuses the longest common token prefix with whatever it holds, so the order is the experiment:
    # 'hi' empties it; 'second' follows the identical 'first'; 'changed_suffix' must follow a request with the
    # unchanged long prompt (after changed_prefix it would measure a miss); 'changed_prefix' differs from the
    # first token on, so it misses whatever came before.
    ctx.request(f"cache-empty-slot{suffix}", prompts.chat(prompts.ONE_SENTENCE_SYSTEM, prompts.SLOT_FILLER),
                max_tokens=8)
    plan = prompts.cache_variants(system)
    measured: dict[str, dict[str, Any]] = {}
    # Without the server's timings the token counts are null (with the reason) and only the client's times
    # show the reuse; a server's usage.prompt_tokens counts the whole prompt, cached or not, so it is not used.
    evidence = evidence or Evidence(ctx.capabilities)
    for name, variant in plan:
        result = ctx.request(f"cache-{name}{suffix}", prompts.chat(variant, question), max_tokens=64,
                             cache_prompt=True)
        if result.ttft_ms is None:
            raise MeasurementError(f"cache {name}: the answer had no content chunk")
        measured[name] = {
            "prompt_n": evidence.take("prompt_n", timing(result, "prompt_n"), SOURCE_TIMINGS, evidence.cache_reason()),
            "cache_n": evidence.take("cache_n", timing(result, "cache_n"), SOURCE_TIMINGS, evidence.cache_reason()),
            "ttft_ms": result.ttft_ms,
            "total_ms": result.total_ms,
        }
    return measured


def run(ctx: LabContext) -> list[Path]:
    # The same documents as prefill's largest point: attaching the whole KB would measure a different prompt and,
    # with a large KB, overflow the context after minutes of work (the pipeline checks the fit before the run).
    docs = load_kb(ctx.kb_dir, need=brief.CACHE_DOCS)[: brief.CACHE_DOCS]
    system = prompts.with_docs(prompts.ONE_SENTENCE_SYSTEM, docs)
    evidence = Evidence(ctx.capabilities)
    evidence.client("ttft_ms", "total_ms")
    repeats = [measure(ctx, system, number, evidence) for number in range(1, ctx.options.repeat + 1)]
    document: dict[str, Any] = {
        case: stats.summarize([sequence[case] for sequence in repeats], MEDIAN_FIELDS, RANGE_FIELDS)
        for case in CASES
    }
    document["order"] = ["hi", *CASES]
    document["repeats"] = repeats
    document.update(evidence.as_dict())
    return [ctx.write_json(CACHE, document)]
