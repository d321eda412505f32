"""Where each number of an artifact comes from, and why a number that is null is null.

A step reads a count from the server's own ``timings`` when the stream has them (llama-server), else from the
OpenAI ``usage`` object, else it has none; times are always the client's clock. Each artifact carries
``sources`` (field -> where it came from) and ``unknown`` (field -> why it is null), so ``check`` and a reader
can tell a checked number from a missing one.
"""

from __future__ import annotations

from typing import Any

from voice_llm.core.client.capabilities import (SOURCE_CHUNK_COUNT, SOURCE_CLIENT, SOURCE_TIMINGS, SOURCE_USAGE, Capabilities)
from voice_llm.core.sse import StreamResult

NO_PROMPT_TOKENS = "the stream carries no timings.prompt_n and no usage.prompt_tokens"
NO_TIMINGS = "the stream carries no server timings"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def prompt_tokens(result: StreamResult) -> tuple[int | None, str | None]:
    """Prompt tokens the server computed for this request: timings.prompt_n (after the cache), else usage."""
    n = _int((result.timings or {}).get("prompt_n"))
    if n is not None:
        return n, SOURCE_TIMINGS
    n = _int((result.usage or {}).get("prompt_tokens"))
    return (n, SOURCE_USAGE) if n is not None else (None, None)


def generated_tokens(result: StreamResult) -> tuple[int, str]:
    n = _int((result.timings or {}).get("predicted_n"))
    if n is not None:
        return n, SOURCE_TIMINGS
    n = _int((result.usage or {}).get("completion_tokens"))
    if n is not None:
        return n, SOURCE_USAGE
    return len(result.chunks), SOURCE_CHUNK_COUNT


def timing(result: StreamResult, key: str) -> Any:
    return (result.timings or {}).get(key)


class Evidence:
    """Collects one artifact's ``sources`` and ``unknown`` while its numbers are taken."""

    def __init__(self, capabilities: Capabilities | None) -> None:
        self.capabilities = capabilities
        self.sources: dict[str, str] = {}
        self.unknown: dict[str, str] = {}

    def take(self, name: str, value: Any, source: str | None, reason: str) -> Any:
        """Record ``value`` under ``name``: its source, or the reason it is None. Returns the value."""
        if value is None:
            self.unknown.setdefault(name, reason)
        elif source is not None:
            self.sources.setdefault(name, source)
        return value

    def client(self, *names: str) -> None:
        for name in names:
            self.sources.setdefault(name, SOURCE_CLIENT)

    def prompt_reason(self) -> str:
        return (self.capabilities.prompt_tokens_source()[1] if self.capabilities else "") or NO_PROMPT_TOKENS

    def cache_reason(self) -> str:
        return (self.capabilities.cache_source()[1] if self.capabilities else "") or NO_TIMINGS

    def note_cache_off(self) -> None:
        """For cache-off steps: say when 'cache off' cannot be shown (the server may ignore cache_prompt)."""
        if self.capabilities is not None:
            shown, reason = self.capabilities.cache_off_known()
            if not shown:
                self.unknown["cache_off"] = reason

    def as_dict(self) -> dict[str, Any]:
        return {"sources": dict(self.sources), "unknown": dict(self.unknown)}
