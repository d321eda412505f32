"""Checks made once before the first request of a run, so a run cannot fail after minutes of work on a limit
that was known at the start.

One check for every command that sends long prompts (the lab's steps, `call`, `load`): the longest request the
command will send, counted by the server's own chat template and tokenizer, against the context of one slot.
Each command says which requests it plans (:class:`PlannedRequest`) and how to word the fix."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from voice_llm.core import sse
from voice_llm.core.scenario import brief, prompts
from voice_llm.core.client.api import ServerClient, ServerProps
from voice_llm.core.errors import ContextLimitError
from voice_llm.core.scenario.kb import KBDoc

# Documents in the lab's longest prompts: prefill's largest point, and the cache step uses the same ones.
KB_DOC_COUNT = brief.CACHE_DOCS
# Without /tokenize the count is estimated from the UTF-8 bytes; BPE vocabularies of small chat models give
# about 4 bytes per token on English prose, so 3 errs towards too many tokens.
ESTIMATE_BYTES_PER_TOKEN = 3.0


@dataclass(frozen=True)
class PlannedRequest:
    """A request a command will send, as far as it is known before the first one: its messages, and the tokens
    the slot must hold beyond them (a call's answers, which do not exist yet: at most ``max_tokens`` each)."""

    name: str
    messages: list[prompts.Message]
    reserved_tokens: int = 0


@dataclass(frozen=True)
class ContextFit:
    """The longest planned request, in tokens (its prompt plus what it reserves), against one slot's context."""

    request: str
    prompt_tokens: int
    n_ctx: int
    counted: bool  # True: the server's own tokenizer counted; False: estimated from the bytes
    reserved_tokens: int = 0

    @property
    def tokens(self) -> int:
        """What the slot must hold: the counted prompt and the reserved answers."""
        return self.prompt_tokens + self.reserved_tokens

    @property
    def fits(self) -> bool:
        # llama-server refuses a prompt of n_ctx tokens or more (exceed_context_size_error, HTTP 400).
        return self.tokens < self.n_ctx

    def how_counted(self) -> str:
        return "counted by the server's tokenizer" if self.counted else \
            "estimated from the bytes: the server has no /tokenize"


def longest_requests(docs: Sequence[KBDoc]) -> list[tuple[str, list[prompts.Message]]]:
    """The requests of the lab with the most text: the cache step's changed prompts over the 12 documents (the
    unchanged one, which is also prefill's 12-document prompt, is a part of each)."""
    system = prompts.with_docs(prompts.ONE_SENTENCE_SYSTEM, docs[:KB_DOC_COUNT])
    return [(f"cache {name}", prompts.chat(variant, prompts.SATURDAY_QUESTION))
            for name, variant in prompts.cache_variants(system) if name.startswith("changed")]


def call_requests(name: str, system: str, turns: Sequence[str], max_tokens: int, history: bool) -> list[PlannedRequest]:
    """The longest request of a scripted call (`call`, and each caller of `load`). With history it is the last
    turn's: the system prompt, every caller line, an answer after each earlier one (empty here: it does not
    exist yet) and the answer to come, so ``max_tokens`` per turn is kept for the answers. Without history each
    line goes alone with the system prompt and keeps room for its own answer."""
    if not turns:
        return []
    if history:
        messages: list[prompts.Message] = [{"role": "system", "content": system}]
        for line in turns[:-1]:
            messages += [{"role": "user", "content": line}, {"role": "assistant", "content": ""}]
        messages.append({"role": "user", "content": turns[-1]})
        return [PlannedRequest(f"turn {len(turns)} of {len(turns)}", messages, len(turns) * max_tokens)]
    unique = dict.fromkeys(turns)  # the lab-ttft call repeats one line: count it once
    return [PlannedRequest(f"turn {turns.index(line) + 1} of {len(turns)}", prompts.chat(system, line), max_tokens)
            for line in unique]


def server_n_ctx(client: ServerClient) -> int | None:
    """The context of one slot (/props ``default_generation_settings.n_ctx``), or None if the server does not say.
    llama-server splits ``-c`` over its ``-np`` slots: `voice-llm up --slots 4` (-c 4096 -np 4) answers 1024 here,
    and /slots shows n_ctx 1024 for each of its 4 slots (seen on this project's pinned build): the limit each
    request meets."""
    return ServerProps.parse(client.props()).n_ctx


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


def longest_fit(client: ServerClient, requests: Sequence[PlannedRequest], n_ctx: int | None = None) -> ContextFit | None:
    """The longest of ``requests`` against the context per slot, without judging it. None when the server does
    not say its context (no /props: not a llama-server, or no answer), so there is nothing to check against."""
    if n_ctx is None:
        try:
            n_ctx = server_n_ctx(client)
        except sse.StreamError:  # no /props (not a llama-server) or no answer: the steps will say what is wrong
            return None
    if n_ctx is None or not requests:
        return None
    fits = []
    for request in requests:
        tokens, counted = count_prompt_tokens(client, request.messages)
        fits.append(ContextFit(request.name, tokens, n_ctx, counted, request.reserved_tokens))
    return max(fits, key=lambda fit: fit.tokens)


def check_requests_fit(client: ServerClient, requests: Sequence[PlannedRequest], too_long: Callable[[ContextFit], str],
                       n_ctx: int | None = None) -> ContextFit | None:
    """Raise :class:`ContextLimitError` (message: ``too_long(fit)``) if the longest planned request does not fit
    one slot's context; else the fit, or None when the server does not say its context (not checkable)."""
    worst = longest_fit(client, requests, n_ctx)
    if worst is not None and not worst.fits:
        raise ContextLimitError(too_long(worst))
    return worst


def check_context_fits(client: ServerClient, docs: Sequence[KBDoc], n_ctx: int | None = None) -> ContextFit | None:
    """Raise :class:`ContextLimitError` if the lab's longest prompt does not fit the server's context (the
    server refuses a prompt of n_ctx tokens or more). None when the server does not say its context (no /props,
    no answer: then there is nothing to check against, and the steps report what is wrong)."""
    requests = [PlannedRequest(name, messages) for name, messages in longest_requests(docs)]
    return check_requests_fit(client, requests, lambda fit: _too_long(fit, docs), n_ctx)


def suggested_ctx(tokens: int, slots: int) -> int:
    """A ``--ctx`` that gives each of ``slots`` slots room for ``tokens``: per slot the next multiple of 1024
    above it (a power-of-two context is what users type), times the slots."""
    per_slot = 1024 * (tokens // 1024 + 1)
    return per_slot * max(1, slots)


def _too_long(fit: ContextFit, docs: Sequence[KBDoc]) -> str:
    names = [doc.name for doc in docs[:KB_DOC_COUNT]]
    shown = ", ".join(names) if len(names) <= 4 else f"{', '.join(names[:2])}, ... {names[-1]}"
    how = "tokens" if fit.counted else "tokens (estimated: the server has no /tokenize)"
    return (
        f"the lab's longest prompt ({fit.request}, the system prompt with {len(names)} KB documents: {shown}) is "
        f"{fit.prompt_tokens} {how}, and the server's context is {fit.n_ctx} tokens per slot; use a KB folder with "
        f"shorter documents (--kb), or start the server with a larger --ctx (the context per slot is --ctx / --slots)"
    )
