"""Check a lab's artifacts against each other, from the saved files alone (no server is queried).

Like a grader, it trusts no number on its own: it re-derives what it can from the raw evidence (chunks.jsonl
from sse_raw.txt, medians from the runs, report.json from its sources) and checks the relations the brief
names within one run (first token < total, long prompt > short, cache hit < no cache).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from voice_llm import artifacts as names
from voice_llm import brief, runmeta, spread_checks
from voice_llm.artifacts import loads_json, read_json, read_jsonl
from voice_llm.errors import ArtifactError
from voice_llm.keynumbers import build_report
from voice_llm.load import checks as load_checks  # call.json, and load.json against its raw samples
from voice_llm.sse import SSEDecoder

PASS = "pass"
FAIL = "fail"
NOT_CHECKABLE = "not checkable"


@dataclass(frozen=True)
class CheckResult:
    """One relation: ``name`` says what was checked, ``detail`` the numbers it was checked on (or why it could
    not be). ``status`` is PASS, FAIL, or NOT_CHECKABLE when the files cannot show it — never a PASS."""

    name: str
    status: str
    detail: str

    @property
    def ok(self) -> bool:
        """Not failed (a relation that could not be checked did not fail either; it is counted apart)."""
        return self.status != FAIL

    @property
    def label(self) -> str:
        return {PASS: "PASS", FAIL: "FAIL"}.get(self.status, "N/C")


class _Failed(Exception):
    pass


CheckFailed = _Failed  # the public name, for the checks that feature modules keep (voice_llm.tts.checks)


class NotCheckable(Exception):
    """Raised inside a check when the saved files cannot show the relation (the server did not expose it, ...);
    the message says why."""



def _known(doc: Any, key: str, what: str) -> Any:
    """``doc[key]``, or NotCheckable with the reason the step wrote when it had to leave it null."""
    value = doc.get(key) if isinstance(doc, dict) else None
    if value is None:
        reasons = doc.get("unknown") if isinstance(doc, dict) else None
        reason = (reasons or {}).get(key) if isinstance(reasons, dict) else None
        raise NotCheckable(f"{what} is null: {reason or 'no reason recorded'}")
    return value


def _require(condition: bool, detail: str) -> None:
    if not condition:
        raise _Failed(detail)


def _num(value: Any, what: str) -> float:
    _require(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
             f"{what} is not a finite number: {value!r}")
    return float(value)


# The public names of the two rules above, for the checks that feature modules keep (voice_llm.tts.checks).
require, finite_number = _require, _num


def _raw_events(out: Path) -> list[dict[str, Any] | str]:
    """The data of every event in sse_raw.txt, decoded by the same rules as the live stream."""
    decoder = SSEDecoder()
    try:
        raw = (out / names.SSE_RAW).read_bytes()
    except FileNotFoundError as exc:
        raise ArtifactError(f"{names.SSE_RAW} is missing in {out}") from exc
    events = decoder.feed(raw) + decoder.end()
    parsed: list[dict[str, Any] | str] = []
    for event in events:
        parsed.append(event.data if event.data == "[DONE]" else loads_json(event.data, f"an event in {names.SSE_RAW}"))
    return parsed


def _delta(event: dict[str, Any]) -> dict[str, Any]:
    choices = event.get("choices") or [{}]
    return choices[0].get("delta") or {}


def _planned_steps(out: Path) -> list[str] | None:
    """The steps run.json says this run was made of; None for a folder from before run ids (all brief steps)."""
    record = runmeta.RunRecord.load(out)
    return list(record.doc.get("steps_planned") or []) if record else None


def _required(out: Path) -> list[str]:
    """The files the run's steps leave, as run.json lists them (the brief's ten without a run.json)."""
    record = runmeta.RunRecord.load(out)
    if record is None:
        return list(names.REQUIRED)
    return list(record.doc.get("expected_artifacts") or [])


def check_files(out: Path) -> str:
    required = _required(out)
    missing = [name for name in required if not (out / name).is_file()]
    _require(not missing, f"missing: {', '.join(missing)}")
    for name in required:
        if name.endswith(".json"):
            read_json(out / name)
        elif name.endswith(".jsonl"):
            read_jsonl(out / name)
    return f"{len(required)} files present and parse"


def check_one_run(out: Path) -> str:
    found = runmeta.membership(out)
    if found.run_id is None:
        raise NotCheckable("no run.json with a run id (artifacts from an older voice-llm): cannot tell runs apart")
    _require(not found.mixed, "files from other runs: " + ", ".join(
        f"{name} (run {run})" for name, run in found.other_runs.items()))
    _require(not found.changed, "not as this run wrote them (changed, or left by another run): " + ", ".join(found.changed))
    _require(not found.missing, "written by the run but now missing: " + ", ".join(found.missing))
    record = runmeta.RunRecord.load(out)
    files = len((record.doc.get("artifacts") or {}) if record else {})
    return f"run {found.run_id}: {files} files, each as the run wrote it"


def check_run_finished(out: Path) -> str:
    record = runmeta.RunRecord.load(out)
    if record is None:
        raise NotCheckable("no run.json with a run id")
    failed = record.doc.get("failed_step")
    _require(failed is None, f"the run failed at step {failed}: {record.doc.get('failure') or 'no reason recorded'}")
    _require(record.doc.get("ended_at") is not None,
             "run.json does not record the run's end: it is still running, was killed, or could not write its end "
             "(a full disk); the files may be half this run's and half an earlier one's")
    return f"every step finished ({', '.join(s['step'] for s in record.doc.get('steps', []))})"


def check_health(out: Path) -> str:
    """The server was up: its health route answered HTTP 200 (any body: vLLM, SGLang and TGI send none), or,
    for a server with no health route (llama-cpp-python, Ollama), its model list answered and named a model.
    A body that itself says something other than "ok" contradicts the 200 and fails."""
    health = read_json(out / names.HEALTH)
    _require(isinstance(health, dict), f"health.json is not an object: {health!r:.120}")
    route = health.get("route")
    if route is None:  # a folder from before health.json recorded what was seen: the body of /health alone
        source = health.get("source", "/health")
        _require(health.get("status") == "ok", f"{source or 'the server'} said {health!r:.200}")
        return f"status ok (from {source})"
    code = health.get("http_status")
    _require(code == 200, f"{route} answered HTTP {code!r}, not 200")
    if route == "/health":
        said = health.get("status")
        _require(said in (None, "ok"), f"/health answered HTTP 200 but says status {said!r}")
        body = f'status "{said}"' if said else ("an empty body" if health.get("body_text") == "" else "a body")
        return f"/health answered HTTP 200 with {body}"
    ids = health.get("model_ids")
    _require(isinstance(ids, list) and bool(ids), f"{route} answered HTTP 200 but lists no model: {ids!r}")
    tried = ", ".join(f"{t.get('route')} HTTP {t.get('http_status')}" for t in health.get("tried") or []
                      if isinstance(t, dict))
    return f"no health route ({tried or 'none answered'}); {route} answered HTTP 200 listing {', '.join(map(str, ids))}"


def check_props(out: Path) -> str:
    props = read_json(out / names.PROPS)
    settings = props.get("default_generation_settings") or {}
    unknown = props.get("unknown") or {}
    if settings.get("n_ctx") is None and "n_ctx" in unknown:
        raise NotCheckable(f"n_ctx is null: {unknown['n_ctx']}")
    n_ctx = settings.get("n_ctx")
    _require(isinstance(n_ctx, int) and n_ctx > 0, f"props has no n_ctx: {n_ctx!r}")
    return f"n_ctx {n_ctx}, total_slots {props.get('total_slots')}"


def check_sse_raw(out: Path) -> str:
    events = _raw_events(out)
    _require(len(events) >= 3, f"only {len(events)} events in sse_raw.txt")
    first = events[0]
    _require(isinstance(first, dict) and _delta(first).get("role") == "assistant",
             f"first event does not carry the assistant role: {first!r:.120}")
    _require(events[-1] == "[DONE]", "sse_raw.txt does not end with data: [DONE]")
    # Ollama sends the role beside the first content (no role-only chunk): a server's shape, not an error; that
    # content is a token, and check_chunks verifies that exactly the content was counted.
    shape = "role chunk first" if not _delta(first).get("content") else "role with the first content (no role-only chunk)"
    return f"{len(events)} events: {shape}, [DONE] last"


def check_chunks(out: Path) -> str:
    chunks = read_jsonl(out / names.CHUNKS)
    _require(bool(chunks), "chunks.jsonl is empty")
    raw_text = "".join(_delta(e).get("content") or "" for e in _raw_events(out) if isinstance(e, dict))
    text = "".join(c["text"] for c in chunks)
    _require(text == raw_text, f"chunk text {text[:60]!r} differs from the content in sse_raw {raw_text[:60]!r}")
    times = [_num(c["t_ms"], "t_ms") for c in chunks]
    _require(all(a <= b for a, b in zip(times, times[1:])), "chunk times decrease somewhere")
    _require(all(c["text"] for c in chunks), "a chunk with empty text was counted")
    return f"{len(chunks)} chunks equal sse_raw content, times {times[0]:.1f} .. {times[-1]:.1f} ms non-decreasing"


def check_ttft(out: Path) -> str:
    doc = read_json(out / names.TTFT)
    runs = doc["runs"]
    _require(len(runs) == brief.TTFT_RUNS, f"{len(runs)} runs, expected {brief.TTFT_RUNS}")
    for i, run in enumerate(runs, 1):
        _require(0 < _num(run["ttft_ms"], "ttft_ms") < _num(run["total_ms"], "total_ms"),
                 f"run {i}: ttft {run['ttft_ms']} not below total {run['total_ms']}")
        _require(isinstance(run["tokens"], int) and run["tokens"] > 0, f"run {i}: tokens {run['tokens']!r}")
    for key, field in (("ttft_p50", "ttft_ms"), ("total_p50", "total_ms")):
        expected = sorted(r[field] for r in runs)[len(runs) // 2]
        _require(doc[key] == expected, f"{key} {doc[key]} is not the 3rd of the sorted {field} ({expected})")
    return f"ttft < total in 5 runs; p50 {doc['ttft_p50']:.1f} / {doc['total_p50']:.1f} ms"


def _prefill_grows(out: Path, key: str, unit: str) -> str:
    rows = read_json(out / names.PREFILL)
    expected = list(brief.PREFILL_DOC_COUNTS)
    _require([r["docs"] for r in rows] == expected, f"docs are {[r['docs'] for r in rows]}, expected {expected}")
    values = [_num(_known(r, key, f"{r['docs']} docs {key}"), key) for r in rows]
    _require(values[0] < values[1] < values[2], f"{key} does not grow with documents: {values}")
    return f"{key} " + " -> ".join(f"{v:.0f}" for v in values) + f" {unit}"


def check_prefill(out: Path) -> str:
    return _prefill_grows(out, "ttft_ms", "ms")


def check_prefill_tokens(out: Path) -> str:
    return _prefill_grows(out, "prompt_n", "tokens")


def check_prefill_server_time(out: Path) -> str:
    return _prefill_grows(out, "prompt_ms", "ms")


def check_cache_time(out: Path) -> str:
    """The client clock alone: a hit (identical or changed-suffix prompt) is far faster than the miss."""
    doc = read_json(out / names.CACHE)
    f_t, s_t = _num(doc["first"]["ttft_ms"], "first.ttft_ms"), _num(doc["second"]["ttft_ms"], "second.ttft_ms")
    _require(s_t < f_t / 2, f"second ttft {s_t:.0f} ms is not far below first {f_t:.0f} ms")
    parts = [f"first {f_t:.0f} ms, second {s_t:.0f} ms"]
    if "changed_prefix" in doc:
        p_t = _num(doc["changed_prefix"]["ttft_ms"], "prefix.ttft_ms")
        _require(p_t > 5 * s_t, f"changed_prefix ttft {p_t:.0f} ms is not far above the cache hit's {s_t:.0f} ms")
        parts.append(f"prefix {p_t:.0f} ms")
    if "changed_suffix" in doc:
        x_t = _num(doc["changed_suffix"]["ttft_ms"], "suffix.ttft_ms")
        _require(x_t < f_t / 2, f"changed_suffix ttft {x_t:.0f} ms is not far below first {f_t:.0f} ms")
        parts.append(f"suffix {x_t:.0f} ms")
    return ", ".join(parts)


def check_cache(out: Path) -> str:
    """The server's token counts: the hit computed almost nothing, the changed prefix nearly everything."""
    doc = read_json(out / names.CACHE)
    first, second = doc["first"], doc["second"]
    if first.get("prompt_n") is None or second.get("prompt_n") is None:
        _known(doc, "prompt_n", "cache prompt_n")  # the reason the step wrote for the whole file
    f_n, s_n = _num(first["prompt_n"], "first.prompt_n"), _num(second["prompt_n"], "second.prompt_n")
    _require(s_n <= f_n / 10, f"second prompt_n {s_n:.0f} is not far below first {f_n:.0f}")
    parts = [f"first {f_n:.0f} tokens computed, second {s_n:.0f}"]
    if "changed_prefix" in doc:
        p_n = _num(doc["changed_prefix"]["prompt_n"], "prefix.prompt_n")
        _require(p_n >= 0.9 * f_n, f"changed_prefix prompt_n {p_n:.0f} is not about first's {f_n:.0f}")
        parts.append(f"prefix {p_n:.0f}")
    if "changed_suffix" in doc:
        x_n = _num(doc["changed_suffix"]["prompt_n"], "suffix.prompt_n")
        _require(x_n <= f_n / 10, f"changed_suffix prompt_n {x_n:.0f} is not close to second's (first {f_n:.0f})")
        parts.append(f"suffix {x_n:.0f}")
    return ", ".join(parts)


def check_sentence(out: Path) -> str:
    doc = read_json(out / names.SENTENCE)
    t, s, total = (_num(doc[k], k) for k in ("ttft_ms", "first_sentence_ms", "total_ms"))
    _require(t <= s <= total, f"not ttft {t:.0f} <= first_sentence {s:.0f} <= total {total:.0f}")
    first = doc["first_sentence"]
    _require(bool(first) and doc["text"].strip().startswith(first), "first_sentence is not the start of text")
    if "smart_first_sentence_ms" in doc:
        smart = _num(doc["smart_first_sentence_ms"], "smart_first_sentence_ms")
        _require(t <= smart <= total, f"smart first sentence {smart:.0f} ms outside ttft..total")
    return f"ttft {t:.0f} <= first sentence {s:.0f} <= total {total:.0f} ms"


# The slack on top of two token times for the slot to go idle after the cut: the server notices a closed
# connection only at its next token and cancels after the decode step it is in (BENCHMARKS.md, "Cancellation").
CANCEL_IDLE_SLACK_MS = 50.0


def _cancel_times(doc: dict[str, Any]) -> tuple[list[float], float]:
    """The listed chunks' times and the answer's own ms per token (mean gap between its received tokens)."""
    chunks = doc["chunks"]
    _require(isinstance(chunks, list), "cancel.json has no chunk list")
    _require(doc["received_tokens"] == len(chunks),
             f"received_tokens {doc['received_tokens']!r} but {len(chunks)} chunks are listed")
    times = [_num(chunk["t_ms"], "chunk t_ms") for chunk in chunks]
    _require(len(times) >= 2, f"{len(times)} token(s) before the cut: too few to know the answer's token time")
    _require(all(a <= b for a, b in zip(times, times[1:])), "cancel chunk times decrease somewhere")
    return times, (times[-1] - times[0]) / (len(times) - 1)


def _cancel_raw(out: Path, received: int, raw_name: Any = None) -> None:
    """When the raw stream is kept, it shows the same tokens and no [DONE]: the answer did not finish.
    ``raw_name`` is the document's ``raw`` (with --repeat, the stream of the repeat it shows); it must name a
    raw/cancel*.sse file, so an artifact cannot point the check elsewhere."""
    where = raw_name if isinstance(raw_name, str) and raw_name else f"{names.RAW_DIR}/cancel.sse"
    _require(re.fullmatch(rf"{names.RAW_DIR}/cancel[\w-]*\.sse", where) is not None,
             f"cancel.json names {where!r} as its raw stream, not a raw/cancel*.sse file")
    name = PurePosixPath(where).name
    try:
        raw = (out / names.RAW_DIR / name).read_bytes()
    except FileNotFoundError:
        return
    decoder = SSEDecoder()
    events = decoder.feed(raw)  # not end(): an event cut by the close was never dispatched to the reader either
    _require(all(event.data != "[DONE]" for event in events), f"{where} ends with [DONE]: the answer finished")
    payloads = [loads_json(e.data, where) for e in events if e.data != "[DONE]"]
    tokens = sum(1 for payload in payloads if _delta(payload).get("content"))
    _require(tokens == received, f"{where} holds {tokens} content chunks, cancel.json lists {received}")


def check_cancel_cut(out: Path) -> str:
    """The client side alone: the answer was cut, after the 0.5 s mark and before it would have ended."""
    doc = read_json(out / names.CANCEL)
    received, max_tokens = doc["received_tokens"], doc["max_tokens"]
    _require(isinstance(received, int) and 0 < received < max_tokens,
             f"received {received} tokens of max {max_tokens}: not a cut")
    times, token_ms = _cancel_times(doc)
    closed = _num(doc["closed_at_ms"], "closed_at_ms")
    cut = brief.CANCEL_CLOSE_AFTER_MS
    _require(closed >= cut, f"closed at {closed:.0f} ms, before the {cut:.0f} ms cut")
    # The close came before the end: after the last token listed, before the whole answer would have arrived at
    # this speed, and (when the raw stream is kept) with no [DONE] in it.
    _require(times[-1] <= closed, f"a token at {times[-1]:.0f} ms is listed after the close at {closed:.0f} ms")
    end = times[0] + (max_tokens - 1) * token_ms
    _require(closed < end, f"closed at {closed:.0f} ms, after the whole answer would have ended ({end:.0f} ms)")
    _cancel_raw(out, received, doc.get("raw"))
    return f"{received}/{max_tokens} tokens, closed at {closed:.0f} ms ({token_ms:.1f} ms per token)"


def check_cancel(out: Path) -> str:
    """The server side: its slot (or its requests-in-flight gauge) went idle soon after the close."""
    doc = read_json(out / names.CANCEL)
    idle = _num(_known(doc, "slot_idle_after_ms", "slot_idle_after_ms"), "slot_idle_after_ms")
    _, token_ms = _cancel_times(doc)
    bound = 2 * token_ms + CANCEL_IDLE_SLACK_MS
    _require(0 <= idle <= bound,
             f"slot idle {idle:.1f} ms after the close; the limit is two token times ({token_ms:.1f} ms each, from "
             f"this answer) + {CANCEL_IDLE_SLACK_MS:.0f} ms = {bound:.1f} ms")
    logged = doc.get("cancel_logged")
    _require(logged is not False, "the server log shows no 'cancel task'")
    _require(logged in (True, None), f"cancel_logged is {logged!r}, not true, false or null")
    logged = "cancel logged" if logged else "server log not ours to read"
    source = (doc.get("sources") or {}).get("slot_idle_after_ms", "/slots")
    return (f"idle {idle:.1f} ms after the close (from {source}; limit {bound:.1f} ms = 2 x {token_ms:.1f} ms + "
            f"{CANCEL_IDLE_SLACK_MS:.0f}), {logged}")


PARTIALS_CHECK = "leftover .partial files (a warning, not a failure)"


def leftover_partials(out: Path) -> list[CheckResult]:
    """A line only when there is something to say: a ``.partial`` file holds what arrived before a request failed
    or was interrupted. It is evidence, no result is read from it, so it is a warning and never fails a run."""
    found = [*out.glob("*.partial"), *(out / names.RAW_DIR).glob("*.partial")]
    partials = sorted(path for path in found if path.is_file())
    if not partials:
        return []
    listed = ", ".join(f"{path.relative_to(out)} ({path.stat().st_size} bytes)" for path in partials)
    return [CheckResult(PARTIALS_CHECK, PASS, f"warning: {len(partials)} left by a failed or interrupted request: "
                                              f"{listed}; no result is read from them")]


def check_report(out: Path) -> str:
    saved = read_json(out / names.REPORT)
    expected = build_report(out)
    wrong = [k for k in expected if saved.get(k) != expected[k]]
    _require(not wrong, f"report.json differs from its sources in {', '.join(wrong)}")
    return f"{len(expected)} values equal their sources"


@dataclass(frozen=True)
class Check:
    name: str
    step: str | None  # the lab step whose artifacts it reads; None: about the whole run
    run: Callable[[Path], str]


SPREAD_CHECKS = (
    Check("prefill repeats: medians, prompt_n grows in each", "prefill", spread_checks.check_prefill_repeats),
    Check("cache repeats: medians, hit and miss in each", "cache", spread_checks.check_cache_repeats),
    Check("sentence repeats: medians, order in each", "sentence", spread_checks.check_sentence_repeats),
    Check("cancel repeats: median idle, each a cut", "cancel", spread_checks.check_cancel_repeats),
)


CHECKS: tuple[Check, ...] = (
    Check("one run: every file as the run wrote it", None, check_one_run),
    Check("the run finished every step", None, check_run_finished),
    Check("files present and well-formed", None, check_files),
    Check("server answered (health)", "health", check_health),
    Check("props: context size", "health", check_props),
    Check("sse_raw: role chunk first, [DONE] last", "sse", check_sse_raw),
    Check("chunks.jsonl matches sse_raw, times non-decreasing", "sse", check_chunks),
    Check("ttft < total, medians right", "ttft", check_ttft),
    Check("prefill: first token grows 0 -> 4 -> 12 docs", "prefill", check_prefill),
    Check("prefill: prompt tokens grow 0 -> 4 -> 12 docs", "prefill", check_prefill_tokens),
    Check("prefill: server prefill time grows 0 -> 4 -> 12 docs", "prefill", check_prefill_server_time),
    Check("cache hit far below miss: first-token time", "cache", check_cache_time),
    Check("cache hit far below miss: prompt tokens", "cache", check_cache),
    Check("ttft <= first sentence <= total", "sentence", check_sentence),
    Check("cancel cut the answer", "cancel", check_cancel_cut),
    Check("cancel: the server stopped (slot went idle)", "cancel", check_cancel),
    Check("report equals its sources", "report", check_report),
    *SPREAD_CHECKS,
    *(Check(name, step, run) for name, step, run in load_checks.CHECKS),
)


def _result(name: str, check: Callable[[Path], str], out: Path) -> CheckResult:
    try:
        return CheckResult(name, PASS, check(out))
    except (_Failed, load_checks.CheckFailed) as exc:
        return CheckResult(name, FAIL, str(exc))
    except NotCheckable as exc:
        return CheckResult(name, NOT_CHECKABLE, str(exc))
    except RecursionError:
        return CheckResult(name, FAIL, "cannot check: an artifact is nested too deeply to be real JSON")
    except (ArtifactError, OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        return CheckResult(name, FAIL, f"cannot check: {exc.__class__.__name__}: {exc}")


def iter_checks(out: Path) -> Iterator[CheckResult]:
    """The checks of the steps this run was made of (all of the brief's for a folder without run.json)."""
    planned = _planned_steps(out)
    for check in CHECKS:
        if check.step is None or planned is None or check.step in planned:
            yield _result(check.name, check.run, out)
    for check in _feature_checks(out, planned):
        yield _result(check.name, check.run, out)


def _feature_checks(out: Path, planned: list[str] | None) -> tuple[Check, ...]:
    """Checks kept beside their feature, imported when checks run (they use this module's exceptions): those of
    the steps in the run, or, for a folder without run.json, those whose artifact is there."""
    from voice_llm.tts import checks as tts

    return tuple(check for step, artifact, checks in ((tts.STEP, tts.ARTIFACT, tts.CHECKS),) for check in checks
                 if (step in planned if planned is not None else (out / artifact).is_file()))


def run_checks(out: Path) -> list[CheckResult]:
    if not out.is_dir():
        raise ArtifactError(f"no artifact folder at {out}")
    return [*iter_checks(out), *leftover_partials(out)]
