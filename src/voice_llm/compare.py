"""``voice-llm compare OUT_A OUT_B``: two runs side by side from their saved files alone, like pyperf's
``compare_to``: every metric, the ratio B/A, and whether the difference is beyond the noise of the repeats.

Significance: with at least five samples a side, a two-sided Mann-Whitney U test (exact over every split of the
pooled ranks, so it needs no table and no scipy) at 5 %; with fewer, the difference counts only when the two
ranges (min..max) do not overlap; with one sample on a side it cannot tell. Token counts are exact, so any
difference in them is real.

A difference a listener would notice: at least NOTICE_MS on a number that delays what the caller hears. That is a
rule of thumb, not a measured threshold: people leave gaps of about 200 ms between turns in conversation
(Stivers et al., "Universals and cultural variation in turn-taking in conversation", PNAS 2009), and a change
under a quarter of that is lost in the variation of human turn-taking itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

from voice_llm import metrics, noise, runmeta, spread
from voice_llm.errors import ArtifactError

NOTICE_MS = 50.0
ALPHA = 0.05
RANK_TEST_MIN = 5
EXACT_SPLITS_MAX = 200_000


class IncomparableRunsError(ArtifactError):
    """The two runs measured different things (other prompts or documents): their numbers do not compare."""


# --- statistics -------------------------------------------------------------------------------------------------


def _midranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1  # ties share the mean of their positions, counted from 1
        i = j + 1
    return ranks


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test: the share of all ways to split the pooled values into groups
    of len(a) and len(b) whose U is at least as far from its mean as the observed one (exact, ties as midranks);
    a normal approximation with tie correction when there are too many splits to count."""
    n1, n2 = len(a), len(b)
    if not n1 or not n2:
        raise ValueError("the rank test needs samples on both sides")
    ranks = _midranks([*a, *b])
    offset = n1 * (n1 + 1) / 2
    mean = n1 * n2 / 2
    observed = abs(sum(ranks[:n1]) - offset - mean)
    if math.comb(n1 + n2, n1) <= EXACT_SPLITS_MAX:
        splits = list(combinations(ranks, n1))
        extreme = sum(1 for split in splits if abs(sum(split) - offset - mean) >= observed - 1e-9)
        return extreme / len(splits)
    total = n1 + n2
    ties = sum(t ** 3 - t for t in (ranks.count(r) for r in set(ranks)))
    sigma = math.sqrt(n1 * n2 / 12 * ((total + 1) - ties / (total * (total - 1))))
    if sigma == 0:
        return 1.0
    return math.erfc(max(observed - 0.5, 0.0) / sigma / math.sqrt(2))


# --- one metric ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricComparison:
    key: str
    label: str
    unit: str
    a: float
    b: float
    a_samples: tuple[float, ...]
    b_samples: tuple[float, ...]
    ratio: float | None  # b / a
    test: str  # "mann-whitney", "ranges", "exact count" or "one sample"
    p_value: float | None
    significant: bool | None  # None: cannot tell
    audible: bool
    noticeable: bool  # significant, audible and at least NOTICE_MS apart
    line: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _verdict(a: Sequence[float], b: Sequence[float], unit: str) -> tuple[str, float | None, bool | None]:
    if unit != "ms":
        return "exact count", None, spread.median(a) != spread.median(b)
    if len(a) >= RANK_TEST_MIN and len(b) >= RANK_TEST_MIN:
        p = mann_whitney_p(a, b)
        return "mann-whitney", p, p < ALPHA
    if len(a) < 2 or len(b) < 2:
        return "one sample", None, None
    return "ranges", None, max(a) < min(b) or max(b) < min(a)


def _fmt(value: float, unit: str) -> str:
    if unit == "ms":
        return f"{value:.1f}" if abs(value) < 10 else f"{value:,.0f}"
    return f"{value:,.0f}"


def _line(m: metrics.Metric, a: float, b: float, test: str, p: float | None, significant: bool | None,
          noticeable: bool, n: tuple[int, int], label: str | None = None) -> str:
    head = f"{label or m.label} {_fmt(a, m.unit)} -> {_fmt(b, m.unit)} {m.unit}"
    if a == b or (a and abs(b - a) / abs(a) < 0.005):
        change = "the same"
    elif a == 0:
        change = "from zero"
    elif m.unit == "ms":
        pct = abs(b - a) / a * 100
        words = ("sooner", "later") if m.audible else ("faster", "slower")
        change = f"{pct:.0f} % {words[0] if b < a else words[1]}"
    else:
        change = f"{(b - a) / a * 100:+.0f} %"
    if significant is None:
        verdict = f"cannot tell ({n[0]} vs {n[1]} samples)"
    elif test == "mann-whitney":
        verdict = f"{'significant' if significant else 'within the noise'} (Mann-Whitney p={p:.3f}, {n[0]} vs {n[1]})"
    elif test == "ranges":
        verdict = f"{'significant' if significant else 'within the noise'} (ranges {'apart' if significant else 'overlap'}, {n[0]} vs {n[1]})"
    else:
        verdict = "differs" if significant else "same"
    tail = ""
    if m.audible and significant:
        tail = "; a listener would notice" if noticeable else f"; under {NOTICE_MS:.0f} ms, a listener would not notice"
    return f"{head}, {change}, {verdict}{tail}"


def compare_metric(a: metrics.Measured, b: metrics.Measured) -> MetricComparison:
    m = a.metric
    test, p, significant = _verdict(a.samples, b.samples, m.unit)
    noticeable = bool(significant and m.audible and m.unit == "ms" and abs(b.median - a.median) >= NOTICE_MS)
    ratio = b.median / a.median if a.median else None
    label = metrics.pair_label(a, b)  # names a condition that did not hold ("cache not disabled")
    line = _line(m, a.median, b.median, test, p, significant, noticeable, (len(a.samples), len(b.samples)), label)
    return MetricComparison(m.key, label, m.unit, a.median, b.median, a.samples, b.samples, ratio, test, p,
                            significant, m.audible, noticeable, line)


# --- two runs -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSide:
    out: Path
    run_id: str | None
    metadata: Mapping[str, Any]
    noise: Mapping[str, Any]


# What is shown when it differs: (label, path into run.json's metadata).
_META_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("voice-llm", ("voice_llm",)),
    ("llama.cpp source", ("llama_cpp_source",)),
    ("server build", ("server", "build_info")),
    ("model", ("model", "file")),
    ("model sha256", ("model", "sha256")),
    ("n_ctx", ("server", "n_ctx")),
    ("slots", ("server", "total_slots")),
    ("threads", ("server", "threads")),
    ("CPU", ("machine", "cpu_model")),
    ("cores", ("machine", "cores")),
    ("machine", ("machine", "hostname")),
    ("python", ("python",)),
)


def meta_value(metadata: Mapping[str, Any], path: Sequence[str]) -> Any:
    value: Any = metadata
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def metadata_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    return [(label, meta_value(a, path), meta_value(b, path)) for label, path in _META_FIELDS
            if meta_value(a, path) != meta_value(b, path)]


def _side(out: Path) -> RunSide:
    if not out.is_dir():
        raise ArtifactError(f"no run folder at {out}")
    runmeta.require_one_run(out)  # never compare a folder that is itself a mix of runs
    record = runmeta.RunRecord.load(out)
    metadata = (record.doc.get("metadata") or {}) if record else {}
    return RunSide(out, record.run_id if record else None, metadata, noise.assess(out))


def _refusals(a: RunSide, b: RunSide) -> list[str]:
    """Why the two runs did not measure the same thing (empty: they did, as far as the files tell)."""
    reasons = []
    for what, path in (("prompts", ("prompts", "sha256")), ("KB documents", ("kb", "sha256"))):
        left, right = meta_value(a.metadata, path), meta_value(b.metadata, path)
        if left is None or right is None:
            missing = a.out if left is None else b.out
            reasons.append(f"cannot tell whether the {what} are the same: {missing} has no run.json saying which")
        elif left != right:
            reasons.append(f"the {what} differ ({what} sha256 {left[:12]} vs {right[:12]})")
    return reasons


@dataclass(frozen=True)
class Comparison:
    a: RunSide
    b: RunSide
    metrics: tuple[MetricComparison, ...]
    only_in_one: tuple[str, ...]
    differences: tuple[tuple[str, Any, Any], ...]
    forced: tuple[str, ...]  # the refusals --force overrode

    def as_dict(self) -> dict[str, Any]:
        side = lambda s: {"out": str(s.out), "run_id": s.run_id, "noisy": s.noise.get("noisy"),  # noqa: E731
                          "noise_reasons": s.noise.get("reasons")}
        return {
            "a": side(self.a), "b": side(self.b),
            "metadata_differences": [{"field": f, "a": x, "b": y} for f, x, y in self.differences],
            "forced_over": list(self.forced),
            "metrics": [m.as_dict() for m in self.metrics],
            "only_in_one": list(self.only_in_one),
            "notice_ms": NOTICE_MS, "alpha": ALPHA,
        }


def compare_runs(out_a: Path, out_b: Path, force: bool = False) -> Comparison:
    """Both runs' metrics side by side. Raises IncomparableRunsError when they measured different prompts or
    documents (or the files cannot tell) unless ``force``; a folder mixing runs is always refused."""
    a, b = _side(out_a), _side(out_b)
    refused = _refusals(a, b)
    if refused and not force:
        raise IncomparableRunsError(f"will not compare {out_a} with {out_b}: {'; '.join(refused)}; "
                                    "pass --force to compare anyway")
    found_a, found_b = metrics.measure_all(out_a), metrics.measure_all(out_b)
    rows = tuple(compare_metric(found_a[key], found_b[key]) for key in found_a if key in found_b)
    only = tuple(sorted(set(found_a) ^ set(found_b)))
    return Comparison(a, b, rows, only, tuple(metadata_differences(a.metadata, b.metadata)), tuple(refused))


def noise_brief(assessment: Mapping[str, Any]) -> str:
    """One line: the load reason as it is, the spreads counted with the widest named."""
    reasons = [r for r in assessment.get("reasons") or [] if r.startswith("load average")]
    spread = {k: v for k, v in (assessment.get("spread") or {}).items() if k in (assessment.get("affected") or [])
              and v > noise.SPREAD_LIMIT}
    if spread:
        widest = max(spread, key=lambda k: spread[k])
        label = metrics.BY_KEY[widest].label if widest in metrics.BY_KEY else widest
        reasons.append(f"{len(spread)} numbers spread over {noise.SPREAD_LIMIT:.0%} across their repeats "
                       f"(widest: {label}, {spread[widest]:.0%})")
    return "; ".join(reasons)


def summary_lines(comparison: Comparison) -> list[str]:
    """What ``voice-llm compare`` prints: the runs, what differs in their set-up, a line per metric, a verdict."""
    a, b = comparison.a, comparison.b
    lines = [f"A: {a.out} (run {a.run_id or 'without id'})", f"B: {b.out} (run {b.run_id or 'without id'})"]
    lines += [f"forced past: {reason}" for reason in comparison.forced]
    if comparison.differences:
        lines.append("set-up differs: " + "; ".join(f"{f} {x!r} -> {y!r}" for f, x, y in comparison.differences))
    else:
        lines.append("set-up: the same model, server build, threads and machine")
    for side, name in ((a, "A"), (b, "B")):
        if side.noise.get("noisy"):
            lines.append(f"run {name} was noisy: {noise_brief(side.noise)}")
    lines += [m.line for m in comparison.metrics]
    if comparison.only_in_one:
        lines.append("measured in one run only: " + ", ".join(comparison.only_in_one))
    heard = [m.label for m in comparison.metrics if m.noticeable]
    lines.append("a listener would notice: " + ("; ".join(heard) if heard else f"nothing (no significant change of "
                                                 f"{NOTICE_MS:.0f} ms or more in what the caller hears)"))
    return lines
