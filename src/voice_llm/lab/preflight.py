"""Checks made once before the first request of a run, so a run cannot fail after minutes of work on a limit
that was known at the start."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from voice_llm import brief, prompts, sse
from voice_llm.api import ServerClient, props_n_ctx
from voice_llm.errors import ContextLimitError
from voice_llm.kb import KBDoc

# Documents in the lab's longest prompts: prefill's largest point, and the cache step uses the same ones.
KB_DOC_COUNT = brief.CACHE_DOCS
# Without /tokenize the count is estimated from the UTF-8 bytes; BPE vocabularies of small chat models give
# about 4 bytes per token on English prose, so 3 errs towards too many tokens.
ESTIMATE_BYTES_PER_TOKEN = 3.0


@dataclass(frozen=True)
class ContextFit:
    """The longest prompt of the run, in tokens, against the server's context per slot."""

    request: str
    prompt_tokens: int
    n_ctx: int
    counted: bool  # True: the server's own tokenizer counted; False: estimated from the bytes


def longest_requests(docs: Sequence[KBDoc]) -> list[tuple[str, list[prompts.Message]]]:
    """The requests of the lab with the most text: the cache step's changed prompts over the 12 documents (the
    unchanged one, which is also prefill's 12-document prompt, is a part of each)."""
    system = prompts.with_docs(prompts.ONE_SENTENCE_SYSTEM, docs[:KB_DOC_COUNT])
    return [(f"cache {name}", prompts.chat(variant, prompts.SATURDAY_QUESTION))
            for name, variant in prompts.cache_variants(system) if name.startswith("changed")]


def server_n_ctx(client: ServerClient) -> int | None:
    """The context of one slot (/props ``default_generation_settings.n_ctx``), or None if the server does not say."""
    return props_n_ctx(client.props())


def count_prompt_tokens(client: ServerClient, messages: list[prompts.Message]) -> tuple[int, bool]:
    """Tokens of the prompt the server builds from ``messages``: its chat template (/apply-template), then its
    tokenizer (/tokenize, special tokens added as for a chat request). A server without these endpoints gets a
    generous estimate from the bytes of the messages instead; the bool says which."""
    try:
        templated = client.post_json("/apply-template", {"messages": messages})
        tokenized = client.post_json("/tokenize", {"content": templated["prompt"], "add_special": True})
        return len(tokenized["tokens"]), True
    except (sse.StreamError, KeyError, TypeError):
        size = sum(len(m["content"].encode("utf-8")) for m in messages)
        return math.ceil(size / ESTIMATE_BYTES_PER_TOKEN), False


def check_context_fits(client: ServerClient, docs: Sequence[KBDoc], n_ctx: int | None = None) -> ContextFit | None:
    """Raise :class:`ContextLimitError` if the lab's longest prompt does not fit the server's context (the
    server refuses a prompt of n_ctx tokens or more). None when the server does not say its context (no /props,
    no answer: then there is nothing to check against, and the steps report what is wrong)."""
    if n_ctx is None:
        try:
            n_ctx = server_n_ctx(client)
        except sse.StreamError:  # no /props (not a llama-server) or no answer: the steps will say what is wrong
            return None
    if n_ctx is None:
        return None
    fits = []
    for name, messages in longest_requests(docs):
        tokens, counted = count_prompt_tokens(client, messages)
        fits.append(ContextFit(name, tokens, n_ctx, counted))
    worst = max(fits, key=lambda fit: fit.prompt_tokens)
    if worst.prompt_tokens >= n_ctx:
        raise ContextLimitError(_too_long(worst, docs))
    return worst


def _too_long(fit: ContextFit, docs: Sequence[KBDoc]) -> str:
    names = [doc.name for doc in docs[:KB_DOC_COUNT]]
    shown = ", ".join(names) if len(names) <= 4 else f"{', '.join(names[:2])}, ... {names[-1]}"
    how = "tokens" if fit.counted else "tokens (estimated: the server has no /tokenize)"
    return (
        f"the lab's longest prompt ({fit.request}, the system prompt with {len(names)} KB documents: {shown}) is "
        f"{fit.prompt_tokens} {how}, and the server's context is {fit.n_ctx} tokens per slot; use a KB folder with "
        f"shorter documents (--kb), or start the server with a larger --ctx (the context per slot is --ctx / --slots)"
    )
