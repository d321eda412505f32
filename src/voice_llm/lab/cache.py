"""Step 5: the KV cache — the same long prompt twice, then one line changed at the end and at the front."""

from __future__ import annotations

from pathlib import Path

from voice_llm import brief, prompts
from voice_llm.artifacts import CACHE
from voice_llm.errors import MeasurementError
from voice_llm.kb import load_kb
from voice_llm.lab.context import LabContext


def run(ctx: LabContext) -> list[Path]:
    # The same documents as prefill's largest point: attaching the whole KB would measure a different prompt and,
    # with a large KB, overflow the context after minutes of work (the pipeline checks the fit before the run).
    docs = load_kb(ctx.kb_dir, need=brief.CACHE_DOCS)[: brief.CACHE_DOCS]
    system = prompts.with_docs(prompts.ONE_SENTENCE_SYSTEM, docs)
    question = prompts.SATURDAY_QUESTION
    # The slot reuses the longest common token prefix with whatever it holds, so the order is the experiment:
    # 'hi' empties it; 'second' follows the identical 'first'; 'changed_suffix' must follow a request with the
    # unchanged long prompt (after changed_prefix it would measure a miss); 'changed_prefix' differs from the
    # first token on, so it misses whatever came before.
    ctx.request("cache-empty-slot", prompts.chat(prompts.ONE_SENTENCE_SYSTEM, prompts.SLOT_FILLER), max_tokens=8)
    plan = prompts.cache_variants(system)
    measured: dict[str, dict[str, float | int | None]] = {}
    for name, variant in plan:
        result = ctx.request(f"cache-{name}", prompts.chat(variant, question), max_tokens=64, cache_prompt=True)
        timings = result.timings or {}
        if result.ttft_ms is None or "prompt_n" not in timings:
            raise MeasurementError(f"cache {name}: no content chunk or no timings in the answer")
        measured[name] = {
            "prompt_n": timings["prompt_n"],
            "cache_n": timings.get("cache_n"),
            "ttft_ms": result.ttft_ms,
            "total_ms": result.total_ms,
        }
    document = {key: measured[key] for key in ("first", "second", "changed_suffix", "changed_prefix")}
    document["order"] = ["hi", *(name for name, _ in plan)]
    return [ctx.write_json(CACHE, document)]
