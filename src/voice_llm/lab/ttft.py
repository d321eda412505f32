"""Step 3: first-token latency five times with the cache off, and the medians."""

from __future__ import annotations

from pathlib import Path

from voice_llm import brief, prompts
from voice_llm.spread import median  # the brief's "third of the five sorted", the project's one rule
from voice_llm.artifacts import TTFT
from voice_llm.errors import MeasurementError
from voice_llm.lab.context import LabContext
from voice_llm.lab.evidence import Evidence, generated_tokens

RUNS = brief.TTFT_RUNS


def run(ctx: LabContext) -> list[Path]:
    messages = prompts.chat(prompts.ONE_SENTENCE_SYSTEM, prompts.NEW_PATIENT_QUESTION)
    evidence = Evidence(ctx.capabilities)
    evidence.client("ttft_ms", "total_ms")
    evidence.note_cache_off()
    runs = []
    for number in range(1, RUNS + 1):
        result = ctx.request(f"ttft-{number}", messages, max_tokens=brief.DEFAULT_MAX_TOKENS, cache_prompt=False)
        if result.ttft_ms is None:
            raise MeasurementError(f"ttft run {number}: the answer had no content chunk")
        tokens, source = generated_tokens(result)
        evidence.take("tokens", tokens, source, "")
        runs.append({"ttft_ms": result.ttft_ms, "total_ms": result.total_ms, "tokens": tokens})
    document = {
        "runs": runs,
        "ttft_p50": median([r["ttft_ms"] for r in runs]),
        "total_p50": median([r["total_ms"] for r in runs]),
        **evidence.as_dict(),
    }
    return [ctx.write_json(TTFT, document)]
