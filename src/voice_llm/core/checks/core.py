"""Check a lab's artifacts against each other, from the saved files alone (no server is queried).

Like a grader, it trusts no number on its own: it re-derives what it can from the raw evidence (chunks.jsonl
from sse_raw.txt, medians from the runs, report.json from its sources) and checks the relations the brief
names within one run (first token < total, long prompt > short, cache hit < no cache).

The core's checks live here; every capability's (the speak step's audio, the repeats, call and load) come through
the plugin seam (:mod:`voice_llm.core.registry`: CheckEntry items, resolved by name when they run), so this module
imports no capability and a capability left out of the registry leaves no row. Each check takes the run folder
read once (:class:`voice_llm.core.run.folder.RunFolder`) or a path (then it reads what it needs itself).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from voice_llm.core import registry
from voice_llm.core.registry import CheckEntry
from voice_llm.core.util import artifacts as names
from voice_llm.core.run import artifacts as typed
from voice_llm.core.run.folder import RunFolder
from voice_llm.core.run.lock import LOCK_NAME
from voice_llm.core.scenario import brief
from voice_llm.core.util import stats
from voice_llm.core.util.artifacts import loads_json
from voice_llm.core.checks.base import (FAIL, FINDING, NOT_CHECKABLE, PASS, CheckFailed, CheckResult, Finding,
                                 NotCheckable, expect, finite_number, require, unless_missed)
from voice_llm.core.errors import ArtifactError
from voice_llm.core.analysis.keynumbers import build_report
from voice_llm.core.sse import SSEDecoder

__all__ = ["CHECKS", "cancel_idle_limit", "capability_checks", "left_out_checks", "ran_steps", "known_artifacts", "FAIL", "FINDING", "NOT_CHECKABLE", "PASS", "CheckEntry", "CheckFailed", "CheckResult", "Finding",
           "NotCheckable", "finite_number", "iter_checks", "require", "run_checks"]

# The names this module has always used for the rules it shares with the feature checks (voice_llm.core.checks.base).
_Failed = CheckFailed
_require, _num = require, finite_number


def _known(value: float | None, unknown: Any, key: str, what: str) -> float:
    """``value`` (a typed artifact's field ``key``), or NotCheckable with the reason the step wrote in its
    ``unknown`` when it had to leave it null."""
    if value is None:
        reason = unknown.get(key) if isinstance(unknown, Mapping) else None
        raise NotCheckable(f"{what} is null: {reason or 'no reason recorded'}")
    return value


def _raw_events(out: RunFolder | Path) -> list[dict[str, Any] | str]:
    """The data of every event in sse_raw.txt, decoded by the same rules as the live stream."""
    decoder = SSEDecoder()
    raw = RunFolder.of(out).bytes(names.SSE_RAW)  # missing, a link, FIFO or device: an ArtifactError, never a hang
    events = decoder.feed(raw) + decoder.end()
    parsed: list[dict[str, Any] | str] = []
    for event in events:
        parsed.append(event.data if event.data == "[DONE]" else loads_json(event.data, f"an event in {names.SSE_RAW}"))
    return parsed


def _delta(event: dict[str, Any]) -> dict[str, Any]:
    choices = event.get("choices") or [{}]
    return choices[0].get("delta") or {}


PLAN_CHECK = "run.json: a plan of the run's steps"


class _BadPlan(Exception):
    """run.json has a run id but no readable plan: which relations the run must satisfy is unknown."""


@dataclass(frozen=True)
class _Plan:
    """What run.json says the run is: the steps it planned, those it ran (or failed in), and the files each leaves.
    A run plans what its commands planned (a step run on its own, itself; a command joining the run adds its
    steps); the relations of a planned step that never ran in this folder (a lab stopped by a failure or a kill)
    are not checked, and its files are not required."""

    planned: tuple[str, ...]
    ran: tuple[str, ...]  # planned steps that ran or failed, in the plan's order
    required: tuple[str, ...]  # the files the steps in ``ran`` leave
    # The step a Ctrl-C or SIGTERM stopped (run.json: failure "interrupted"), when it had not finished before in
    # this run: it did not run to its end, so it is not in ``ran`` (its relations are not checkable, not failed).
    interrupted: str | None = None
    # The step that failed leaving only its partial file (StepEntry.partial: dial's dial-partial.json) and none of
    # its artifacts: its checks have nothing to read, which `check` says once (_failed_with_partial), and its
    # artifacts are not required (the failure itself fails "the run finished every step").
    failed_partial: tuple[str, str] | None = None

    @property
    def not_run(self) -> tuple[str, ...]:
        return tuple(step for step in self.planned if step not in self.ran)

    @property
    def checked(self) -> tuple[str, ...]:
        """The steps whose relations are checked: those that ran, but a step that failed leaving only its partial."""
        failed = self.failed_partial[0] if self.failed_partial else None
        return tuple(step for step in self.ran if step != failed)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) and item for item in value)


def _plan(out: RunFolder | Path) -> _Plan | None:
    """The run's plan from run.json; None for a folder without a run.json with a run id (an older voice-llm:
    all the brief's relations, the brief's ten files). Raises _BadPlan when run.json has a run id but no valid
    plan, so that check never passes relations it did not select."""
    record = RunFolder.of(out).record
    if record is None:
        return None
    doc = record.doc
    planned = doc.get("steps_planned")
    if not _strings(planned) or not planned:
        raise _BadPlan(f"steps_planned is {planned!r}, not a non-empty list of step names")
    expected = doc.get("expected_artifacts")
    if not _strings(expected):
        raise _BadPlan(f"expected_artifacts is {expected!r}, not a list of file names")
    steps = doc.get("steps")
    if not isinstance(steps, list) or not all(isinstance(s, dict) and isinstance(s.get("step"), str) for s in steps):
        raise _BadPlan(f"steps is {steps!r:.200}, not a list of {{\"step\": name, ...}}")
    done = {s["step"] for s in steps}
    failed = doc.get("failed_step")
    if failed is not None and not isinstance(failed, str):
        raise _BadPlan(f"failed_step is {failed!r}, not a step name or null")
    stray = sorted((done | ({failed} if failed else set())) - set(planned))
    if stray:
        raise _BadPlan(f"steps {', '.join(stray)} ran but are not in steps_planned {planned}")
    # Interrupted (session.describe writes "interrupted"): the files of a step cut short are kept, complete or as
    # .partial, and prove nothing about its relations; a failure of any other kind is the run's failure.
    interrupted = failed if failed and doc.get("failure") == "interrupted" and failed not in done else None
    ran = tuple(step for step in dict.fromkeys(planned) if step in done or (step == failed and step != interrupted))
    failed_partial = _partial_left(RunFolder.of(out), failed) if failed and failed in ran and failed not in done \
        else None
    by_step = doc.get("artifacts_by_step")
    if by_step is None:  # a run.json from before artifacts_by_step: every expected file, as before
        required = tuple(expected)
    elif isinstance(by_step, dict) and all(_strings(files) for files in by_step.values()) \
            and set(planned) <= set(by_step):
        required = tuple(dict.fromkeys(name for step in ran for name in by_step[step]
                                       if not (failed_partial and step == failed_partial[0])))
        extra = sorted(set(required) - set(expected))
        if extra:
            raise _BadPlan(f"artifacts_by_step names files not in expected_artifacts: {', '.join(extra)}")
    else:
        raise _BadPlan(f"artifacts_by_step is {by_step!r:.200}, not the files of each planned step")
    return _Plan(tuple(dict.fromkeys(planned)), ran, required, interrupted, failed_partial)


def _partial_left(folder: RunFolder, step: str) -> tuple[str, str] | None:
    """(step, its partial file) when the failed ``step`` left its partial file (StepEntry.partial) and none of its
    artifacts; None otherwise (an artifact there, an earlier call's dial.json, is checked as ever)."""
    entry = next((s for c in registry.capabilities() for s in c.steps if s.name == step), None)
    if entry is None or entry.partial is None or not folder.is_file(entry.partial):
        return None
    if any(folder.exists(name) for name in entry.artifacts):
        return None
    return step, entry.partial


def _failed_with_partial(folder: RunFolder, plan: _Plan | None) -> list[CheckResult]:
    """One line for a step that failed leaving only its partial file: it failed (its reason is in "the run
    finished every step"), where what it measured until then is, and that its checks need the artifact it never
    wrote: never a FAIL per check of a file the failure kept from being written."""
    if plan is None or plan.failed_partial is None:
        return []
    step, partial = plan.failed_partial
    entries = [e for e in capability_checks(folder, (step,)) if e.step == step]
    files = [partial]
    try:
        named = folder.json(partial).get("files")
    except (ArtifactError, AttributeError):
        named = None
    if isinstance(named, Mapping):
        for value in named.values():
            for name in (value if isinstance(value, list) else [value]):
                if isinstance(name, str) and name and folder.is_file(name):
                    files.append(f"{name} ({folder.file(name).stat().st_size} bytes)")
    record = folder.record
    artifacts = ", ".join((record.doc.get("artifacts_by_step") or {}).get(step) or ()) if record else ""
    return [CheckResult(f"{step}: its checks", NOT_CHECKABLE,
                        f"step {step} failed (see \"the run finished every step\"); what it had until then is in "
                        f"{', '.join(files)}; its {len(entries)} checks need {artifacts or 'its artifacts'}, which "
                        "it never wrote")]


def ran_steps(out: RunFolder | Path) -> tuple[str, ...] | None:
    """The steps that ran in this folder, by its run.json's plan (an interrupted step's not among them); None for a
    folder without run.json with a run id, or whose plan is not valid (check says why): nothing tells then."""
    try:
        plan = _plan(out)
    except _BadPlan:
        return None
    return None if plan is None else plan.ran


def _required(out: RunFolder | Path) -> list[str]:
    """The files the run's steps that ran leave (the brief's ten without a run.json)."""
    plan = _plan(out)
    return list(names.REQUIRED) if plan is None else list(plan.required)


def check_files(out: RunFolder | Path) -> str:
    """Invariant: every file the run's steps leave is there and parses (only the steps that ran in this folder)."""
    folder = RunFolder.of(out)
    required = _required(folder)
    missing = [name for name in required if not folder.file(name).is_file()]  # run.json names only OUT's files
    _require(not missing, f"missing: {', '.join(missing)}")
    for name in required:
        if name.endswith(".json"):
            folder.json(name)
        elif name.endswith(".jsonl"):
            folder.jsonl(name)
    return f"{len(required)} files present and parse"


def check_one_run(out: RunFolder | Path) -> str:
    """Invariant: every file is the bytes this run wrote (sha256 in run.json), none is another run's."""
    found = RunFolder.of(out).membership()
    if found.run_id is None:
        raise NotCheckable("no run.json with a run id (artifacts from an older voice-llm): cannot tell runs apart")
    _require(not found.mixed, "files from other runs: " + ", ".join(
        f"{name} (run {run})" for name, run in found.other_runs.items()))
    _require(not found.changed, "not as this run wrote them (changed, or left by another run): " + ", ".join(found.changed))
    _require(not found.missing, "written by the run but now missing: " + ", ".join(found.missing))
    record = RunFolder.of(out).record
    files = len((record.doc.get("artifacts") or {}) if record else {})
    return f"run {found.run_id}: {files} files, each as the run wrote it"


def check_run_finished(out: RunFolder | Path) -> str:
    """Invariant: run.json records the end of the steps that ran, and no failure."""
    record = RunFolder.of(out).record
    if record is None:
        raise NotCheckable("no run.json with a run id")
    failed = record.doc.get("failed_step")
    if failed is not None and record.doc.get("failure") == "interrupted":
        # Ctrl-C or SIGTERM is no inconsistent evidence: what ran is checked, what did not is not checkable.
        raise NotCheckable(f"interrupted during step {failed} (Ctrl-C or SIGTERM): it did not run to its end; "
                           "the steps that finished are checked")
    _require(failed is None, f"the run failed at step {failed}: {record.doc.get('failure') or 'no reason recorded'}")
    _require(record.doc.get("ended_at") is not None,
             "run.json does not record the run's end: it is still running, was killed, or could not write its end "
             "(a full disk); the files may be half this run's and half an earlier one's")
    return f"every step finished ({', '.join(s['step'] for s in record.doc.get('steps', []))})"


def check_health(out: RunFolder | Path) -> str:
    """The server was up: its health route answered HTTP 200 (any body: vLLM, SGLang and TGI send none), or,
    for a server with no health route (llama-cpp-python, Ollama), its model list answered and named a model.
    A body that itself says something other than "ok" contradicts the 200 and fails."""
    health = RunFolder.of(out).artifact(typed.Health)
    route = health.route
    if route is None:  # a folder from before health.json recorded what was seen: the body of /health alone
        source = health.doc.get("source", "/health")
        _require(health.status == "ok", f"{source or 'the server'} said {health.doc!r:.200}")
        return f"status ok (from {source})"
    code = health.http_status
    _require(code == 200, f"{route} answered HTTP {code!r}, not 200")
    if route == "/health":
        said = health.status
        _require(said in (None, "ok"), f"/health answered HTTP 200 but says status {said!r}")
        body = f'status "{said}"' if said else ("an empty body" if health.doc.get("body_text") == "" else "a body")
        return f"/health answered HTTP 200 with {body}"
    ids = health.model_ids
    _require(bool(ids), f"{route} answered HTTP 200 but lists no model: {ids and list(ids)!r}")
    assert ids is not None
    tried = ", ".join(f"{t.get('route')} HTTP {t.get('http_status')}" for t in health.doc.get("tried") or []
                      if isinstance(t, dict))
    return f"no health route ({tried or 'none answered'}); {route} answered HTTP 200 listing {', '.join(map(str, ids))}"


def check_props(out: RunFolder | Path) -> str:
    props = RunFolder.of(out).artifact(typed.Props)
    n_ctx = props.n_ctx
    if n_ctx is None and "n_ctx" in props.unknown:
        raise NotCheckable(f"n_ctx is null: {props.unknown['n_ctx']}")
    _require(isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0, f"props has no n_ctx: {n_ctx!r}")
    slots = props.total_slots
    return f"n_ctx {n_ctx}, total_slots {'not said' if slots is None else slots}"


def check_sse_raw(out: RunFolder | Path) -> str:
    """Invariant: the stream is a finished answer in the protocol: JSON chunks, the first one the assistant's,
    content after it, ``data: [DONE]`` last. Expectation (a finding): the first chunk carries the role alone, as
    llama-server sends it; other servers put the first content in it (the server's choice, not bad evidence)."""
    events = _raw_events(out)
    _require(len(events) >= 3, f"only {len(events)} events in sse_raw.txt")
    first = events[0]
    _require(events[-1] == "[DONE]", "sse_raw.txt does not end with data: [DONE]")
    _require(all(isinstance(event, dict) for event in events[:-1]), "a data: [DONE] before the end of sse_raw.txt")
    # The delta, not the whole event, is quoted: a server that writes "id", "created" and "model" before "choices"
    # filled the 120 characters before the delta that decides the check.
    _require(_delta(first).get("role") == "assistant",
             f"first event does not open the assistant's message (no role \"assistant\" in its delta): "
             f"delta {_delta(first)!r:.120}")
    missed: list[str] = []
    expect(not _delta(first).get("content"), f"the first event carries content with the role: delta "
           f"{_delta(first)!r:.120}", missed)
    return unless_missed(f"{len(events)} events: role chunk first, [DONE] last", missed)


def check_chunks(out: RunFolder | Path) -> str:
    """Invariant: chunks.jsonl is derived from sse_raw.txt (equal text), its times read on one clock in order."""
    chunks = RunFolder.of(out).jsonl(names.CHUNKS)
    _require(bool(chunks), "chunks.jsonl is empty")
    raw_text = "".join(_delta(e).get("content") or "" for e in _raw_events(out) if isinstance(e, dict))
    text = "".join(c["text"] for c in chunks)
    _require(text == raw_text, f"chunk text {text[:60]!r} differs from the content in sse_raw {raw_text[:60]!r}")
    times = [_num(c["t_ms"], "t_ms") for c in chunks]
    _require(all(a <= b for a, b in zip(times, times[1:])), "chunk times decrease somewhere")
    _require(all(c["text"] for c in chunks), "a chunk with empty text was counted")
    return f"{len(chunks)} chunks equal sse_raw content, times {times[0]:.1f} .. {times[-1]:.1f} ms non-decreasing"


def check_ttft(out: RunFolder | Path) -> str:
    """Invariant and the brief's relation: first token < total within each answer (one clock); the medians are
    those of the runs (the one median rule, stats.median)."""
    doc = RunFolder.of(out).artifact(typed.Ttft)  # the shape (finite numbers, whole token counts): its parse
    runs = doc.runs
    _require(len(runs) == brief.TTFT_RUNS, f"{len(runs)} runs, expected {brief.TTFT_RUNS}")
    for i, run in enumerate(runs, 1):
        _require(0 < run.ttft_ms < run.total_ms, f"run {i}: ttft {run.ttft_ms} not below total {run.total_ms}")
        _require(run.tokens is not None and run.tokens > 0, f"run {i}: tokens {run.tokens!r}")
    for key, stated, values in (("ttft_p50", doc.ttft_p50, [r.ttft_ms for r in runs]),
                                ("total_p50", doc.total_p50, [r.total_ms for r in runs])):
        field = key.replace("_p50", "_ms")
        expected = stats.median(values)
        _require(stated == expected, f"{key} {stated} is not the median of the {field} ({expected})")
    return f"ttft < total in 5 runs; p50 {doc.ttft_p50:.1f} / {doc.total_p50:.1f} ms"


def _prefill_grows(out: RunFolder | Path, key: str, unit: str) -> str:
    """Invariant: ``key`` grows 0 -> 4 -> 12 documents. For the time it is the brief's relation (long prompt >
    short): 12 documents are many times the tokens of none, so their prefill is many times the work."""
    rows = RunFolder.of(out).artifact(typed.Prefill).rows
    expected = list(brief.PREFILL_DOC_COUNTS)
    _require([r.docs for r in rows] == expected, f"docs are {[r.docs for r in rows]}, expected {expected}")
    values = [_known(r.value(key), r.unknown, key, f"{r.docs} docs {key}") for r in rows]
    _require(values[0] < values[1] < values[2], f"{key} does not grow with documents: {values}")
    return f"{key} " + " -> ".join(f"{v:.0f}" for v in values) + f" {unit}"


def check_prefill(out: RunFolder | Path) -> str:
    return _prefill_grows(out, "ttft_ms", "ms")


def check_prefill_tokens(out: RunFolder | Path) -> str:
    return _prefill_grows(out, "prompt_n", "tokens")


def check_prefill_server_time(out: RunFolder | Path) -> str:
    # The brief's relation on the server's own clock: prompt_ms excludes the network and the queue, so it is
    # steadier than the client's ttft, which the brief requires to grow; an invariant like it.
    return _prefill_grows(out, "prompt_ms", "ms")


# How far a hit should be below the miss. The brief's relation is hit < miss (an invariant: a hit computes a
# fraction of the tokens); how large the gap is depends on the machine (HTTP and decode overhead against prefill
# speed) and on the model (tokenizer, chat template, the server's cache granularity), so the factors are
# expectations: a finding when they do not hold.
CACHE_TIME_FACTOR = 2.0  # hit first-token time below miss / 2
CACHE_PREFIX_TIME_FACTOR = 5.0  # changed-prefix (a miss) first-token time above 5 x the hit's
# A hit computes at most a tenth of the miss's prompt tokens; a changed prefix recomputes at least 90 % of them.
# The repeats' checks (voice_llm.capabilities.repeats.checks) hold every repeat to the same shares.
CACHE_HIT_TOKENS_SHARE = 0.1
CACHE_PREFIX_TOKENS_SHARE = 0.9


def _hit_and_miss(doc: typed.Cache) -> tuple[typed.CacheCase, typed.CacheCase]:
    """The miss and the hit, which every cache.json has (its parse requires them)."""
    assert doc.first is not None and doc.second is not None
    return doc.first, doc.second


_NO_COUNTS = " (the server reports no prompt token counts: nothing shows it was a cache hit)"


def check_cache_time(out: RunFolder | Path) -> str:
    """The client clock alone. Invariant (the brief's relation): a hit (identical or changed-suffix prompt) is
    faster than the miss, the changed prefix (a miss) slower than the hit. Expectation: by the factors above."""
    doc = RunFolder.of(out).artifact(typed.Cache)
    first, second = _hit_and_miss(doc)
    f_t, s_t = first.ttft_ms, second.ttft_ms
    missed: list[str] = []
    # The relation is the brief's for a server that keeps the slot's prefix (llama-server): its token counts show
    # the second request was a hit. A server that reports no counts (an OpenAI-compatible one with no `timings` or
    # usage) gives no evidence that it caches at all; then a second request no faster than the first is the
    # server's way (it has no prefix cache, or the prompt is too short to time), a finding, never a FAIL.
    counted = first.prompt_n is not None and second.prompt_n is not None

    def relation(holds: bool, detail: str) -> None:
        if counted:
            _require(holds, detail)
        else:
            expect(holds, detail + _NO_COUNTS, missed)

    relation(s_t < f_t, f"second (a cache hit) ttft {s_t:.0f} ms is not below first (a miss) {f_t:.0f} ms")
    expect(s_t < f_t / CACHE_TIME_FACTOR, f"second ttft {s_t:.0f} ms is not below first / {CACHE_TIME_FACTOR:g} "
           f"({f_t / CACHE_TIME_FACTOR:.0f} ms)", missed)
    parts = [f"first {f_t:.0f} ms, second {s_t:.0f} ms"]
    if doc.changed_prefix is not None:
        p_t = doc.changed_prefix.ttft_ms
        relation(p_t > s_t, f"changed_prefix (a miss) ttft {p_t:.0f} ms is not above the cache hit's {s_t:.0f} ms")
        expect(p_t > CACHE_PREFIX_TIME_FACTOR * s_t, f"changed_prefix ttft {p_t:.0f} ms is not above "
               f"{CACHE_PREFIX_TIME_FACTOR:g} x the hit's {s_t:.0f} ms", missed)
        parts.append(f"prefix {p_t:.0f} ms")
    if doc.changed_suffix is not None:
        x_t = doc.changed_suffix.ttft_ms
        relation(x_t < f_t, f"changed_suffix (a hit of the prefix) ttft {x_t:.0f} ms is not below first {f_t:.0f} ms")
        expect(x_t < f_t / CACHE_TIME_FACTOR, f"changed_suffix ttft {x_t:.0f} ms is not below first / "
               f"{CACHE_TIME_FACTOR:g} ({f_t / CACHE_TIME_FACTOR:.0f} ms)", missed)
        parts.append(f"suffix {x_t:.0f} ms")
    return unless_missed(", ".join(parts), missed)


def check_cache(out: RunFolder | Path) -> str:
    """The server's token counts. Invariant: the hit computed fewer tokens than the miss, the changed suffix fewer
    than the miss, the changed prefix more than the hit. Expectation: the hit almost nothing (a tenth), the
    changed prefix nearly everything (90 %): how much is reused depends on the server's cache and the template."""
    doc = RunFolder.of(out).artifact(typed.Cache)
    first, second = _hit_and_miss(doc)
    # A count the server did not report: the reason the step wrote for the whole file.
    f_n = _known(first.prompt_n, doc.unknown, "prompt_n", "cache prompt_n")
    s_n = _known(second.prompt_n, doc.unknown, "prompt_n", "cache prompt_n")
    missed: list[str] = []
    _require(s_n < f_n, f"second prompt_n {s_n:.0f} is not below first {f_n:.0f}: no cache hit")
    expect(s_n <= CACHE_HIT_TOKENS_SHARE * f_n, f"second prompt_n {s_n:.0f} is more than "
           f"{CACHE_HIT_TOKENS_SHARE:.0%} of first {f_n:.0f}", missed)
    parts = [f"first {f_n:.0f} tokens computed, second {s_n:.0f}"]
    if doc.changed_prefix is not None:
        p_n = _num(doc.changed_prefix.prompt_n, "prefix.prompt_n")
        _require(p_n > s_n, f"changed_prefix prompt_n {p_n:.0f} is not above the hit's {s_n:.0f}: a miss reused it all")
        expect(p_n >= CACHE_PREFIX_TOKENS_SHARE * f_n, f"changed_prefix prompt_n {p_n:.0f} is less than "
               f"{CACHE_PREFIX_TOKENS_SHARE:.0%} of first's {f_n:.0f}", missed)
        parts.append(f"prefix {p_n:.0f}")
    if doc.changed_suffix is not None:
        x_n = _num(doc.changed_suffix.prompt_n, "suffix.prompt_n")
        _require(x_n < f_n, f"changed_suffix prompt_n {x_n:.0f} is not below first {f_n:.0f}: the prefix was not reused")
        expect(x_n <= CACHE_HIT_TOKENS_SHARE * f_n, f"changed_suffix prompt_n {x_n:.0f} is more than "
               f"{CACHE_HIT_TOKENS_SHARE:.0%} of first {f_n:.0f}", missed)
        parts.append(f"suffix {x_n:.0f}")
    return unless_missed(", ".join(parts), missed)


def check_sentence(out: RunFolder | Path) -> str:
    """Invariant: ttft <= first sentence <= total, the times of one answer on one clock; the first sentence is
    the start of the text it was cut from."""
    doc = RunFolder.of(out).artifact(typed.Sentence)
    t, s, total = doc.ttft_ms, _num(doc.first_sentence_ms, "first_sentence_ms"), doc.total_ms
    _require(t <= s <= total, f"not ttft {t:.0f} <= first_sentence {s:.0f} <= total {total:.0f}")
    first = doc.first_sentence
    _require(bool(first) and isinstance(doc.text, str) and doc.text.strip().startswith(first or ""),
             "first_sentence is not the start of text")
    if doc.smart_first_sentence_ms is not None:
        smart = doc.smart_first_sentence_ms
        _require(t <= smart <= total, f"smart first sentence {smart:.0f} ms outside ttft..total")
    return f"ttft {t:.0f} <= first sentence {s:.0f} <= total {total:.0f} ms"


# The slack on top of two token times for the slot to go idle after the cut (decision 0004): the server notices a closed
# connection only at its next token and cancels after the decode step it is in (BENCHMARKS.md, "Cancellation").
# A time bound, so an expectation: a decode step slowed by other work on the machine, or a /slots poll that waits
# for one, makes an honest run exceed it (a finding); the slot going idle after the close is the invariant.
CANCEL_IDLE_SLACK_MS = 50.0


def _cancel_times(doc: typed.Cancel) -> tuple[list[float], float | None]:
    """The listed chunks' times and the answer's own ms per token (mean gap between its received tokens; None
    with fewer than two tokens)."""
    chunks = doc.chunks
    _require(chunks is not None, "cancel.json has no chunk list")
    assert chunks is not None
    _require(doc.received_tokens == len(chunks),
             f"received_tokens {doc.received_tokens!r} but {len(chunks)} chunks are listed")
    times = [chunk.t_ms for chunk in chunks]
    _require(all(a <= b for a, b in zip(times, times[1:])), "cancel chunk times decrease somewhere")
    return times, (times[-1] - times[0]) / (len(times) - 1) if len(times) >= 2 else None


def _cancel_raw(out: RunFolder | Path, received: int, raw_name: Any = None) -> None:
    """When the raw stream is kept, it shows the same tokens and no [DONE]: the answer did not finish.
    ``raw_name`` is the document's ``raw`` (with --repeat, the stream of the repeat it shows); it must name a
    raw/cancel*.sse file, so an artifact cannot point the check elsewhere."""
    where = raw_name if isinstance(raw_name, str) and raw_name else f"{names.RAW_DIR}/cancel.sse"
    _require(re.fullmatch(rf"{names.RAW_DIR}/cancel[\w-]*\.sse", where) is not None,
             f"cancel.json names {where!r} as its raw stream, not a raw/cancel*.sse file")
    name = PurePosixPath(where).name
    folder = RunFolder.of(out)
    if not folder.exists(f"{names.RAW_DIR}/{name}"):
        return
    raw = folder.bytes(f"{names.RAW_DIR}/{name}")  # a link, FIFO or device there: an ArtifactError, never a hang
    decoder = SSEDecoder()
    events = decoder.feed(raw)  # not end(): an event cut by the close was never dispatched to the reader either
    _require(all(event.data != "[DONE]" for event in events), f"{where} ends with [DONE]: the answer finished")
    payloads = [loads_json(e.data, where) for e in events if e.data != "[DONE]"]
    tokens = sum(1 for payload in payloads if _delta(payload).get("content"))
    _require(tokens == received, f"{where} holds {tokens} content chunks, cancel.json lists {received}")


def check_cancel_cut(out: RunFolder | Path) -> str:
    """The client side alone. Invariant (a cut that cut): tokens arrived, fewer than max_tokens, the close after
    the 0.5 s mark and after every listed token (one clock), no [DONE] in the raw stream. Expectation: the close
    came before the whole answer would have ended at the speed of its first tokens (an extrapolation: the token
    rate of a loaded machine changes within one answer)."""
    doc = RunFolder.of(out).artifact(typed.Cancel)
    received, max_tokens = doc.received_tokens, doc.max_tokens
    # an answer that ended before the cut (a server too fast for the brief's request) cut nothing: the close is
    # null with the step's reason, and there is no cut to check
    closed = _known(doc.closed_at_ms, doc.unknown, "closed_at_ms", "closed_at_ms")
    _require(0 < received < max_tokens, f"received {received} tokens of max {max_tokens}: not a cut")
    times, token_ms = _cancel_times(doc)
    cut = brief.CANCEL_CLOSE_AFTER_MS
    _require(closed >= cut, f"closed at {closed:.0f} ms, before the {cut:.0f} ms cut")
    _require(times[-1] <= closed, f"a token at {times[-1]:.0f} ms is listed after the close at {closed:.0f} ms")
    _cancel_raw(out, received, doc.raw)
    missed: list[str] = []
    if token_ms is None:
        speed = "one token before the cut: no token time"
    else:
        end = times[0] + (max_tokens - 1) * token_ms
        expect(closed < end, f"closed at {closed:.0f} ms, after the whole answer would have ended at the speed of "
               f"its first tokens ({end:.0f} ms)", missed)
        speed = f"{token_ms:.1f} ms per token"
    return unless_missed(f"{received}/{max_tokens} tokens, closed at {closed:.0f} ms ({speed})", missed)


def cancel_idle_limit(doc: typed.Cancel | Mapping[str, Any]) -> tuple[float, float] | None:
    """(the bound on the slot going idle after the close, the answer's ms per token): two token times +
    CANCEL_IDLE_SLACK_MS, as :func:`check_cancel` holds it; None with one token before the cut. The summary's words
    about the stop come from the same bound, so they cannot say "at once" beside a finding. CheckFailed when the
    chunks are not a cut's; ArtifactError when the document (cancel.json as saved) does not parse."""
    if not isinstance(doc, typed.Cancel):
        doc = typed.Cancel.parse(doc)
    _, token_ms = _cancel_times(doc)
    return None if token_ms is None else (2 * token_ms + CANCEL_IDLE_SLACK_MS, token_ms)


def check_cancel(out: RunFolder | Path) -> str:
    """The server side. Invariant: its slot (or its requests-in-flight gauge) went idle after the close, not
    before it, and its log (when ours) shows the 'cancel task' the brief names as the server's understanding.
    Expectation: idle within two token times + CANCEL_IDLE_SLACK_MS (a time bound; see above)."""
    doc = RunFolder.of(out).artifact(typed.Cancel)  # cancel_logged true, false or null: its parse
    idle = _known(doc.slot_idle_after_ms, doc.unknown, "slot_idle_after_ms", "slot_idle_after_ms")
    limit = cancel_idle_limit(doc)
    _require(idle >= 0, f"slot idle {idle:.1f} ms after the close: before the close, the answer was not cut")
    _require(doc.cancel_logged is not False, "the server log shows no 'cancel task'")
    logged = "cancel logged" if doc.cancel_logged else "server log not ours to read"
    sources = doc.doc.get("sources")
    source = (sources if isinstance(sources, Mapping) else {}).get("slot_idle_after_ms", "/slots")
    if limit is None:
        raise NotCheckable(f"idle {idle:.1f} ms after the close (from {source}), {logged}; one token before the "
                           "cut: no token time to bound the stop by")
    bound, token_ms = limit
    missed: list[str] = []
    expect(idle <= bound, f"slot idle {idle:.1f} ms after the close, above two token times ({token_ms:.1f} ms each, "
           f"from this answer) + {CANCEL_IDLE_SLACK_MS:.0f} ms = {bound:.1f} ms", missed)
    return unless_missed(f"idle {idle:.1f} ms after the close (from {source}; limit {bound:.1f} ms = 2 x "
                         f"{token_ms:.1f} ms + {CANCEL_IDLE_SLACK_MS:.0f}), {logged}", missed)


PARTIALS_CHECK = "leftover .partial files (a warning, not a failure)"


def leftover_partials(out: RunFolder | Path) -> list[CheckResult]:
    """A line only when there is something to say: a ``.partial`` file holds what arrived before a request failed
    or was interrupted. It is evidence, no result is read from it, so it is a warning and never fails a run."""
    out = RunFolder.of(out).path
    found = [*out.glob("*.partial"), *(out / names.RAW_DIR).glob("*.partial")]
    partials = sorted(path for path in found if path.is_file())
    if not partials:
        return []
    listed = ", ".join(f"{path.relative_to(out)} ({path.stat().st_size} bytes)" for path in partials)
    return [CheckResult(PARTIALS_CHECK, PASS, f"warning: {len(partials)} left by a failed or interrupted request: "
                                              f"{listed}; no result is read from them")]


def _kept_streams(out: Path) -> list[Path]:
    """raw/<request>.sse.partial: the bytes of a request a step made, kept when it was stopped before its end
    (voice_llm.core.run.context); no other tool leaves them, so they make OUT a run folder."""
    raw = out / names.RAW_DIR
    return [path for path in raw.glob("*.sse.partial") if path.is_file()] if raw.is_dir() and not raw.is_symlink() else []


def check_report(out: RunFolder | Path) -> str:
    """Invariant: report.json equals what its sources give."""
    saved = RunFolder.of(out).artifact(typed.Report).doc  # its numbers finite or null: its parse
    expected = build_report(out)
    wrong = [k for k in expected if saved.get(k) != expected[k]]
    _require(not wrong, f"report.json differs from its sources in {', '.join(wrong)}")
    return f"{len(expected)} values equal their sources"


# Each check's docstring says why its relation is an invariant (FAIL when broken) or an expectation (a finding).
# The core's own checks; every capability's come through the registry (capability_checks).
CHECKS: tuple[CheckEntry, ...] = (
    CheckEntry("one run: every file as the run wrote it", None, check_one_run),
    CheckEntry("the run finished every step", None, check_run_finished),
    CheckEntry("files present and well-formed", None, check_files),
    # Invariants on what the server said of itself (status ok, a context size): the evidence the lab rests on.
    CheckEntry("server answered (health)", "health", check_health),
    CheckEntry("props: context size", "health", check_props),
    CheckEntry("sse_raw: role chunk first, [DONE] last", "sse", check_sse_raw),
    CheckEntry("chunks.jsonl matches sse_raw, times non-decreasing", "sse", check_chunks),
    CheckEntry("ttft < total, medians right", "ttft", check_ttft),
    CheckEntry("prefill: first token grows 0 -> 4 -> 12 docs", "prefill", check_prefill),
    CheckEntry("prefill: prompt tokens grow 0 -> 4 -> 12 docs", "prefill", check_prefill_tokens),
    CheckEntry("prefill: server prefill time grows 0 -> 4 -> 12 docs", "prefill", check_prefill_server_time),
    CheckEntry("cache hit far below miss: first-token time", "cache", check_cache_time),
    CheckEntry("cache hit far below miss: prompt tokens", "cache", check_cache),
    CheckEntry("ttft <= first sentence <= total", "sentence", check_sentence),
    CheckEntry("cancel cut the answer", "cancel", check_cancel_cut),
    CheckEntry("cancel: the server stopped (slot went idle)", "cancel", check_cancel),
    CheckEntry("report equals its sources", "report", check_report),
)


def _applies(entry: registry.CheckEntry, folder: RunFolder, steps: Sequence[str] | None) -> bool:
    """Does a capability's check apply here: its step ran (an entry without a step: always), or, for a folder
    without run.json, its artifact is there (an entry without an artifact: always, as the core's)?"""
    if steps is not None:
        return entry.step is None or entry.step in steps
    return entry.artifact is None or folder.is_file(entry.artifact)


def capability_checks(out: RunFolder | Path, steps: Sequence[str] | None) -> tuple[CheckEntry, ...]:
    """Every registered capability's checks (voice_llm.core.registry.CheckEntry) that apply to this folder: those of
    the steps the run ran (an entry without a step: always), or, for a folder without run.json, those whose
    artifact is there (an entry without an artifact: always, as the core's)."""
    folder = RunFolder.of(out)
    found: list[CheckEntry] = []
    for capability in registry.capabilities():
        for entry in capability.checks:
            if _applies(entry, folder, steps) and not _same_check_in(entry, found):
                found.append(entry)  # run by name when it runs: one that does not resolve is its own FAIL
    return tuple(found)


def _same_check_in(entry: CheckEntry, found: Sequence[CheckEntry]) -> bool:
    """The same check of the same artifact, registered for another step that writes it (dial's `dial` and
    `converse` both write dial.json): in a folder without run.json both apply by the artifact, and it runs once."""
    return any(e.name == entry.name and e.function == entry.function and e.artifact == entry.artifact for e in found)


def _left_out() -> tuple[registry.Capability, ...]:
    """The capabilities of the registry this voice-llm runs without (VOICE_LLM_WITHOUT, registry.without), each
    with the ones that require it."""
    on = set(registry.names())
    every = (importlib.import_module(package).CAPABILITY for package in registry.CAPABILITIES)
    return tuple(capability for capability in every if capability.name not in on)


def _why_left_out(capability: registry.Capability, left_out: Sequence[registry.Capability]) -> str:
    names_out = {c.name for c in left_out}
    needed = [name for name in capability.requires if name in names_out]
    by = f"left out with {', '.join(needed)}, which it requires" if needed else f"left out ({registry.WITHOUT_ENV})"
    return f"not checkable: capability {capability.name} {by}"


def left_out_checks(out: RunFolder | Path, steps: Sequence[str] | None) -> list[CheckResult]:
    """A step of this folder whose capability is left out is never checked in silence: an N/C line for each check
    it would have had (those that apply, as :func:`capability_checks` selects them), and one for a step that ran
    whose capability has no check of its own, so a left-out capability cannot make a folder pass unchecked."""
    folder = RunFolder.of(out)
    left_out = _left_out()
    found: list[CheckResult] = []
    for capability in left_out:
        why = _why_left_out(capability, left_out)
        applied: list[CheckEntry] = []
        for entry in capability.checks:
            if _applies(entry, folder, steps) and not _same_check_in(entry, applied):
                applied.append(entry)
        found += [CheckResult(entry.name, NOT_CHECKABLE, f"{why}; its relation is not checked") for entry in applied]
        checked = {entry.step for entry in applied}
        if steps is not None:
            ran = [step.name for step in capability.steps if step.name in steps and step.name not in checked]
        else:
            covered = {entry.artifact for entry in applied}  # a check of its artifact, registered for a sibling step
            ran = [step.name for step in capability.steps if step.name not in checked
                   and not covered & set(step.artifacts) and any(folder.exists(name) for name in step.artifacts)]
        found += [CheckResult(f"{step}: its files", NOT_CHECKABLE, f"{why}; step {step} ran in this folder and is "
                              "not checked") for step in ran]
    return found


def known_artifacts() -> tuple[str, ...]:
    """The files a voice-llm run folder may hold: the core's and every registered capability's (one left out too:
    its files still make a run folder, whose checks say they were left out)."""
    every = (*registry.capabilities(), *_left_out())
    return (names.RUN, *names.REQUIRED, *(name for c in every for name in c.artifacts))


def _result(check: CheckEntry, out: RunFolder) -> CheckResult:
    name = check.name
    try:
        return CheckResult(name, PASS, check.run(out))
    except CheckFailed as exc:
        return CheckResult(name, FAIL, str(exc))
    except Finding as exc:
        return CheckResult(name, FINDING, str(exc))
    except NotCheckable as exc:
        return CheckResult(name, NOT_CHECKABLE, str(exc))
    except RecursionError:
        return CheckResult(name, FAIL, "cannot check: an artifact is nested too deeply to be real JSON")
    except (ArtifactError, OSError, ValueError, KeyError, TypeError, IndexError, AttributeError,
            ImportError) as exc:
        return CheckResult(name, FAIL, f"cannot check: {_said(exc)}")


def _said(exc: BaseException) -> str:
    """What stopped a check, in words (never an exception's class name): an ArtifactError's message names the file
    and why; the others are a field missing or of the wrong shape in an artifact, or the check's code not loading."""
    if isinstance(exc, ArtifactError):
        return str(exc)
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}"
    if isinstance(exc, KeyError):
        return f"an artifact has no field {exc.args[0]!r}" if exc.args else "an artifact lacks a field"
    if isinstance(exc, ImportError):
        return f"the check's code did not load ({exc})"
    return f"an artifact's value has the wrong shape ({exc})"


NOT_RUN_CHECK = "planned steps not run in this folder"


def _not_run(plan: _Plan | None) -> list[CheckResult]:
    """A line only when the run planned steps that never ran here (a lab stopped by a failure or a kill; a step
    alone plans only itself): their relations are not checked, and this says so."""
    if plan is None or not plan.not_run:
        return []
    cut = f" ({plan.interrupted} was interrupted before its end)" if plan.interrupted else ""
    return [CheckResult(NOT_RUN_CHECK, NOT_CHECKABLE, f"{', '.join(plan.not_run)}: planned, never run in this "
                                                      f"folder{cut}; their relations are not checked")]


def iter_checks(out: RunFolder | Path) -> Iterator[CheckResult]:
    """The checks of the steps this run ran (all of the brief's for a folder without run.json), the core's then
    each capability's; a single FAIL when run.json has a run id but no valid plan, since nothing says then which
    relations the run must hold."""
    folder = RunFolder.of(out)
    try:
        plan = _plan(folder)
    except _BadPlan as exc:
        yield CheckResult(PLAN_CHECK, FAIL, f"{exc}: no relation was checked")
        return
    steps = None if plan is None else plan.checked
    core = tuple(check for check in CHECKS if check.step is None or steps is None or check.step in steps)
    for check in (*core, *capability_checks(folder, steps)):
        yield _result(check, folder)
    yield from _failed_with_partial(folder, plan)
    yield from left_out_checks(folder, steps)
    yield from _not_run(plan)


class NothingToCheckError(ArtifactError):
    """OUT holds nothing a step finished: no folder, an empty one, or only the streams a stopped step kept.
    `check` and `report` refuse it in the same one line (an error, exit 1), writing nothing: there is no run to
    pass or fail, and exit 0 would certify an empty folder."""


def require_something_to_check(out: RunFolder | Path) -> RunFolder:
    """The run folder ``out``, or one line saying why there is nothing in it to check or report: no folder, a
    folder of something else, or a folder where no step finished (empty, or holding only raw/*.sse.partial, the
    streams a stopped step kept: named, as evidence)."""
    folder = RunFolder.of(out)
    path = folder.path
    if not path.is_dir():
        blocking = names.file_in_the_way(path)
        raise NothingToCheckError(f"no artifact folder at {path}: " + (blocking or "nothing to check; run "
                                                                         f"`voice-llm lab --out {path}` (or a step) first"))
    if any(folder.exists(name) for name in known_artifacts()):
        return folder
    kept = _kept_streams(path)
    raw = path / names.RAW_DIR
    raw_dir = raw.is_dir() and not raw.is_symlink()
    others = [entry for entry in path.iterdir() if entry.name != LOCK_NAME and not (entry == raw and raw_dir)]
    if others or (raw_dir and any(entry not in kept for entry in raw.iterdir())):
        # A folder of something else is no run with failures.
        raise ArtifactError(f"{path} holds no voice-llm artifact (no run.json, no step's file): not a run folder; "
                            "run `voice-llm lab --out` there first")
    streams = ""
    if kept:  # a Ctrl-C in `voice-llm sentence` into an empty OUT: the bytes its requests received, kept
        listed = ", ".join(f"{p.relative_to(path)} ({p.stat().st_size} bytes)" for p in sorted(kept))
        streams = (f"; {len(kept)} stream{'' if len(kept) == 1 else 's'} a stopped request kept: {listed} "
                   "(evidence; no result is read from them)")
    raise NothingToCheckError(f"nothing to check in {path}: no step finished there (no run.json, no step's file)"
                              f"{streams}")


def run_checks(out: RunFolder | Path) -> list[CheckResult]:
    """Every check of the run folder ``out``, from its saved files alone, each file read once (a RunFolder).
    A folder where nothing finished (require_something_to_check) and one of a newer artifact schema than this
    voice-llm's are refused in one line (an ArtifactError)."""
    folder = require_something_to_check(out)
    folder.require_known_schema(known_artifacts())
    return [*iter_checks(folder), *leftover_partials(folder)]


def counts(results: Sequence[CheckResult]) -> str:
    """The summary line: "N passed, N findings, N not checkable, N failed"."""
    by = {status: sum(r.status == status for r in results) for status in (PASS, FINDING, NOT_CHECKABLE, FAIL)}
    return (f"{by[PASS]} passed, {by[FINDING]} finding{'' if by[FINDING] == 1 else 's'}, "
            f"{by[NOT_CHECKABLE]} not checkable, {by[FAIL]} failed")
