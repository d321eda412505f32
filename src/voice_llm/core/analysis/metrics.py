"""Every number of a run with all its samples, read from the saved files: what the noise warning, ``compare`` and
the report's spread chart look at.

A metric is one number of one artifact (the brief's field, which is the median) plus the samples it is the median
of: the five ttft runs, or a step's ``repeats``. A file from before repeats gives its one value as one sample.

The table is the core's metrics (:data:`CORE_METRICS`) followed by what each registered capability contributes
(``Capability.metrics``, a "module:function" returning Metric rows: the speak step's first audio), resolved when
asked (:func:`all_metrics`): this module imports no capability.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voice_llm.core import registry
from voice_llm.core.errors import ArtifactError
from voice_llm.core.run import artifacts as typed
from voice_llm.core.run.folder import RunFolder
from voice_llm.core.scenario import brief
from voice_llm.core.util import artifacts as names
from voice_llm.core.util import stats


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str  # "ms" or "tokens"
    source: str
    # Does it delay when the caller hears the assistant (first audio, or the audio stopping on barge-in)?
    audible: bool
    # From the source document: (the median the file states, every sample).
    read: Callable[[Any], tuple[float, list[float]]]
    # Measured with ``cache_prompt: false``: where the artifact says the server may have ignored it, the number
    # is labelled "cache not disabled" rather than under a condition that did not hold.
    cache_off: bool = False
    # A core artifact's typed value (voice_llm.core.run.artifacts): ``read`` is given the parsed value, its shape
    # validated once; None (a capability's metric): ``read`` is given the JSON document as saved.
    kind: type[typed.Artifact] | None = None
    # Are the samples repeats of one measurement? Then their spread is the machine's noise (voice_llm.core.analysis.noise
    # warns about it). False for samples that are different measurements by design (the turns of a call: other
    # lines, other replies), whose spread says nothing about the machine; compare's tests use them the same way.
    repeats: bool = True


# Said beside a number measured with cache_prompt false on a server that may ignore it (llama-cpp-python, vLLM,
# Ollama: no timings.cache_n shows that the prompt was recomputed), so it is never labelled "cache off".
CACHE_NOT_DISABLED = "cache not disabled"


def cache_not_disabled(doc: Any) -> bool:
    """Does the artifact say that 'cache off' could not be shown (``unknown.cache_off``, in it or in any row)?"""
    rows = doc if isinstance(doc, list) else [doc]
    return any(isinstance(row, Mapping) and isinstance(row.get("unknown"), Mapping) and "cache_off" in row["unknown"]
               for row in rows)


@dataclass(frozen=True)
class Measured:
    metric: Metric
    median: float
    samples: tuple[float, ...]
    condition_not_held: str | None = None  # e.g. CACHE_NOT_DISABLED

    @property
    def spread(self) -> float | None:
        """(max - min) / median over the samples; None with one sample."""
        return stats.relative_spread(self.samples)

    @property
    def label(self) -> str:
        """The metric's label, with what did not hold when the run could not keep its condition."""
        return f"{self.metric.label} ({self.condition_not_held})" if self.condition_not_held else self.metric.label


def pair_label(a: Measured, b: Measured) -> str:
    """One label for the same metric of two runs: the condition that did not hold in either is named."""
    if a.condition_not_held == b.condition_not_held:
        return a.label
    return f"{a.metric.label} ({a.condition_not_held or 'as asked'} in A, {b.condition_not_held or 'as asked'} in B)"


def number(value: Any) -> float:
    """A finite number of an artifact, or an ArtifactError (a metric's reader raises it for a value it cannot use)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ArtifactError(f"not a finite number: {value!r}")
    return float(value)


def _samples(found: Sequence[float | None], source: str) -> list[float]:
    """A metric's samples; a repeat that left its value null leaves the samples unknown (the metric is dropped)."""
    if any(value is None for value in found):
        raise ArtifactError(f"{source}: a repeat left this number null")
    return [value for value in found if value is not None]


def _ttft(total: bool) -> Callable[[Any], tuple[float, list[float]]]:
    def read(doc: typed.Ttft) -> tuple[float, list[float]]:
        if total:
            return doc.total_p50, [run.total_ms for run in doc.runs]
        return doc.ttft_p50, [run.ttft_ms for run in doc.runs]
    return read


def _prefill(docs: int, key: str) -> Callable[[Any], tuple[float, list[float]]]:
    def read(doc: typed.Prefill) -> tuple[float, list[float]]:
        row = doc.row(docs)
        if row is None:
            raise ArtifactError(f"{names.PREFILL} has no row for {docs} documents")
        value = row.value(key)
        if value is None:
            raise ArtifactError(f"{names.PREFILL}: {key} of {docs} documents is null")
        return value, _samples(row.samples(key), names.PREFILL)
    return read


def _cache(name: str) -> Callable[[Any], tuple[float, list[float]]]:
    def read(doc: typed.Cache) -> tuple[float, list[float]]:
        case = doc.case(name)
        if case is None:
            raise ArtifactError(f"{names.CACHE} has no {name} case")
        return case.ttft_ms, _samples(doc.samples(name), names.CACHE)
    return read


def _sentence(key: str) -> Callable[[Any], tuple[float, list[float]]]:
    def read(doc: typed.Sentence) -> tuple[float, list[float]]:
        return (doc.first_sentence_ms if key == "first_sentence_ms" else doc.total_ms), \
            _samples(doc.samples(key), names.SENTENCE)
    return read


def _cancel_idle(doc: typed.Cancel) -> tuple[float, list[float]]:
    if doc.slot_idle_after_ms is None:
        raise ArtifactError(f"{names.CANCEL}: slot_idle_after_ms is null")
    return doc.slot_idle_after_ms, _samples(doc.idle_samples(), names.CANCEL)


_DOCS = brief.PREFILL_DOC_COUNTS
CORE_METRICS: tuple[Metric, ...] = (
    Metric("ttft_p50_ms", "first token", "ms", names.TTFT, True, _ttft(False), cache_off=True, kind=typed.Ttft),
    Metric("total_p50_ms", "whole answer", "ms", names.TTFT, False, _ttft(True), cache_off=True, kind=typed.Ttft),
    *(Metric(f"prefill_{n}docs_ttft_ms", f"first token, {n} documents", "ms", names.PREFILL, True,
             _prefill(n, "ttft_ms"), cache_off=True, kind=typed.Prefill) for n in _DOCS),
    *(Metric(f"prefill_{n}docs_prompt_ms", f"prefill, {n} documents", "ms", names.PREFILL, False,
             _prefill(n, "prompt_ms"), cache_off=True, kind=typed.Prefill) for n in _DOCS),
    Metric("prompt_n_12docs", "prompt size, 12 documents", "tokens", names.PREFILL, False,
           _prefill(_DOCS[-1], "prompt_n"), cache_off=True, kind=typed.Prefill),
    Metric("cache_first_ttft_ms", "first token, cache miss", "ms", names.CACHE, True, _cache("first"),
           kind=typed.Cache),
    Metric("cache_ttft_ms", "first token, cached prompt", "ms", names.CACHE, True, _cache("second"),
           kind=typed.Cache),
    Metric("cache_suffix_ttft_ms", "first token, changed suffix", "ms", names.CACHE, True, _cache("changed_suffix"),
           kind=typed.Cache),
    Metric("cache_prefix_ttft_ms", "first token, changed prefix", "ms", names.CACHE, True, _cache("changed_prefix"),
           kind=typed.Cache),
    Metric("first_sentence_ms", "first sentence", "ms", names.SENTENCE, True, _sentence("first_sentence_ms"),
           kind=typed.Sentence),
    Metric("sentence_total_ms", "three-sentence answer", "ms", names.SENTENCE, False, _sentence("total_ms"),
           kind=typed.Sentence),
    Metric("cancel_idle_ms", "slot idle after cancel", "ms", names.CANCEL, True, _cancel_idle, kind=typed.Cancel),
)


def all_metrics() -> tuple[Metric, ...]:
    """The core's metrics, then each registered capability's (``Capability.metrics``), in registry order."""
    found = list(CORE_METRICS)
    for capability in registry.capabilities():
        if capability.metrics:
            found.extend(registry.resolve(capability.metrics)())
    return tuple(found)


def by_key() -> dict[str, Metric]:
    """Every metric of :func:`all_metrics` by its key."""
    return {metric.key: metric for metric in all_metrics()}


def label_of(key: str) -> str:
    """A metric's label, or its key when no registered metric has it (a capability left out)."""
    metric = by_key().get(key)
    return metric.label if metric else key


def is_audible(key: str) -> bool:
    """Does the metric ``key`` delay what the caller hears (False when no registered metric has it)?"""
    metric = by_key().get(key)
    return bool(metric and metric.audible)


def read(folder: RunFolder, metric: Metric) -> tuple[float, list[float]]:
    """``metric`` read from its file in ``folder``: the median and the samples. A core metric is given its file's
    typed value (parsed once per folder: a shape it refuses is its ArtifactError line), a capability's the
    document as saved."""
    source = folder.json(metric.source) if metric.kind is None else folder.artifact(metric.kind)
    return metric.read(source)


def unreadable(out: RunFolder | Path) -> dict[str, str]:
    """The metrics whose artifact is in ``out`` but which cannot be read from it (key -> why, one line): what
    :func:`measure_all` leaves out, so that a comparison can say so instead of staying silent."""
    folder = RunFolder.of(out)
    found: dict[str, str] = {}
    for metric in all_metrics():
        if not folder.exists(metric.source):
            continue
        try:
            read(folder, metric)
        except ArtifactError as exc:
            found[metric.key] = str(exc)
        except (KeyError, TypeError, IndexError, AttributeError, ValueError) as exc:
            found[metric.key] = f"{metric.source} does not hold it as a number ({exc.__class__.__name__}: {exc})"
    return found


def measure_all(out: RunFolder | Path) -> dict[str, Measured]:
    """Every metric whose artifact is in ``out`` and readable, in the order of :func:`all_metrics`; a missing or
    malformed artifact only drops its own metrics."""
    folder = RunFolder.of(out)
    found: dict[str, Measured] = {}
    for metric in all_metrics():
        try:
            doc = folder.json(metric.source)
            value, samples = read(folder, metric)
        except (ArtifactError, KeyError, TypeError, IndexError, AttributeError):
            continue  # each file read and parsed once by the folder; a refusal drops only this metric
        held = CACHE_NOT_DISABLED if metric.cache_off and cache_not_disabled(doc) else None
        found[metric.key] = Measured(metric, value, tuple(samples), held)
    return found
