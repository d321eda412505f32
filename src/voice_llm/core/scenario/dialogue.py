"""A scripted phone call: the bundled dialogues, the conversation they grow, and what one turn measured.

Shared by `voice-llm call` (one caller, cache on and off) and the Locust caller of `voice-llm load`, so both
build the same requests and time them by the same rules. Layers 0-1 only (the standard library, the reader, the
sentence rule, the stats): it runs inside gevent-patched Locust workers too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from voice_llm.core.errors import ArtifactError, ConfigError
from voice_llm.core.scenario import brief, prompts
from voice_llm.core.scenario.kb import KBDoc
from voice_llm.core.sentences import first_sentence_by_rule
from voice_llm.core.sse import StreamResult
from voice_llm.core.util.artifacts import loads_json, read_artifact_bytes
from voice_llm.core.util.stats import gaps_ms, percentile

DEFAULT_DIALOGUE = "clinic"
DEFAULT_DOCS = brief.PREFILL_DOC_COUNTS[-1]  # the prefill step's largest point: the same documents
# Not a dialogue file: the lab's `ttft` request (same prompt, max_tokens, cache off) repeated, so the load path
# can be compared with `voice-llm ttft` on equal terms.
LAB_TTFT = "lab-ttft"
LAB_TTFT_TURNS = 6


@dataclass(frozen=True)
class Dialogue:
    name: str
    system: str
    turns: tuple[str, ...]
    max_tokens: int = 64
    history: bool = True  # each request carries the conversation so far
    cache_prompt: bool = True
    use_docs: bool = True


def bundled_names() -> list[str]:
    folder = resources.files("voice_llm.core.scenario") / "dialogues"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json")) + [LAB_TTFT]


def load_dialogue(name: str = DEFAULT_DIALOGUE) -> Dialogue:
    """A bundled dialogue by name (``clinic``), ``lab-ttft`` (the lab's ttft request as a call), or a dialogue
    file the user names by its path (it has a ``/`` or ends in ``.json``). A bare name is only ever a bundled
    one, so ``--dialogue ../../x`` can never reach outside the package by accident."""
    if name == LAB_TTFT:
        return Dialogue(LAB_TTFT, prompts.ONE_SENTENCE_SYSTEM, (prompts.NEW_PATIENT_QUESTION,) * LAB_TTFT_TURNS,
                        max_tokens=brief.DEFAULT_MAX_TOKENS, history=False, cache_prompt=False, use_docs=False)
    if "/" in name or name.endswith(".json"):
        return _dialogue_file(Path(name).expanduser())
    bundled = [n for n in bundled_names() if n != LAB_TTFT]
    if name not in bundled:
        raise ConfigError(f"no dialogue named {name!r}; bundled: {', '.join(bundled_names())} "
                          "(or give a dialogue file's path)")
    resource = resources.files("voice_llm.core.scenario") / "dialogues" / f"{name}.json"
    return parse_dialogue(resource.read_text(encoding="utf-8"), f"the bundled dialogue {name}")


def _dialogue_file(path: Path) -> Dialogue:
    """The user's own dialogue file: a regular file (never a FIFO or device that would hang), bounded in size."""
    try:
        data = read_artifact_bytes(path, follow_links=True)  # the user's own link to a file is theirs
    except ArtifactError as exc:
        raise ConfigError(f"cannot read the dialogue file {path}: {exc}") from exc
    return parse_dialogue(data, f"the dialogue file {path}")


_SHAPE = '{"name": "...", "system": "...", "turns": ["...", ...], "max_tokens": 64}'


def parse_dialogue(text: str | bytes, what: str) -> Dialogue:
    """A dialogue from its JSON; any other shape is one ConfigError naming ``what`` and the expected shape."""
    try:
        data = loads_json(text, what)
    except ArtifactError as exc:
        raise ConfigError(str(exc)) from exc

    def bad(reason: str) -> ConfigError:
        return ConfigError(f"{what} is not a dialogue: {reason}; expected {_SHAPE}")

    if not isinstance(data, dict):
        raise bad(f"a JSON {type(data).__name__}, not an object")
    for key in ("name", "system"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise bad(f"{key!r} is missing or not a text")
    turns = data.get("turns")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise bad("'turns' is missing or not a list of texts")
    max_tokens = data.get("max_tokens", 64)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise bad(f"'max_tokens' is {max_tokens!r}, not a whole number of at least 1")
    return Dialogue(data["name"], data["system"], tuple(turns), max_tokens)


def system_prompt(dialogue: Dialogue, docs: Sequence[KBDoc]) -> str:
    return prompts.with_docs(dialogue.system, docs if dialogue.use_docs else ())


def words(text: str) -> int:
    return len(text.split())


@dataclass(frozen=True)
class TurnTiming:
    """What one turn's stream showed; times in ms from just before the request was written."""

    ttft_ms: float | None
    first_sentence_ms: float | None  # None when the stream was cut before its first sentence ended
    total_ms: float
    tokens: int
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    prompt_n: int | None
    cache_n: int | None
    prompt_ms: float | None  # the server's own prompt evaluation time: TTFT less it is what queue and client add
    cancelled: bool
    text: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "ttft_ms": self.ttft_ms, "first_sentence_ms": self.first_sentence_ms, "total_ms": self.total_ms,
            "tokens": self.tokens, "itl_p50_ms": self.itl_p50_ms, "itl_p99_ms": self.itl_p99_ms,
            "prompt_n": self.prompt_n, "cache_n": self.cache_n, "prompt_ms": self.prompt_ms,
            "cancelled": self.cancelled,
        }


def time_turn(result: StreamResult) -> TurnTiming:
    """Time one answer. The first sentence is the brief's rule (voice_llm.core.sentences); an answer that ended
    whole without one is one sentence, complete at the end of the stream; a cut answer without one has none."""
    chunks = result.chunks
    first_ms: float | None = None
    if chunks:
        _, first_ms = first_sentence_by_rule(chunks, result.total_ms)
        if result.closed_early and first_ms == result.total_ms:
            first_ms = None
    gaps = gaps_ms([c.t_ms for c in chunks])
    timings = result.timings or {}
    return TurnTiming(
        ttft_ms=result.ttft_ms, first_sentence_ms=first_ms, total_ms=result.total_ms, tokens=len(chunks),
        itl_p50_ms=percentile(gaps, 50), itl_p99_ms=percentile(gaps, 99),
        prompt_n=timings.get("prompt_n"), cache_n=timings.get("cache_n"), prompt_ms=timings.get("prompt_ms"),
        cancelled=result.closed_early, text=result.text,
    )
