"""The lab's steps, in the order the lab runs them: the brief's core steps here, and after them (or after the
step each names) the steps the registered capabilities add (voice_llm.core.registry, ``Capability.steps``).

Each step is a module with ``run(ctx) -> list[Path]`` that writes its own artifacts, and optionally
``prepare(options: StepOptions) -> None``, which the lab calls before it asks a server anything or writes a file
(the speak step loads its TTS voice there, so a bad --voice leaves no file). Each step is also a subcommand of the
CLI. ``in_lab`` steps run in ``voice-llm lab``; the others run only when asked (their artifacts join the run in
OUT). ``artifacts`` are the files a finished step leaves, so ``check`` knows what a run must hold.

The step table is read from the registry each time it is asked (:func:`steps`), so a capability left out
(``registry.without``, VOICE_LLM_WITHOUT) takes its steps with it. ``STEPS``, ``LAB_STEPS`` and ``KB_STEPS`` are
the same, computed when they are read.
"""

from __future__ import annotations

from typing import Any

from voice_llm.core import registry
from voice_llm.core.registry import StepEntry
from voice_llm.core.util import artifacts as names

Step = StepEntry  # one shape for a core step and a capability's

CORE_STEPS: tuple[StepEntry, ...] = (
    StepEntry("health", "/health and /props", "voice_llm.core.lab.health", (names.HEALTH, names.PROPS)),
    StepEntry("sse", "one answer read line by line", "voice_llm.core.lab.stream_once",
              (names.SSE_COPY, names.SSE_RAW, names.CHUNKS)),
    StepEntry("ttft", "first token x5, cache off", "voice_llm.core.lab.ttft", (names.TTFT,)),
    StepEntry("prefill", "0 / 4 / 12 documents, cache off", "voice_llm.core.lab.prefill", (names.PREFILL,), reads_kb=True),
    StepEntry("cache", "KV cache: first, second, changed suffix, changed prefix", "voice_llm.core.lab.cache",
              (names.CACHE,), reads_kb=True),
    StepEntry("sentence", "first sentence of a three-sentence answer", "voice_llm.core.lab.sentence", (names.SENTENCE,)),
    StepEntry("cancel", "close the connection after 0.5 s", "voice_llm.core.lab.cancel", (names.CANCEL,)),
    StepEntry("report", "report.json and report.html from the files", "voice_llm.core.lab.report", (names.REPORT,), needs_server=False),
)
LAST_CORE_STEP = "report"  # a capability's lab step with no ``after`` comes just before it


def steps() -> dict[str, StepEntry]:
    """Every step, core and registered, in the lab's order: a capability's step right after the one it names in
    ``after`` (else before report when it runs in the lab, at the end when it runs only when asked)."""
    order = list(CORE_STEPS)
    for capability in registry.capabilities():
        for entry in capability.steps:
            at = [s.name for s in order]
            if entry.after is not None and entry.after in at:
                order.insert(at.index(entry.after) + 1, entry)
            elif entry.in_lab and LAST_CORE_STEP in at:
                order.insert(at.index(LAST_CORE_STEP), entry)
            else:
                order.append(entry)
    return {entry.name: entry for entry in order}


def lab_steps() -> tuple[str, ...]:
    return tuple(name for name, step in steps().items() if step.in_lab)


def kb_steps() -> frozenset[str]:
    """Steps that read documents, so their commands take --kb and the lab checks the KB first."""
    return frozenset(name for name, step in steps().items() if step.reads_kb)


def __getattr__(name: str) -> Any:
    if name == "STEPS":
        return steps()
    if name == "LAB_STEPS":
        return lab_steps()
    if name == "KB_STEPS":
        return kb_steps()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
