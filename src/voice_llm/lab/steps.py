"""The lab's steps, in the order the lab runs them. Each is a module ``voice_llm.lab.<module>`` with
``run(ctx) -> list[Path]`` that writes its own artifacts; each is also a subcommand of the CLI.

A new step is one module and one entry here. ``in_lab`` steps run in ``voice-llm lab``; the others run only when
asked (their artifacts join the run in OUT). ``artifacts`` are the files a finished step leaves, so ``check``
knows what a run must hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from voice_llm.util import artifacts as names


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    module: str
    artifacts: tuple[str, ...]
    in_lab: bool = True
    needs_server: bool = True  # False: works from the files in OUT alone


STEPS: dict[str, Step] = {step.name: step for step in (
    Step("health", "/health and /props", "health", (names.HEALTH, names.PROPS)),
    Step("sse", "one answer read line by line", "stream_once", (names.SSE_COPY, names.SSE_RAW, names.CHUNKS)),
    Step("ttft", "first token x5, cache off", "ttft", (names.TTFT,)),
    Step("prefill", "0 / 4 / 12 documents, cache off", "prefill", (names.PREFILL,)),
    Step("cache", "KV cache: first, second, changed suffix, changed prefix", "cache", (names.CACHE,)),
    Step("sentence", "first sentence of a three-sentence answer", "sentence", (names.SENTENCE,)),
    Step("speak", "time to first audio: the answer spoken while it streams", "speak", (names.AUDIO,)),
    Step("cancel", "close the connection after 0.5 s", "cancel", (names.CANCEL,)),
    Step("report", "report.json from the files", "report", (names.REPORT,), needs_server=False),
    Step("call", "one call of 6 turns with 12 documents, cache on and off", "call", (names.CALL,), in_lab=False),
)}

LAB_STEPS: tuple[str, ...] = tuple(name for name, step in STEPS.items() if step.in_lab)
# Steps that read documents, so their commands take --kb.
KB_STEPS = frozenset({"prefill", "cache", "call"})
