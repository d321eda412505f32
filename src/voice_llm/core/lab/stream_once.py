"""Step 2: one answer read line by line — sse_raw.txt exactly as received, chunks.jsonl with times, sse.py."""

from __future__ import annotations

from pathlib import Path

from voice_llm.core import sse
from voice_llm.core.scenario import prompts
from voice_llm.core.util.artifacts import CHUNKS, SSE_COPY, SSE_RAW, jsonl_bytes
from voice_llm.core.run.context import LabContext


def run(ctx: LabContext) -> list[Path]:
    # The stand-alone reader, for the user's own pipeline; written atomically like every artifact.
    copy = ctx.write_bytes(SSE_COPY, Path(sse.__file__).read_bytes())
    result = ctx.request(
        "sse", prompts.chat(prompts.ONE_SENTENCE_SYSTEM, prompts.NEW_PATIENT_QUESTION),
        max_tokens=64, cache_prompt=True, raw_path=ctx.path(SSE_RAW),
    )
    # chunks.jsonl keeps the brief's two fields per line; the run's manifest ties it to the run.
    return [copy, ctx.path(SSE_RAW), ctx.write_bytes(CHUNKS, jsonl_bytes(c.as_dict() for c in result.chunks))]
