"""``voice-llm compare OUT_A OUT_B``: two runs side by side from their saved files alone, like pyperf's
``compare_to``: every metric, the ratio B/A, and whether the difference is beyond the noise of the repeats.

Significance: with at least five samples a side, a two-sided Mann-Whitney U test at 5 %, on midranks (ties share
the mean of their positions), computed in O(n log n) on the sample counts: one sort of the pooled values. The p
value is exact (the distribution of the rank sum over every split of the pooled ranks, counted by dynamic
programming, so it needs no table and no scipy) while the number of splits C(n1 + n2, n1) is at most
util.stats.EXACT_SPLITS_MAX (about ten samples a side); above that, the normal approximation with tie and continuity
correction. With fewer than five samples a side the difference counts only when the two ranges (min..max) do not
overlap; with one sample on a side it cannot tell. Token counts are exact, so any difference in them is real.

Set-up: every difference between the two runs' set-ups is named (server, model, threads, TTS engine and voice,
the speak step's clause_words, repeats, machine). A metric whose set-up differs in what it depends on (a server
metric when the model, build or threads differ; a first-audio metric also when the TTS differs) is flagged as
such: its change is the set-up's, and it is kept out of "a listener would notice".

Refused (one line, even with --force): a folder with no measurement compare reads (an empty folder, a folder of
``voice-llm load`` alone), and two runs that share no metric.

A difference a listener would notice: at least NOTICE_MS on a number that delays what the caller hears. That is a
rule of thumb, not a measured threshold: people leave gaps of about 200 ms between turns in conversation
(Stivers et al., "Universals and cultural variation in turn-taking in conversation", PNAS 2009), and a change
under a quarter of that is lost in the variation of human turn-taking itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from voice_llm.core import registry
from voice_llm.core.analysis import metrics, noise
from voice_llm.core.run.folder import RunFolder
from voice_llm.core.util import stats
from voice_llm.core.util.artifacts import AUDIO, CACHE, CANCEL, DIAL, PREFILL, SENTENCE
from voice_llm.core.errors import ArtifactError

NOTICE_MS = 50.0
ALPHA = 0.05
RANK_TEST_MIN = 5
class IncomparableRunsError(ArtifactError):
    """The two runs measured different things (other prompts or documents): their numbers do not compare."""


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
    noticeable: bool  # significant, audible, at least NOTICE_MS apart, and the set-ups alike in what it depends on
    line: str
    setup_differs: tuple[str, ...] = ()  # the set-up differences this metric depends on (flagged in its line)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _verdict(a: Sequence[float], b: Sequence[float], unit: str) -> tuple[str, float | None, bool | None]:
    if unit != "ms":
        return "exact count", None, stats.median(a) != stats.median(b)
    if len(a) >= RANK_TEST_MIN and len(b) >= RANK_TEST_MIN:
        p = stats.mann_whitney_p(a, b)
        return "mann-whitney", p, p < ALPHA
    if len(a) < 2 or len(b) < 2:
        return "one sample", None, None
    return "ranges", None, max(a) < min(b) or max(b) < min(a)


def _fmt(value: float, unit: str) -> str:
    if unit == "ms":
        return f"{value:.1f}" if abs(value) < 10 else f"{value:,.0f}"
    return f"{value:,.0f}"


def _line(m: metrics.Metric, a: float, b: float, test: str, p: float | None, significant: bool | None,
          noticeable: bool, n: tuple[int, int], setup_differs: Sequence[str] = (), label: str | None = None) -> str:
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
    if setup_differs:  # not a verdict on the same set-up: what a listener would notice is not said
        tail = f"; set-ups differ in {', '.join(setup_differs)}: the change is theirs, not a like-for-like verdict"
    elif m.audible and significant:
        tail = "; a listener would notice" if noticeable else f"; under {NOTICE_MS:.0f} ms, a listener would not notice"
    return f"{head}, {change}, {verdict}{tail}"


def compare_metric(a: metrics.Measured, b: metrics.Measured, setup_differs: Sequence[str] = ()) -> MetricComparison:
    """B against A. ``setup_differs``: the set-up differences the metric depends on; when there are any, the
    change is the set-up's: the line says so and the metric is never "noticeable" (not a like-for-like verdict)."""
    m = a.metric
    test, p, significant = _verdict(a.samples, b.samples, m.unit)
    audible_change = bool(significant and m.audible and m.unit == "ms" and abs(b.median - a.median) >= NOTICE_MS)
    ratio = b.median / a.median if a.median else None
    label = metrics.pair_label(a, b)  # names a condition that did not hold ("cache not disabled")
    line = _line(m, a.median, b.median, test, p, significant, audible_change, (len(a.samples), len(b.samples)),
                 setup_differs, label)
    return MetricComparison(m.key, label, m.unit, a.median, b.median, a.samples, b.samples, ratio, test, p,
                            significant, m.audible, audible_change and not setup_differs, line, tuple(setup_differs))


# --- two runs -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSide:
    out: Path
    run_id: str | None
    metadata: Mapping[str, Any]
    noise: Mapping[str, Any]
    setup: Mapping[str, Any]  # label -> value, see setup_of
    found: Mapping[str, metrics.Measured]  # the run's metrics
    unreadable: Mapping[str, str] = field(default_factory=dict)  # metric key -> why its file could not give it


# What a metric depends on. A difference in SERVER or MACHINE concerns every metric (each is timed through the
# LLM server on that machine); a difference in TTS concerns first audio only; OTHER is named, never a confound
# (repeats change the sample counts, which the tests take into account; the tool's own version is named).
SERVER, TTS, MACHINE, OTHER = "server", "tts", "machine", "other"
# A difference of the line (codec, rate, jitter buffer, loss, echo) concerns what the caller hears on it (dial.json's
# numbers); the agent itself is what two dial runs compare, so a different agent is named, never a confound.
LINE = "line"

# What is shown when it differs: (label, what it concerns, path into run.json's metadata).
_META_FIELDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("voice-llm", OTHER, ("voice_llm",)),
    ("llama.cpp source", SERVER, ("llama_cpp_source",)),
    ("server build", SERVER, ("server", "build_info")),
    ("model", SERVER, ("model", "file")),
    ("model sha256", SERVER, ("model", "sha256")),
    ("n_ctx", SERVER, ("server", "n_ctx")),
    ("slots", SERVER, ("server", "total_slots")),
    ("threads", SERVER, ("server", "threads")),
    ("CPU", MACHINE, ("machine", "cpu_model")),
    ("cores", MACHINE, ("machine", "cores")),
    ("machine", MACHINE, ("machine", "hostname")),
    ("python", OTHER, ("python",)),
)
# From audio.json (the speak step): the TTS and the strategy options.
AUDIO_FIELDS: tuple[tuple[str, str], ...] = (
    ("TTS engine", "engine"), ("TTS voice", "voice"), ("TTS voice option", "voice_option"),
    ("TTS versions", "versions"), ("clause_words", "clause_words"), ("TTS prompt", "prompt"),
)
# From dial.json (a call on the line): the agent (named) and the line's conditions (what heard numbers depend on).
DIAL_FIELDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("agent", OTHER, ("agent", "identity", "engine")),
    ("agent server header", OTHER, ("agent", "headers", "server")),
    ("line protocol", LINE, ("line", "protocol")),
    ("line codec", LINE, ("line", "codec")),
    ("line rate", LINE, ("line", "rate")),
    ("jitter buffer ms", LINE, ("line", "jitter_ms")),
    ("line loss %", LINE, ("line", "loss_pct")),
    ("echo dB", LINE, ("line", "echo_db")),
    ("caller audio", OTHER, ("caller", "source")),
)
# The repeats each step made (the --repeat it ran with, as its file shows it).
_REPEATED = (PREFILL, CACHE, SENTENCE, CANCEL)
CONCERNS: dict[str, str] = {
    **{label: concern for label, concern, _ in _META_FIELDS},
    **{label: TTS for label, _ in AUDIO_FIELDS},
    **{label: concern for label, concern, _ in DIAL_FIELDS},
    **{f"repeat ({name})": OTHER for name in (*_REPEATED, AUDIO)},
}


def meta_value(metadata: Mapping[str, Any], path: Sequence[str]) -> Any:
    value: Any = metadata
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _repeats(doc: Any) -> int | None:
    row = doc[0] if isinstance(doc, list) and doc else doc
    repeats = row.get("repeats") if isinstance(row, Mapping) else None
    return len(repeats) if isinstance(repeats, list) else None


def setup_of(out: RunFolder | Path, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Every set-up fact of the run in ``out`` that compare names when it differs: run.json's metadata, the
    speak step's engine, voice and options (audio.json), and the repeats of each step. None: not recorded."""
    folder = RunFolder.of(out)
    setup = {label: meta_value(metadata, path) for label, _, path in _META_FIELDS}
    docs: dict[str, Any] = {}
    for name in (*_REPEATED, AUDIO, DIAL):
        try:
            docs[name] = folder.json(name)
        except ArtifactError:
            docs[name] = None
    audio = docs[AUDIO] if isinstance(docs[AUDIO], Mapping) else {}
    setup.update({label: audio.get(key) for label, key in AUDIO_FIELDS})
    dial = docs[DIAL] if isinstance(docs[DIAL], Mapping) else {}
    setup.update({label: meta_value(dial, path) for label, _, path in DIAL_FIELDS})
    setup.update({f"repeat ({name})": _repeats(docs[name]) for name in _REPEATED})
    setup[f"repeat ({AUDIO})"] = audio.get("repeat")
    return setup


def metadata_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(label, A, B) for each set-up fact that differs; ``a`` and ``b`` come from setup_of()."""
    return [(label, a.get(label), b.get(label)) for label in CONCERNS if a.get(label) != b.get(label)]


def _depends_on(metric: metrics.Metric, differences: Sequence[tuple[str, Any, Any]]) -> tuple[str, ...]:
    # First audio hangs on the speak step's TTS; what the caller hears on the line, on the line's conditions (its
    # agent speaks with a TTS of its own, named in the agent's identity); every number on the server and machine.
    concerns = {AUDIO: {SERVER, MACHINE, TTS}, DIAL: {SERVER, MACHINE, LINE}}.get(metric.source, {SERVER, MACHINE})
    return tuple(label for label, _, _ in differences if CONCERNS[label] in concerns)


def _measurements(folder: RunFolder) -> dict[str, metrics.Measured]:
    found = metrics.measure_all(folder)
    out = folder.path
    if not found:
        held = sorted(path.name for path in out.iterdir() if path.is_file())[:8] if out.is_dir() else []
        what = f"it holds {', '.join(held)}" if held else "it is empty"
        sources = ", ".join(dict.fromkeys(m.source for m in metrics.all_metrics()))
        raise IncomparableRunsError(f"{out} has no measurement compare reads ({sources}); {what}: "
                                    "compare two folders of `voice-llm lab` or its steps")
    return found


def _side(out: Path, others: bool = False) -> RunSide:
    """One run's side. ``others``: a capability compares these folders itself (two load runs), so a side without
    any of the core's metrics is no refusal."""
    if not out.is_dir():
        raise ArtifactError(f"no run folder at {out}")
    folder = RunFolder(out)  # each side read once
    folder.require_known_schema()
    folder.require_one_run()  # never compare a folder that is itself a mix of runs
    # a folder of another kind, or without measurements: refused even with --force
    found = metrics.measure_all(folder) if others else _measurements(folder)
    record = folder.record
    metadata = (record.doc.get("metadata") or {}) if record else {}
    return RunSide(out, record.run_id if record else None, metadata, noise.assess(folder), setup_of(folder, metadata),
                   found, metrics.unreadable(folder))


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
    # what capabilities compared themselves (Capability.compare: load's steps), each {"kind", "lines", ...}
    others: tuple[Mapping[str, Any], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        side = lambda s: {"out": str(s.out), "run_id": s.run_id, "noisy": s.noise.get("noisy"),  # noqa: E731
                          "noise_reasons": s.noise.get("reasons"), "setup": dict(s.setup)}
        return {
            "a": side(self.a), "b": side(self.b),
            "metadata_differences": [{"field": f, "a": x, "b": y} for f, x, y in self.differences],
            "forced_over": list(self.forced),
            "metrics": [m.as_dict() for m in self.metrics],
            "only_in_one": list(self.only_in_one),
            "notice_ms": NOTICE_MS, "alpha": ALPHA,
            "capabilities": [dict(other) for other in self.others],
        }


def compare_runs(out_a: Path, out_b: Path, force: bool = False) -> Comparison:
    """Both runs' metrics side by side. Raises IncomparableRunsError when they measured different prompts or
    documents (or the files cannot tell) unless ``force``; a folder mixing runs is always refused."""
    others = capability_comparisons(out_a, out_b)
    a, b = _side(out_a, bool(others)), _side(out_b, bool(others))
    found_a, found_b = a.found, b.found
    shared = [key for key in found_a if key in found_b]
    # The prompts and documents matter to the core's metrics; a capability's own comparison says what it needs
    # alike (load: the same metric and budget), so two runs that share no core metric are not refused for them.
    refused = _refusals(a, b) if shared or not others else []
    if refused and not force:
        raise IncomparableRunsError(f"will not compare {out_a} with {out_b}: {'; '.join(refused)}; "
                                    "pass --force to compare anyway")
    if not shared and not others:
        raise IncomparableRunsError(f"will not compare {out_a} with {out_b}: they share no measured metric "
                                    f"(A has {', '.join(found_a) or 'none'}; B has {', '.join(found_b) or 'none'})")
    differences = tuple(metadata_differences(a.setup, b.setup))
    rows = tuple(compare_metric(found_a[key], found_b[key], _depends_on(found_a[key].metric, differences))
                 for key in shared)
    only = tuple(sorted(set(found_a) ^ set(found_b)))
    return Comparison(a, b, rows, only, differences, tuple(refused), others)


def capability_comparisons(out_a: Path, out_b: Path) -> tuple[Mapping[str, Any], ...]:
    """What each registered capability with a ``compare`` hook says of the two folders (those of its kind)."""
    found = []
    for capability in registry.capabilities():
        if capability.compare and out_a.is_dir() and out_b.is_dir():
            result = registry.resolve(capability.compare)(out_a, out_b)
            if result:
                found.append(result)
    return tuple(found)


def noise_brief(assessment: Mapping[str, Any]) -> str:
    """One line: the load reason as it is, the spreads counted with the widest named."""
    reasons = [r for r in assessment.get("reasons") or [] if r.startswith("load average")]
    spread = {k: v for k, v in (assessment.get("spread") or {}).items() if k in (assessment.get("affected") or [])
              and v > noise.SPREAD_LIMIT}
    if spread:
        widest = max(spread, key=lambda k: spread[k])
        label = metrics.label_of(widest)
        reasons.append(f"{len(spread)} numbers spread over {noise.SPREAD_LIMIT:.0%} across their repeats "
                       f"(widest: {label}, {spread[widest]:.0%})")
    return "; ".join(reasons)


def shown(value: Any, missing: str = "(not recorded)", quote: bool = False) -> str:
    """A set-up value as a person reads it (never a Python repr): a mapping as "name value, name value" (the TTS
    versions: "piper-tts 1.8.0, onnxruntime 1.19.2"), a list joined by commas, a string as it is (in quotes with
    ``quote``, where a line holds several: "TTS engine 'piper' -> 'espeak'")."""
    if value is None:
        return missing
    if isinstance(value, str) and quote:
        return f"'{value}'"
    if isinstance(value, Mapping):
        return ", ".join(f"{key} {shown(item, '—')}" for key, item in value.items()) or "none"
    if isinstance(value, (list, tuple)):
        return ", ".join(shown(item, "—") for item in value) or "none"
    return str(value)



def summary_lines(comparison: Comparison) -> list[str]:
    """What ``voice-llm compare`` prints: the runs, what differs in their set-up, a line per metric, a verdict."""
    a, b = comparison.a, comparison.b
    lines = [f"A: {a.out} (run {a.run_id or 'without id'})", f"B: {b.out} (run {b.run_id or 'without id'})"]
    lines += [f"forced past: {reason}" for reason in comparison.forced]
    if comparison.differences:
        lines.append("set-up differs: " + "; ".join(f"{f} {shown(x, quote=True)} -> {shown(y, quote=True)}" for f, x, y in comparison.differences))
    else:
        lines.append("set-up: the same model, server build, threads, TTS, repeats and machine")
    for side, name in ((a, "A"), (b, "B")):
        if side.noise.get("noisy"):
            lines.append(f"run {name} was noisy: {noise_brief(side.noise)}")
    lines += [m.line for m in comparison.metrics]
    # A metric whose file is there but cannot be read is said, never dropped: "nothing" must not hide it.
    unread = [(name, key, why) for side, name in ((a, "A"), (b, "B")) for key, why in side.unreadable.items()]
    for name, key, why in unread:
        lines.append(f"cannot compare {metrics.label_of(key)}: run {name}'s file does not give it ({why})")
    if comparison.only_in_one:
        # "; " between labels: a label has commas of its own ("first token, cache miss").
        lines.append("measured in one run only: " + "; ".join(
            metrics.label_of(key) for key in comparison.only_in_one))
    changed = [m for m in comparison.metrics if m.setup_differs and m.significant and m.audible
                and abs(m.b - m.a) >= NOTICE_MS]
    if changed:
        why = sorted({label for m in changed for label in m.setup_differs}, key=list(CONCERNS).index)
        lines.append(f"changed with the set-up ({', '.join(why)}), not judged like for like: "
                     + "; ".join(m.label for m in changed))
    lines += [line for other in comparison.others for line in other.get("lines") or []]
    if not comparison.metrics:  # only a capability's own comparison (two load runs): its lines are the verdict
        return lines
    heard = [m.label for m in comparison.metrics if m.noticeable]
    untold = [metrics.label_of(key) for _, key, _ in unread if metrics.is_audible(key)]
    if heard:
        verdict = "; ".join(heard)
    elif changed:  # a change a listener would hear, but of the set-up: said why there is no like-for-like verdict
        unread_too = f"; {'; '.join(dict.fromkeys(untold))} could not be read" if untold else ""
        verdict = (f"cannot tell like for like: the set-ups differ ({', '.join(why)}), and what changed in what the "
                   f"caller hears ({'; '.join(m.label for m in changed)}) is theirs{unread_too}")
    elif untold:
        verdict = f"cannot tell ({'; '.join(dict.fromkeys(untold))} could not be read)"
    else:
        verdict = f"nothing (no significant change of {NOTICE_MS:.0f} ms or more in what the caller hears)"
    lines.append("a listener would notice: " + verdict)
    return lines
