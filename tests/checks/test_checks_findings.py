"""check FAILs only on bad evidence (issues 19 and 20), on folders made from saved real runs (no server):

* an invariant broken on a tampered copy FAILs (times of one clock, derived files, token counts, hit < miss);
* an expectation that depends on the machine or model, missed by an honest run (consistent evidence), is a
  finding: FIND with its numbers, counted apart, exit status 0;
* a run.json without a valid plan is refused (one FAIL, nothing else checked);
* a step run alone is checked on its own steps, like a load-only folder.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from checkfolders import SAMPLE_AUDIO, clean_run, read, reseal, whole_heard_first, write

from voice_llm.core.checks import core as check
from voice_llm.core.run import meta as runmeta
from voice_llm.core.util.artifacts import AUDIO
from voice_llm.core.checks.base import FAIL, FINDING, NOT_CHECKABLE, PASS, CheckFailed, CheckResult, Finding
from voice_llm.core.lab.steps import STEPS
from voice_llm.core import registry
from voice_llm.capabilities.conversation import CAPABILITY as CALL_CAPABILITY
from voice_llm.capabilities.conversation import checks as call_checks
from voice_llm.capabilities.load import CAPABILITY as LOAD_CAPABILITY
from voice_llm.capabilities.load import stats
from voice_llm.capabilities.speak import checks as audio_checks


def by_name(out: Path) -> dict[str, CheckResult]:
    return {r.name: r for r in check.run_checks(out)}


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    return clean_run(tmp_path / "out")


def test_every_check_passes_on_the_clean_run(lab: Path) -> None:
    results = check.run_checks(lab)
    assert {r.status for r in results} == {PASS}, [r for r in results if r.status != PASS]
    assert check.counts(results) == f"{len(results)} passed, 0 findings, 0 not checkable, 0 failed"


# --- the cache: hit < miss is the brief's relation (FAIL); how far below is the machine's and model's (FIND) --


def edit_cache(out: Path, case: str, **values: float) -> None:
    """Set ``values`` in cache.json's ``case`` and in each repeat's, so the medians stay right, and reseal."""
    doc = read(out, "cache.json")
    doc[case].update(values)
    doc[case].update({key + end: value for key, value in values.items() for end in ("_min", "_max")
                      if key + end in doc[case]})
    for repeat in doc.get("repeats", []):
        repeat[case].update(values)
    write(out, "cache.json", doc)
    reseal(out, "cache.json")


CACHE_TIME = "cache hit far below miss: first-token time"
CACHE_TOKENS = "cache hit far below miss: prompt tokens"
CACHE_REPEATS = "cache repeats: medians, hit and miss in each"


def test_a_changed_suffix_hit_not_twice_as_fast_is_a_finding(lab: Path) -> None:
    first = read(lab, "cache.json")["first"]["ttft_ms"]
    edit_cache(lab, "changed_suffix", ttft_ms=first * 0.6)  # a hit, faster than the miss, not by half
    results = by_name(lab)
    found = results[CACHE_TIME]
    assert found.status == FINDING and found.ok and found.label == "FIND"
    assert "changed_suffix ttft" in found.detail and "is not below first / 2" in found.detail
    assert f"first {first:.0f} ms" in found.detail  # the numbers it was judged on
    assert [r.name for r in results.values() if r.status != PASS] == [CACHE_TIME]


def test_a_changed_suffix_slower_than_the_miss_fails(lab: Path) -> None:
    first = read(lab, "cache.json")["first"]["ttft_ms"]
    edit_cache(lab, "changed_suffix", ttft_ms=first + 1)
    result = by_name(lab)[CACHE_TIME]
    assert result.status == FAIL and "is not below first" in result.detail


def test_a_second_no_faster_on_a_server_that_counts_no_tokens_is_a_finding(lab: Path) -> None:
    """A server with no prompt token counts (no `timings`, no usage) gives no evidence of a cache hit: the second
    request no faster than the first is the server's way (no prefix cache), a finding. With the counts showing the
    hit, the same times break the brief's relation: a FAIL (the invariant test below)."""
    doc = read(lab, "cache.json")
    first = doc["first"]["ttft_ms"]
    for case in ("first", "second", "changed_prefix", "changed_suffix"):
        if case in doc:
            edit_cache(lab, case, prompt_n=None)  # type: ignore[arg-type]
    edit_cache(lab, "second", ttft_ms=first + 2.0)
    doc = read(lab, "cache.json")
    doc.setdefault("unknown", {})["prompt_n"] = "the server reported no prompt token counts"
    write(lab, "cache.json", doc)
    reseal(lab, "cache.json")
    result = by_name(lab)[CACHE_TIME]
    assert result.status == FINDING, result
    assert "nothing shows it was a cache hit" in result.detail
    assert by_name(lab)[CACHE_TOKENS].status == NOT_CHECKABLE


def test_a_changed_prefix_reusing_a_fifth_is_a_finding_in_the_file_and_its_repeats(lab: Path) -> None:
    first = read(lab, "cache.json")["first"]
    edit_cache(lab, "changed_prefix", prompt_n=int(first["prompt_n"] * 0.8), cache_n=first["prompt_n"] // 5)
    results = by_name(lab)
    for name in (CACHE_TOKENS, CACHE_REPEATS):
        assert results[name].status == FINDING, results[name]
        assert "changed_prefix prompt_n" in results[name].detail and "less than 90%" in results[name].detail


@pytest.mark.parametrize("case, value, says", [
    ("second", "first", "no cache hit"),  # the hit computed as many tokens as the miss
    ("changed_suffix", "first", "the prefix was not reused"),
    ("changed_prefix", "second", "a miss reused it all"),
])
def test_a_hit_that_computed_no_fewer_tokens_fails(lab: Path, case: str, value: str, says: str) -> None:
    doc = read(lab, "cache.json")
    write(lab, "cache.json", {**doc, case: {**doc[case], "prompt_n": doc[value]["prompt_n"]}})
    result = by_name(lab)[CACHE_TOKENS]
    assert result.status == FAIL and says in result.detail


def test_a_repeat_without_a_hit_fails(lab: Path) -> None:
    doc = read(lab, "cache.json")
    doc["repeats"][1]["second"]["prompt_n"] = doc["repeats"][1]["first"]["prompt_n"]
    write(lab, "cache.json", doc)
    result = by_name(lab)[CACHE_REPEATS]
    assert result.status == FAIL and "repeat 2: second prompt_n" in result.detail


# --- the brief's other relations and the invariants stay failures --------------------------------------------


def edit(name: str, change: Callable[[Any], None]) -> Callable[[Path], None]:
    def apply(out: Path) -> None:
        doc = read(out, name)
        change(doc)
        write(out, name, doc)
    return apply


def swap(key: str) -> Callable[[Any], None]:
    def change(rows: Any) -> None:
        rows[0][key], rows[2][key] = rows[2][key], rows[0][key]
    return change


INVARIANTS: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "ttft median not the runs'": (edit("ttft.json", lambda d: d.update(ttft_p50=d["ttft_p50"] + 1)),
                                  "ttft < total, medians right", "is not the median"),
    "prefill server time shrinks": (edit("prefill.json", swap("prompt_ms")),
                                    "prefill: server prefill time grows 0 -> 4 -> 12 docs", "does not grow"),
    "second slower than the miss": (edit("cache.json", lambda d: d["second"].update(ttft_ms=d["first"]["ttft_ms"])),
                                    CACHE_TIME, "is not below first (a miss)"),
    "slot idle before the close": (edit("cancel.json", lambda d: d.update(slot_idle_after_ms=-0.5)),
                                   "cancel: the server stopped (slot went idle)", "before the close"),
}


@pytest.mark.parametrize("tamper", list(INVARIANTS), ids=list(INVARIANTS))
def test_an_invariant_broken_on_a_tampered_copy_fails(lab: Path, tamper: str) -> None:
    apply, name, says = INVARIANTS[tamper]
    apply(lab)
    result = by_name(lab)[name]
    assert result.status == FAIL and says in result.detail, result


# --- first audio: the text order is the invariant, which strategy is heard first a finding -------------------


@pytest.fixture
def audio(tmp_path: Path) -> Path:
    """The speak step's audio.json of a real run, alone in a folder (no run.json: its checks run because it is
    there; the raw streams and WAVs were not kept, so only the checks that read audio.json alone are asserted)."""
    out = tmp_path / "audio-out"
    out.mkdir()
    shutil.copy(SAMPLE_AUDIO, out / AUDIO)
    return out


AUDIO_ALONE = ("audio: ttft <= first segment text <= first audio", "audio: timeline and medians follow from the segments",
               "audio: first segment text no later than the whole answer", "audio: TTFA whole >= TTFA sentences")


def audio_results(out: Path) -> dict[str, CheckResult]:
    return {name: result for name, result in by_name(out).items() if name in AUDIO_ALONE}


def test_the_recorded_audio_passes_with_sentences_heard_first(audio: Path) -> None:
    results = audio_results(audio)
    assert {r.status for r in results.values()} == {PASS}, results
    assert "TTFA whole 4999 ms, sentences 2259 ms" in results["audio: TTFA whole >= TTFA sentences"].detail


def test_whole_heard_before_sentences_on_consistent_evidence_is_a_finding(audio: Path) -> None:
    doc = read(audio, AUDIO)
    whole_heard_first(doc)  # sentences' synthesis slowed by the LLM on the same cores; every derived number redone
    write(audio, AUDIO, doc)
    results = audio_results(audio)
    finding = results.pop("audio: TTFA whole >= TTFA sentences")
    assert {r.status for r in results.values()} == {PASS}, results  # the evidence is consistent
    assert finding.status == FINDING and finding.ok
    assert "whole heard first: TTFA whole 4999 ms < sentences 5099 ms" in finding.detail
    assert "first text whole 3728 ms, sentences 432 ms" in finding.detail
    with pytest.raises(Finding):
        audio_checks.check_whole_after_sentences(audio)


@pytest.mark.parametrize("strategy, change, says", [
    ("sentences", lambda run: run.update(first_text_ms=run["total_ms"] + 1), "after the whole answer"),
    ("whole", lambda run: run.update(first_text_ms=run["total_ms"] - 1), "not at its end"),
])
def test_a_first_segment_after_the_whole_answer_fails(audio: Path, strategy: str, change: Callable[[dict], None],
                                                      says: str) -> None:
    doc = read(audio, AUDIO)
    change(doc["strategies"][strategy]["runs"][0])
    write(audio, AUDIO, doc)
    result = audio_results(audio)["audio: first segment text no later than the whole answer"]
    assert result.status == FAIL and f"{strategy} run 1" in result.detail and says in result.detail


# --- the command: exit 0 with findings, 3 only for a FAIL; the counts line -----------------------------------


def test_the_command_exits_zero_with_only_findings_and_counts_them_apart(lab: Path, env: dict[str, str]) -> None:
    from clihelpers import cli

    first = read(lab, "cache.json")["first"]["ttft_ms"]
    edit_cache(lab, "changed_suffix", ttft_ms=first * 0.6)
    done = cli("check", str(lab), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"FIND  {CACHE_TIME}: changed_suffix ttft" in done.stdout
    assert done.stdout.rstrip().endswith("20 passed, 1 finding, 0 not checkable, 0 failed")
    edit_cache(lab, "changed_suffix", ttft_ms=first + 1)
    failed = cli("check", str(lab), env=env)
    assert failed.returncode == 3 and failed.stdout.rstrip().endswith("20 passed, 0 findings, 0 not checkable, 1 failed")


def test_a_finding_is_ok_and_labelled_find() -> None:
    result = CheckResult("x", FINDING, "numbers")
    assert result.ok and result.label == "FIND"
    assert [CheckResult("x", s, "").label for s in (PASS, FAIL, NOT_CHECKABLE)] == ["PASS", "FAIL", "N/C"]


# --- a run.json without a valid plan is refused ---------------------------------------------------------------


@pytest.mark.parametrize("plan", ["absent", None, "health", [], [3]])
def test_a_run_json_without_a_valid_plan_is_refused(lab: Path, plan: Any, env: dict[str, str]) -> None:
    from clihelpers import cli

    edit("ttft.json", lambda d: d.update(ttft_p50=d["ttft_p50"] + 1))(lab)  # failures it must not pass over
    edit("sentence.json", lambda d: d.update(first_sentence_ms=d["total_ms"] + 1))(lab)
    run = read(lab, "run.json")
    if plan == "absent":
        del run["steps_planned"]
    else:
        run["steps_planned"] = plan
    write(lab, "run.json", run)
    (result,) = check.run_checks(lab)
    assert result.name == check.PLAN_CHECK and result.status == FAIL
    assert "steps_planned is" in result.detail and "no relation was checked" in result.detail
    done = cli("check", str(lab), env=env)
    assert done.returncode == 3 and "0 passed, 0 findings, 0 not checkable, 1 failed" in done.stdout


def test_steps_outside_the_plan_are_refused(lab: Path) -> None:
    run = read(lab, "run.json")
    run["steps"].append({"step": "speak"})
    write(lab, "run.json", run)
    (result,) = check.run_checks(lab)
    assert result.status == FAIL and "speak ran but" in result.detail


def test_a_folder_without_run_json_is_checked_as_before(tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(Path(__file__).parents[1] / "fixtures" / "sample_out", out)
    results = by_name(out)
    assert results["one run: every file as the run wrote it"].status == NOT_CHECKABLE
    assert results["ttft < total, medians right"].status == PASS  # all the brief's relations, no plan needed
    assert check.PLAN_CHECK not in results


# --- a step run alone: its own relations, its own files --------------------------------------------------------


def speak_alone(out: Path) -> Path:
    """What `voice-llm speak` alone leaves in an empty folder: run.json planning speak alone (the pipeline's plan
    for a step alone), speak the only step run, audio.json in the manifest."""
    out.mkdir()
    shutil.copy(SAMPLE_AUDIO, out / AUDIO)
    plan = {"speak": STEPS["speak"].artifacts}
    record, _ = runmeta.RunRecord.join_or_start(out, {"identity": {}}, plan)
    record.add_step({"step": "speak", "wall_ms": 1.0, "server_compute_ms": None})
    record.record_file(out / AUDIO)
    record.finish(["speak"], None, None)
    record.save()
    return out


def test_a_step_run_alone_is_checked_on_its_own_step(tmp_path: Path) -> None:
    out = speak_alone(tmp_path / "out")
    results = by_name(out)
    assert not [r for r in results.values() if "health.json" in r.detail], results
    assert results["files present and well-formed"].status == PASS
    assert results["files present and well-formed"].detail == "1 files present and parse"
    assert results["one run: every file as the run wrote it"].status == PASS
    assert results["the run finished every step"].detail == "every step finished (speak)"
    assert check.NOT_RUN_CHECK not in results  # a step alone planned no other step (issue 41 item 25)
    assert "server answered (health)" not in results and "ttft < total, medians right" not in results
    for name in AUDIO_ALONE:
        assert results[name].status == PASS, results[name]


def test_a_step_run_alone_still_flags_an_earlier_runs_file(tmp_path: Path) -> None:
    out = speak_alone(tmp_path / "out")
    shutil.copy(Path(__file__).parents[1] / "fixtures" / "sample_run" / "health.json", out / "health.json")
    result = by_name(out)["one run: every file as the run wrote it"]
    assert result.status == FAIL and "health.json" in result.detail


def test_a_lab_that_failed_checks_the_steps_it_reached(lab: Path) -> None:
    run = read(lab, "run.json")
    run["steps"] = [s for s in run["steps"] if s["step"] in ("health", "sse")]
    run["failed_step"], run["failure"] = "ttft", "ServerError: boom"
    run["artifacts_by_step"] = {name: list(STEPS[name].artifacts) for name in run["steps_planned"]}
    write(lab, "run.json", run)
    results = by_name(lab)
    assert results["the run finished every step"].status == FAIL
    assert results["ttft < total, medians right"].status == PASS  # the failed step's files are checked
    assert "cache hit far below miss: prompt tokens" not in results  # never reached
    assert results[check.NOT_RUN_CHECK].detail.startswith("prefill, cache, sentence, cancel, report: planned")


# --- load.json: vacuous or impossible data fails or is not checkable ------------------------------------------


@pytest.fixture
def load_out(tmp_path: Path) -> Path:
    from builders import fake_load_run as _fake_run

    out = tmp_path / "load-out"
    out.mkdir()
    _fake_run(out)
    record, _ = runmeta.RunRecord.join_or_start(out, {"identity": {}}, {"load": ("load.json", "load_samples.csv")})
    for name in ("load.json", "load_samples.csv"):
        record.record_file(out / name)
    record.add_step({"step": "load", "wall_ms": 1.0, "server_compute_ms": None})
    record.finish(["load"], None, None)
    record.save()
    return out


LOAD_NAMES = [c.name for c in LOAD_CAPABILITY.checks if c.step == "load"]


def load_results(out: Path) -> dict[str, CheckResult]:
    return {name: r for name, r in by_name(out).items() if name in LOAD_NAMES}


def test_a_load_only_folder_passes(load_out: Path) -> None:
    results = by_name(load_out)
    assert {r.status for r in results.values()} == {PASS}, results
    assert set(LOAD_NAMES) <= set(results)


@pytest.mark.parametrize("change, says", [
    (lambda d: d.update(sweeps=[]), "has no sweeps: nothing was measured"),
    (lambda d: d["sweeps"][0].update(steps=[]), "a sweep with no steps"),
])
def test_a_load_json_that_measured_nothing_fails(load_out: Path, change: Callable[[dict], None], says: str) -> None:
    edit("load.json", change)(load_out)
    results = load_results(load_out)
    assert results and all(r.status == FAIL and says in r.detail for r in results.values()), results


def test_a_verdict_on_no_measured_turn_is_not_checkable(load_out: Path) -> None:
    def empty(doc: dict) -> None:  # --step-s too short: no turn started in the first step's window, the sweep stopped
        sweep = doc["sweeps"][0]
        sweep["steps"] = sweep["steps"][:1]
        sweep["steps"][0].update(turns=0, judged=0, good=0, goodput=None, good_turns_per_s=0.0)
        sweep["verdict"] = stats.verdict(sweep["steps"], sweep["slots"], early=True)  # what the steps now say (load.json 4)

    edit("load.json", empty)(load_out)
    result = load_results(load_out)["load: verdict and stop rule follow from the steps"]
    assert result.status == NOT_CHECKABLE and "no turn was measured" in result.detail


@pytest.mark.parametrize("value", ["-5.0", "inf", "nan"])
def test_an_impossible_sample_fails(load_out: Path, value: str) -> None:
    csv = (load_out / "load_samples.csv").read_text().splitlines()
    header = csv[0].split(",")
    row = csv[2].split(",")
    row[header.index("ttft_ms")] = value
    (load_out / "load_samples.csv").write_text("\n".join([*csv[:2], ",".join(row), *csv[3:]]) + "\n")
    results = load_results(load_out)
    turn_order = results["load: each turn's times in order on one clock"]
    assert turn_order.status == FAIL and "ttft_ms" in turn_order.detail, turn_order
    assert ("negative" if value == "-5.0" else "not a finite number") in turn_order.detail


def test_a_call_json_without_turns_fails(tmp_path: Path) -> None:
    (tmp_path / "call.json").write_text(json.dumps({"turns": [], "cache_on": [], "cache_off": []}))
    assert CALL_CAPABILITY.checks
    for entry in CALL_CAPABILITY.checks:
        with pytest.raises(CheckFailed, match="no turn"):
            entry.run(tmp_path)


def test_load_and_call_checks_raise_checks_own_exceptions() -> None:
    from voice_llm.capabilities.load import checks as load_checks

    for module in (call_checks, load_checks):
        assert module.CheckFailed is check.CheckFailed and module.NotCheckable is check.NotCheckable
    # Every check each capability registers resolves to a function of its own checks module (the one list).
    assert {registry.resolve(e.function).__module__ for e in CALL_CAPABILITY.checks} == {call_checks.__name__}
    assert {registry.resolve(e.function).__module__ for e in LOAD_CAPABILITY.checks} == {load_checks.__name__}


# --- the stream's shape: the protocol is the invariant, a role-only first chunk llama-server's habit ---------


def first_content_in_the_role_chunk(out: Path) -> None:
    """The stream as a server that sends the role with the first content leaves it (same text, one event less)."""
    events = (out / "sse_raw.txt").read_bytes().split(b"\n\n")
    role, first = json.loads(events[0][len(b"data: "):]), json.loads(events[1][len(b"data: "):])
    role["choices"][0]["delta"]["content"] = first["choices"][0]["delta"]["content"]
    (out / "sse_raw.txt").write_bytes(b"\n\n".join([b"data: " + json.dumps(role).encode(), *events[2:]]))
    reseal(out, "sse_raw.txt")


SSE_CHECK = "sse_raw: role chunk first, [DONE] last"


def test_content_in_the_first_chunk_is_a_finding(lab: Path) -> None:
    first_content_in_the_role_chunk(lab)
    results = by_name(lab)
    assert results[SSE_CHECK].status == FINDING and "carries content with the role" in results[SSE_CHECK].detail
    assert results["chunks.jsonl matches sse_raw, times non-decreasing"].status == PASS  # the evidence agrees


def test_a_stream_without_the_assistant_or_done_fails(lab: Path) -> None:
    raw = (lab / "sse_raw.txt").read_bytes()
    (lab / "sse_raw.txt").write_bytes(raw.replace(b'"role":"assistant",', b"", 1))
    assert by_name(lab)[SSE_CHECK].status == FAIL
    (lab / "sse_raw.txt").write_bytes(raw[: raw.rindex(b"data: [DONE]")])
    assert by_name(lab)[SSE_CHECK].status == FAIL


# --- call.json on a server without token counts ---------------------------------------------------------------


def call_json(out: Path, prompt_n: list[int | None], cache_n: list[int | None]) -> None:
    def row(turn: int, ttft: float, prompt: int | None, cached: int | None) -> dict:
        return {"turn": turn, "ttft_ms": ttft, "first_sentence_ms": ttft + 100, "total_ms": ttft + 500,
                "prompt_n": prompt, "cache_n": cached}

    on = [row(i + 1, 100.0, p if p is None or c is None else p - c, c) for i, (p, c) in enumerate(zip(prompt_n, cache_n))]
    off = [row(i + 1, 300.0, p, None if c is None else 0) for i, (p, c) in enumerate(zip(prompt_n, cache_n))]
    write(out, "call.json", {"turns": ["a", "b", "c"], "cache_on": on, "cache_off": off})


def test_call_checks_without_the_servers_counts(tmp_path: Path) -> None:
    call_json(tmp_path, [100, 200, 300], [0, 90, 190])
    assert "reused" not in call_checks.check_call_cache_keeps_turns_fast(tmp_path)
    call_checks.check_call_same_prompts(tmp_path)
    call_json(tmp_path, [None, None, None], [None, None, None])  # a server without timings
    assert "cache_n not reported" in call_checks.check_call_cache_keeps_turns_fast(tmp_path)
    with pytest.raises(check.NotCheckable, match="prompt_n is null"):
        call_checks.check_call_same_prompts(tmp_path)
    call_json(tmp_path, [100, 200, 300], [0, 0, 190])  # the server says it reused nothing on turn 2
    with pytest.raises(CheckFailed, match="turn 2 reused nothing"):
        call_checks.check_call_cache_keeps_turns_fast(tmp_path)


# --- sse_raw: the FAIL quotes the first event's delta, whatever order the server writes its keys in -------------

def test_a_first_event_without_the_role_fails_quoting_its_delta(lab: Path) -> None:
    """A server that writes id, created and model before choices (most but llama-server) once filled the quoted
    120 characters before the delta: the line did not show the missing role that failed it."""
    first = {"id": "chatcmpl-" + "x" * 40, "object": "chat.completion.chunk", "created": 1796027858,
             "model": "a-model-name-of-some-length", "choices": [{"index": 0, "delta": {"content": "Hello"},
                                                                   "finish_reason": None}]}
    raw = (lab / "sse_raw.txt").read_text(encoding="utf-8")
    rest = raw.split("\n\n", 1)[1]
    (lab / "sse_raw.txt").write_text(f"data: {json.dumps(first)}\n\n{rest}", encoding="utf-8")
    result = by_name(lab)["sse_raw: role chunk first, [DONE] last"]
    assert result.status == FAIL, result
    assert "no role \"assistant\" in its delta" in result.detail and "{'content': 'Hello'}" in result.detail, result
