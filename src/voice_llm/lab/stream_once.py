"""Step 2: one answer read line by line — sse_raw.txt exactly as received, chunks.jsonl with times, sse.py."""

from __future__ import annotations

from pathlib import Path

from voice_llm import prompts, sse
from voice_llm.artifacts import CHUNKS, SSE_COPY, SSE_RAW, write_bytes_atomic, write_jsonl
from voice_llm.lab.context import LabContext


def run(ctx: LabContext) -> list[Path]:
    copy = ctx.path(SSE_COPY)
    # The stand-alone reader, for the user's own pipeline; written atomically like every artifact.
    write_bytes_atomic(copy, Path(sse.__file__).read_bytes())
    result = ctx.request(
        "sse", prompts.chat(prompts.ONE_SENTENCE_SYSTEM, prompts.NEW_PATIENT_QUESTION),
        max_tokens=64, cache_prompt=True, raw_path=ctx.path(SSE_RAW),
    )
    return [copy, ctx.path(SSE_RAW), write_jsonl(ctx.path(CHUNKS), (c.as_dict() for c in result.chunks))]
