"""Step 6: when does the first sentence end — the brief's rule and the smart splitter on the same stream.

With ``--repeat N`` the answer is streamed N times: the times are the medians over the repeats (``_min``/``_max``
beside them), and the texts and chunks are those of the repeat whose first sentence ended at the median time
(``median_repeat``, counted from 1), so the text shown is one real answer. ``repeats`` keeps every answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from voice_llm.core.scenario import brief, prompts
from voice_llm.core.util import stats
from voice_llm.core.util.artifacts import SENTENCE
from voice_llm.core.errors import MeasurementError
from voice_llm.core.run.context import LabContext
from voice_llm.core.sentences import first_sentence_by_rule, first_sentence_by_splitter
from voice_llm.core.sse import Chunk


def sentence_document(chunks: Sequence[Chunk], total_ms: float) -> dict[str, Any]:
    if not chunks:
        raise MeasurementError("sentence: the answer had no content chunk")
    first, first_ms = first_sentence_by_rule(chunks, total_ms)
    smart, smart_ms = first_sentence_by_splitter(chunks, total_ms)
    return {
        "ttft_ms": chunks[0].t_ms,
        "first_sentence_ms": first_ms,
        "total_ms": total_ms,
        "first_sentence": first,
        "text": "".join(chunk.text for chunk in chunks),
        "smart_first_sentence": smart,
        "smart_first_sentence_ms": smart_ms,
        "chunks": [chunk.as_dict() for chunk in chunks],
    }


TIME_FIELDS = ("ttft_ms", "first_sentence_ms", "total_ms", "smart_first_sentence_ms")


def measure(ctx: LabContext, number: int = 1) -> dict[str, Any]:
    result = ctx.request(f"sentence{stats.repeat_suffix(number)}",
                         prompts.chat(prompts.THREE_SENTENCES_SYSTEM, prompts.FASTING_QUESTION),
                         max_tokens=brief.SENTENCE_MAX_TOKENS, cache_prompt=True)
    return sentence_document(result.chunks, result.total_ms)


def summary_document(repeats: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The brief's fields from several answers: median times (a time stays below another in the medians when it
    does in every repeat), the texts and chunks of the median answer."""
    middle = stats.median_index([r["first_sentence_ms"] for r in repeats])
    document = {**repeats[middle], **stats.summarize(repeats, TIME_FIELDS, TIME_FIELDS)}
    document["median_repeat"] = middle + 1
    document["repeats"] = list(repeats)
    return document


def run(ctx: LabContext) -> list[Path]:
    repeats = [measure(ctx, number) for number in range(1, ctx.options.repeat + 1)]
    return [ctx.write_json(SENTENCE, summary_document(repeats))]
