"""Step `call`: one phone call by one caller — the bundled clinic dialogue, the first 12 KB documents in the system
prompt, each turn appended to the conversation — run with the KV cache on and then off.

With the cache on, each turn's prompt is the previous turn's prompt plus two messages, so the slot should only
prefill what is new and every turn should start about as fast as a short prompt. The cache-off run replays the
*same* conversation (the cache-on answers as history, so the prompts are identical token for token) and pays
the whole prompt every turn. Before each run a short unrelated request empties the slot, so turn 1 is a miss in
both runs and the two can be compared turn by turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from voice_llm.core.scenario import prompts
from voice_llm.core.util.artifacts import CALL, read_json
from voice_llm.core.util.stats import median
from voice_llm.core.scenario.dialogue import DEFAULT_DIALOGUE, DEFAULT_DOCS, Dialogue, load_dialogue, system_prompt, time_turn
from voice_llm.core.errors import MeasurementError
from voice_llm.core.scenario.kb import KBDoc, load_kb
from voice_llm.core.run import preflight
from voice_llm.core.run.context import LabContext
from voice_llm.core.lab.evidence import SOURCE_CHUNK_COUNT, SOURCE_TIMINGS, Evidence


def run_call(ctx: LabContext, dialogue: Dialogue, system: str, cache_prompt: bool,
             answers: list[str] | None, evidence: Evidence | None = None) -> list[dict[str, Any]]:
    """The whole call once; ``answers`` (from an earlier run) replace the model's own as history. A server without
    llama-server's ``timings`` (vLLM, Ollama) leaves prompt_n and cache_n null, the reason in ``evidence``'s
    ``unknown``, as the lab's cache step does: a server's usage.prompt_tokens counts the whole prompt, cached or
    not, so it is no count of what was prefilled; the times are the client's clock."""
    label = "on" if cache_prompt else "off"
    evidence = evidence or Evidence(ctx.capabilities)
    ctx.request(f"call-{label}-empty-slot", prompts.chat(prompts.ONE_SENTENCE_SYSTEM, prompts.SLOT_FILLER), max_tokens=8)
    messages = [{"role": "system", "content": system}]
    rows = []
    for number, line in enumerate(dialogue.turns, start=1):
        messages.append({"role": "user", "content": line})
        result = ctx.request(f"call-{label}-turn{number}", list(messages), max_tokens=dialogue.max_tokens,
                             cache_prompt=cache_prompt)
        timing = time_turn(result)
        if timing.ttft_ms is None:
            raise MeasurementError(f"call turn {number} (cache {label}): the answer had no content chunk")
        answer = answers[number - 1] if answers is not None else timing.text
        messages.append({"role": "assistant", "content": answer})
        rows.append({
            "turn": number, "user": line, "ttft_ms": timing.ttft_ms, "first_sentence_ms": timing.first_sentence_ms,
            "prompt_n": evidence.take("prompt_n", timing.prompt_n, SOURCE_TIMINGS, evidence.cache_reason()),
            "cache_n": evidence.take("cache_n", timing.cache_n, SOURCE_TIMINGS, evidence.cache_reason()),
            "total_ms": timing.total_ms,
            "tokens": evidence.take("tokens", timing.tokens, SOURCE_CHUNK_COUNT, ""), "answer": timing.text,
            "history_answer": answer,
        })
    return rows


def check_call_fits(ctx: LabContext, dialogue: Dialogue, system: str, docs: list[KBDoc]) -> None:
    """Before the first turn: the call's last turn (the whole conversation and room for every answer) fits one
    slot (the lab's preflight, voice_llm.core.run.preflight). A server that does not say its context is not checked."""
    requests = preflight.call_requests(dialogue.name, system, dialogue.turns, dialogue.max_tokens, dialogue.history)

    def too_long(fit: preflight.ContextFit) -> str:
        return (f"the {dialogue.name} call's longest request ({fit.request}, the system prompt with {len(docs)} KB "
                f"documents and {fit.reserved_tokens} tokens kept for {len(dialogue.turns)} answers of up to "
                f"{dialogue.max_tokens} tokens) needs {fit.tokens} tokens ({fit.prompt_tokens} {fit.how_counted()}), "
                f"and the server's context is {fit.n_ctx} tokens per slot; start the server with a larger --ctx "
                f"(each slot gets --ctx / --slots: e.g. `voice-llm up --ctx {preflight.suggested_ctx(fit.tokens, 1)}` "
                f"for one slot), or use a KB folder with shorter documents (--kb)")

    n_ctx = ctx.capabilities.n_ctx if ctx.capabilities is not None else None
    preflight.check_requests_fit(ctx.client, requests, too_long, n_ctx)


def run(ctx: LabContext) -> list[Path]:
    dialogue = load_dialogue(DEFAULT_DIALOGUE)
    docs = load_kb(ctx.kb_dir, need=DEFAULT_DOCS)[:DEFAULT_DOCS]
    system = system_prompt(dialogue, docs)
    check_call_fits(ctx, dialogue, system, docs)
    evidence = Evidence(ctx.capabilities)
    evidence.client("ttft_ms", "first_sentence_ms", "total_ms")
    cache_on = run_call(ctx, dialogue, system, True, None, evidence)
    cache_off = run_call(ctx, dialogue, system, False, [row["answer"] for row in cache_on], evidence)
    evidence.note_cache_off()  # a server that may ignore cache_prompt: false (no timings.cache_n) is said
    document = {
        "dialogue": dialogue.name,
        "docs": [doc.name for doc in docs],
        "max_tokens": dialogue.max_tokens,
        "system_chars": len(system),
        "turns": list(dialogue.turns),
        "cache_on": cache_on,
        "cache_off": cache_off,
        **evidence.as_dict(),
    }
    return [ctx.write_json(CALL, document)]


def numbers(out: Path) -> list[tuple[str, str]]:
    """The call's key numbers for its summary table (voice_llm.core.lab.summary): each run's median over the turns."""
    doc = read_json(out / CALL)
    rows = []
    for run, label in (("cache_on", "cache on"), ("cache_off", "cache off")):
        turns = [row for row in doc.get(run) or [] if isinstance(row, dict)]
        for key, what in (("ttft_ms", "first token"), ("first_sentence_ms", "first sentence")):
            values = [row[key] for row in turns if isinstance(row.get(key), (int, float))]
            rows.append((f"{what}, {label} (median of {len(values)} turns)",
                         f"{median(values):.0f} ms" if values else "n/a"))
    last = (doc.get("cache_on") or [{}])[-1]
    if isinstance(last, dict) and isinstance(last.get("prompt_n"), int):
        rows.append((f"turn {last.get('turn')}, cache on: tokens prefilled / from the cache",
                     f"{last['prompt_n']} / {last.get('cache_n')} tokens"))
    return rows
