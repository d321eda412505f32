"""The key numbers of a run: report.json's fields, where each is copied from, and what it is called.

One table read by the report step (which writes report.json), by ``check`` (which re-derives report.json from the
same sources) and by the HTML report and the summary (labels and units). The brief's seven fields come first and
are always present; fields of optional steps are added beside them when their artifact exists: the core's
(:data:`CORE_KEY_NUMBERS`), then each registered capability's (``Capability.key_numbers``, a "module:function"
returning KeyNumber rows), resolved when asked (:func:`all_key_numbers`): this module imports no capability.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voice_llm.core import registry
from voice_llm.core.analysis.metrics import CACHE_NOT_DISABLED, cache_not_disabled
from voice_llm.core.errors import ArtifactError, NoDataError
from voice_llm.core.run import artifacts as typed
from voice_llm.core.run.folder import RunFolder
from voice_llm.core.util import artifacts as names


@dataclass(frozen=True)
class KeyNumber:
    key: str
    label: str
    unit: str
    source: str
    path: tuple[str | int, ...]  # keys / list indexes into the source document
    optional: bool = False  # only when the source artifact exists (a step outside the brief)
    cache_off: bool = False  # measured with cache_prompt false (see metrics.CACHE_NOT_DISABLED)
    # "median" or "p90": this number is half of the caller's number, the line the report opens with (:func:`headline`)
    headline: str | None = None
    # The metric (voice_llm.core.analysis.metrics) whose samples this number is the median of, when it is kept under
    # another key there (the metrics name every document count alike: prefill_<n>docs_ttft_ms, and report.json's
    # noise section already stores spreads under those keys); None: the metric of the same key, if any.
    metric: str | None = None

    @property
    def metric_key(self) -> str:
        return self.metric or self.key


CORE_KEY_NUMBERS: tuple[KeyNumber, ...] = (
    KeyNumber("ttft_p50_ms", "median time to first token", "ms", names.TTFT, ("ttft_p50",), cache_off=True),
    KeyNumber("total_p50_ms", "median time to the whole answer", "ms", names.TTFT, ("total_p50",), cache_off=True),
    KeyNumber("ttft_12docs_ms", "time to first token with 12 documents", "ms", names.PREFILL, (-1, "ttft_ms"),
              cache_off=True, metric="prefill_12docs_ttft_ms"),
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


HEADLINE_PARTS = ("median", "p90")


@dataclass(frozen=True)
class Headline:
    """The caller's number: how long after the caller stops talking they hear the assistant, over the run's turns.
    ``source`` is the artifact it is read from, ``missing`` why it is not there (then the times are None)."""

    source: str | None
    median_ms: float | None = None
    p90_ms: float | None = None
    missing: str | None = None
    where: str | None = None  # what the turns were, when not one call's (e.g. "at 1 caller, 21 turns of a load sweep")
    turns: int | None = None  # how many turns the median is over (the block's ``n`` beside it), when it says
    # turns left out because the agent's audio was still playing at the caller's speech end (the block's
    # ``talked_over``: dial.json's TALKED_OVER_RULE); their ~0 ms "gap" is no reply's
    talked_over: int | None = None

    def sentence(self) -> str:
        if self.median_ms is None:
            return f"The caller's number (mouth to ear) {self.missing}."
        p90 = f"; p90 {self.p90_ms:.0f} ms" if self.p90_ms is not None else ""
        turns = f" over {self.turns} turn{'s' if self.turns != 1 else ''}" if self.turns is not None else ""
        where = f", {self.where}" if self.where else turns
        over = (f"; {self.talked_over} turn{'s' if self.talked_over != 1 else ''} talked over, left out"
                if self.talked_over else "")
        return (f"The caller hears the assistant {self.median_ms:.0f} ms after they stop talking "
                f"(median{p90}{where}{over}).")


def _turns(doc: Any, median_path: Sequence[str | int], key: str = "n") -> int | None:
    """The count beside a headline median (dial.json's ``summary.heard_gap_ms.n``, or its ``talked_over``), when
    its block has one that is a count; the sentence then says what the median is over, and says nothing rather
    than a wrong count."""
    block: Any = doc
    for step in median_path[:-1]:
        block = block.get(step) if isinstance(block, Mapping) else None
    n = block.get(key) if isinstance(block, Mapping) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def _time(value: Any, source: str, path: Sequence[str | int]) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ArtifactError(f"{source}: {'.'.join(map(str, path))} is {value!r}, not a time in ms")
    return float(value)


def headline(out: RunFolder | Path) -> Headline:
    """The caller's number for the run in ``out``, from the key numbers a capability marks ``headline`` (a median
    and a p90 read from one artifact): the first registered one this run measured; when none was, what says why
    (and which step measures it)."""
    folder = RunFolder.of(out)
    marked: dict[str, dict[str, KeyNumber]] = {}
    for number in all_key_numbers():
        if number.headline in HEADLINE_PARTS:
            marked.setdefault(number.source, {})[number.headline] = number
    for source, parts in marked.items():
        if "median" not in parts or not folder.is_file(source):
            continue
        try:
            doc = folder.json(source)
            values = {part: _time(_follow(doc, number.path, source), source, number.path)
                      for part, number in parts.items()}
        except ArtifactError as exc:
            return Headline(source, missing=f"cannot be read: {exc}")
        if values["median"] is None:
            over = _turns(doc, parts["median"].path, "talked_over")
            why = (f"every heard turn was talked over ({over}: the agent's audio still playing at the caller's end)"
                   if over else "no turn")
            return Headline(source, missing=f"was not measured: {why} in {source} reached the caller"
                            if not over else f"was not measured: {why}, in {source}")
        return Headline(source, values["median"], values.get("p90"), turns=_turns(doc, parts["median"].path),
                        talked_over=_turns(doc, parts["median"].path, "talked_over"))
    for capability in registry.capabilities():
        if capability.headline:
            found = registry.resolve(capability.headline)(folder)
            if found is not None:
                return found
    if not marked:
        return Headline(None, missing="is measured by no registered capability")
    writes = {name: step.name for c in registry.capabilities() for step in c.steps for name in step.artifacts}
    runs = [f"`voice-llm {writes[source]}`" if source in writes else source for source in marked]
    return Headline(None, missing=f"was not measured in this run ({' or '.join(runs)} measures it)")


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
    (voice_llm.core.run.artifacts), so report.json copies no number of a file the checks and charts refuse as malformed."""
    kind = typed.TYPED.get(source)
    if kind is None:
        return folder.json(source)
    try:
        return folder.artifact(kind).doc
    except NoDataError:  # a step that measured nothing (nulls, no rows): its nulls are copied as it left them
        return folder.json(source)


def _follow(doc: Any, path: Sequence[str | int], source: str, null_ends: bool = False) -> Any:
    """The value at ``path``; with ``null_ends`` a null met on the way is the value (an optional step's block that
    measured nothing, as dial.json's ``summary.heard_minus_reported_ms: null``), not a missing field."""
    value = doc
    for step in path:
        if value is None and null_ends:
            return None
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


def value_of(out: RunFolder | Path, number: KeyNumber) -> Any:
    """``number``'s value in the run in ``out``, read from its source file (ArtifactError when it cannot be)."""
    folder = RunFolder.of(out)
    return _follow(folder.json(number.source), number.path, number.source)


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
        report[number.key] = _follow(docs[number.source], number.path, number.source, number.optional)
    if unknown:
        report[UNKNOWN] = unknown
    return report
