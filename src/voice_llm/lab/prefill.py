"""Step 4: 0, 4 and 12 documents in the system prompt, cache off — what a longer prompt costs before the first word."""

from __future__ import annotations

from pathlib import Path

from voice_llm import brief, prompts
from voice_llm.artifacts import PREFILL
from voice_llm.errors import MeasurementError
from voice_llm.kb import load_kb
from voice_llm.lab.context import LabContext

DOC_COUNTS = brief.PREFILL_DOC_COUNTS


def run(ctx: LabContext) -> list[Path]:
    docs = load_kb(ctx.kb_dir, need=max(DOC_COUNTS))
    rows = []
    for count in DOC_COUNTS:
        system = prompts.with_docs(prompts.ONE_SENTENCE_SYSTEM, docs[:count])
        # cache_prompt False: otherwise the part shared with the previous request is skipped and blurs the cost.
        result = ctx.request(f"prefill-{count}docs", prompts.chat(system, prompts.SATURDAY_QUESTION),
                             max_tokens=brief.PREFILL_MAX_TOKENS, cache_prompt=False)
        timings = result.timings or {}
        if result.ttft_ms is None or "prompt_n" not in timings:
            raise MeasurementError(f"prefill with {count} documents: no content chunk or no timings in the answer")
        rows.append({
            "docs": count,
            "prompt_n": timings["prompt_n"],
            "prompt_ms": timings["prompt_ms"],
            "ttft_ms": result.ttft_ms,
            "cache_n": timings.get("cache_n"),
            "total_ms": result.total_ms,
        })
    return [ctx.write_json(PREFILL, rows)]
