"""The key numbers of a run: report.json's fields, where each is copied from, and what it is called.

One table read by the report step (which writes report.json), by ``check`` (which re-derives report.json from the
same sources) and by the HTML report and the summary (labels and units). The brief's seven fields come first and
are always present; fields of optional steps are added beside them when their artifact exists: the core's
(:data:`CORE_KEY_NUMBERS`), then each registered capability's (``Capability.key_numbers``, a "module:function"
returning KeyNumber rows), resolved when asked (:func:`all_key_numbers`): this module imports no capability.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voice_llm import registry
from voice_llm.analysis.metrics import CACHE_NOT_DISABLED, cache_not_disabled
from voice_llm.errors import ArtifactError
from voice_llm.run import artifacts as typed
from voice_llm.run.folder import RunFolder
from voice_llm.util import artifacts as names


@dataclass(frozen=True)
class KeyNumber:
    key: str
    label: str
    unit: str
    source: str
    path: tuple[str | int, ...]  # keys / list indexes into the source document
    optional: bool = False  # only when the source artifact exists (a step outside the brief)
    cache_off: bool = False  # measured with cache_prompt false (see metrics.CACHE_NOT_DISABLED)


CORE_KEY_NUMBERS: tuple[KeyNumber, ...] = (
    KeyNumber("ttft_p50_ms", "median time to first token", "ms", names.TTFT, ("ttft_p50",), cache_off=True),
    KeyNumber("total_p50_ms", "median time to the whole answer", "ms", names.TTFT, ("total_p50",), cache_off=True),
    KeyNumber("ttft_12docs_ms", "time to first token with 12 documents", "ms", names.PREFILL, (-1, "ttft_ms"),
              cache_off=True),
    KeyNumber("prompt_n_12docs", "prompt size with 12 documents", "tokens", names.PREFILL, (-1, "prompt_n"),
              cache_off=True),
    KeyNumber("cache_ttft_ms", "time to first token, cached prompt", "ms", names.CACHE, ("second", "ttft_ms")),
    KeyNumber("first_sentence_ms", "time to the first sentence", "ms", names.SENTENCE, ("first_sentence_ms",)),
    KeyNumber("cancel_idle_ms", "slot idle after cancel", "ms", names.CANCEL, ("slot_idle_after_ms",)),
)


def all_key_numbers() -> tuple[KeyNumber, ...]:
    """The core's key numbers, then each registered capability's (``Capability.key_numbers``), in registry order:
    report.json's fields in the order it writes them."""
    found = list(CORE_KEY_NUMBERS)
    for capability in registry.capabilities():
        if capability.key_numbers:
            found.extend(registry.resolve(capability.key_numbers)())
    return tuple(found)


def labels(out: RunFolder | Path) -> dict[str, tuple[str, str]]:
    """(label, unit) of every key number for the run in ``out``: a number measured with the cache off on a server
    that may have ignored that says "cache not disabled" in its label (a condition that did not hold is not
    claimed)."""
    folder = RunFolder.of(out)
    numbers = all_key_numbers()
    found = {k.key: (k.label, k.unit) for k in numbers}
    docs: dict[str, Any] = {}
    for number in numbers:
        if not number.cache_off:
            continue
        if number.source not in docs:
            try:
                docs[number.source] = _document(folder, number.source)
            except ArtifactError:
                docs[number.source] = None
        if cache_not_disabled(docs[number.source]):
            found[number.key] = (f"{number.label} ({CACHE_NOT_DISABLED})", number.unit)
    return found


def _document(folder: RunFolder, source: str) -> Any:
    """The saved document of ``source``; a core artifact's only once its typed parse accepts it
    (voice_llm.run.artifacts), so report.json copies no number of a file the checks and charts refuse."""
    kind = typed.TYPED.get(source)
    return folder.json(source) if kind is None else folder.artifact(kind).doc


def _follow(doc: Any, path: Sequence[str | int], source: str) -> Any:
    value = doc
    for step in path:
        try:
            value = value[step]
        except (KeyError, IndexError, TypeError) as exc:
            where = ".".join(str(p) for p in path)
            raise ArtifactError(f"{source} has no {where!r}; rerun its step") from exc
    return value


# report.json's ``unknown``: why a brief's field is null (as every artifact says why it left a number null).
UNKNOWN = "unknown"
_ABSENT = object()


def not_run_reason(source: str) -> str:
    return f"{source} is not in this folder: its step did not run here"


def build_report(out: RunFolder | Path) -> dict[str, Any]:
    """report.json's values, read from the files of the earlier steps (never from memory). A brief's field whose
    file is not in the folder (a run of some steps: every step but prefill and cache, converse alone) is null with
    the reason in ``unknown``, so a partial run has a report of what it measured; a file there but unreadable is
    refused (an ArtifactError naming it), and ``check`` says which files the steps that ran must have left."""
    folder = RunFolder.of(out)
    report: dict[str, Any] = {}
    unknown: dict[str, str] = {}
    docs: dict[str, Any] = {}
    for number in all_key_numbers():
        if number.source not in docs:
            absent = not folder.exists(number.source)  # a link or FIFO there is read, and refused, by folder.json
            if absent and number.optional:
                continue
            docs[number.source] = _ABSENT if absent else _document(folder, number.source)
        if docs[number.source] is _ABSENT:
            report[number.key] = None
            unknown[number.key] = not_run_reason(number.source)
            continue
        report[number.key] = _follow(docs[number.source], number.path, number.source)
    if unknown:
        report[UNKNOWN] = unknown
    return report
