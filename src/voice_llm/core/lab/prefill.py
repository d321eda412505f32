"""Step 4: 0, 4 and 12 documents in the system prompt, cache off — what a longer prompt costs before the first word.

With ``--repeat N`` the three requests are made N times, interleaved (0, 4, 12, 0, 4, 12, ...) so a slow minute
on a shared machine hits every prompt size alike. Each row keeps every repeat in ``repeats``; its brief fields
are the medians, with ``_min``/``_max`` beside the times.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from voice_llm.core.scenario import brief, prompts
from voice_llm.core.util import stats
from voice_llm.core.util.artifacts import PREFILL
from voice_llm.core.errors import MeasurementError
from voice_llm.core.scenario.kb import KBDoc, load_kb
from voice_llm.core.run.context import LabContext
from voice_llm.core.lab.evidence import SOURCE_TIMINGS, Evidence, prompt_tokens, timing

DOC_COUNTS = brief.PREFILL_DOC_COUNTS
MEDIAN_FIELDS = ("prompt_n", "prompt_ms", "ttft_ms", "cache_n", "total_ms")
RANGE_FIELDS = ("prompt_ms", "ttft_ms", "total_ms")


def measure(ctx: LabContext, docs: list[KBDoc], count: int, number: int = 1) -> dict[str, Any]:
    """One request with the first ``count`` documents; ``number`` is the repeat (it names the raw stream)."""
    system = prompts.with_docs(prompts.ONE_SENTENCE_SYSTEM, docs[:count])
    # cache_prompt False: otherwise the part shared with the previous request is skipped and blurs the cost.
    result = ctx.request(f"prefill-{count}docs{stats.repeat_suffix(number)}",
                         prompts.chat(system, prompts.SATURDAY_QUESTION),
                         max_tokens=brief.PREFILL_MAX_TOKENS, cache_prompt=False)
    if result.ttft_ms is None:
        raise MeasurementError(f"prefill with {count} documents: the answer had no content chunk")
    # Without the server's timings (not llama-server) the counts and prefill time are null, with the reason.
    evidence = Evidence(ctx.capabilities)
    evidence.client("ttft_ms", "total_ms")
    evidence.note_cache_off()
    n, source = prompt_tokens(result)
    return {
        "prompt_n": evidence.take("prompt_n", n, source, evidence.prompt_reason()),
        "prompt_ms": evidence.take("prompt_ms", timing(result, "prompt_ms"), SOURCE_TIMINGS,
                                   "the stream carries no timings.prompt_ms: the first-token time stands for prefill"),
        "ttft_ms": result.ttft_ms,
        "cache_n": evidence.take("cache_n", timing(result, "cache_n"), SOURCE_TIMINGS, evidence.cache_reason()),
        "total_ms": result.total_ms,
        **evidence.as_dict(),
    }


def run(ctx: LabContext) -> list[Path]:
    docs = load_kb(ctx.kb_dir, need=max(DOC_COUNTS))
    measured: dict[int, list[dict[str, Any]]] = {count: [] for count in DOC_COUNTS}
    for number in range(1, ctx.options.repeat + 1):
        for count in DOC_COUNTS:
            measured[count].append(measure(ctx, docs, count, number))
    rows = [{"docs": count, **stats.summarize(repeats, MEDIAN_FIELDS, RANGE_FIELDS),
             "sources": repeats[0]["sources"], "unknown": repeats[0]["unknown"], "repeats": repeats}
            for count, repeats in measured.items()]
    return [ctx.write_json(PREFILL, rows)]
