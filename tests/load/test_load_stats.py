"""The load sweep's arithmetic and its checks, on hand-made samples (no server, no Locust)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from voice_llm.core.errors import ArtifactError
from voice_llm.capabilities.conversation import report as call_report
from voice_llm.capabilities.load import CAPABILITY as LOAD_CAPABILITY
from voice_llm.capabilities.load import checks, stats
from voice_llm.capabilities.load.samples import read_samples, write_samples

from builders import SLO, fake_load_run as _fake_run, load_sample as sample

LOAD_CHECKS = tuple((entry.name, entry.run) for entry in LOAD_CAPABILITY.checks)  # (name, check) of each



def test_percentile_is_nearest_rank() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert stats.percentile(values, 50) == 3.0
    assert stats.percentile(values, 90) == 5.0
    assert stats.percentile(values, 0) == 1.0
    assert stats.percentile([], 50) is None
    assert stats.gaps_ms([10.0, 15.0, 30.0]) == [5.0, 15.0]


def test_goodput_counts_errors_but_not_a_cut_before_the_first_sentence() -> None:
    rows = [sample(0, 400.0), sample(0, 1200.0), sample(0, None, error="StreamTruncatedError: x"),
            sample(0, None, cancelled=True), sample(0, 300.0, cancelled=True)]
    step = stats.summarize_step(rows, SLO, window_s=10.0)
    assert (step["turns"], step["errors"], step["cancelled"], step["judged"], step["good"]) == (5, 1, 2, 4, 2)
    assert step["goodput"] == 0.5
    assert step["good_turns_per_s"] == 0.2
    assert step["first_sentence_ms"]["p50"] == 400.0


def test_stop_rule_and_verdict() -> None:
    steps = []
    for index, firsts in enumerate(([300.0] * 20, [300.0] * 19 + [2000.0], [300.0] * 10 + [2000.0] * 10)):
        step = stats.summarize_step([sample(index, f) for f in firsts], SLO, 10.0)
        steps.append({"callers": 2 ** index, **step})
    assert [stats.stop_reason(s, SLO) is None for s in steps] == [True, True, False]
    assert steps[1]["goodput"] == 0.95
    verdict = stats.verdict(steps, slots=1)
    assert verdict["max_callers"] == 2
    assert verdict["limited_by"] == "slots"  # 4 callers on 1 slot
    errors = stats.summarize_step([sample(0, 300.0)] * 99 + [sample(0, None, error="boom")] * 2, SLO, 10.0)
    assert "errors" in stats.stop_reason({"callers": 1, **errors}, SLO)


def test_samples_csv_round_trip_is_exact(tmp_path: Path) -> None:
    rows = [{**sample(0, 1 / 3), "slots": 4}, {**sample(1, None, error="a, \"quoted\"\nerror"), "slots": None}]
    back = read_samples(write_samples(tmp_path / "s.csv", rows))
    assert back == [{k: r.get(k) for k in stats.SAMPLE_FIELDS} for r in rows]
    assert back[0]["prompt_ms"] == 31.25


def test_samples_csv_from_before_the_prompt_ms_column_still_reads(tmp_path: Path) -> None:
    rows = [{**sample(0, 250.0), "slots": 1}]
    written = write_samples(tmp_path / "s.csv", rows).read_text().splitlines()
    column = written[0].split(",").index("prompt_ms")
    older = tmp_path / "older.csv"
    older.write_text("".join(",".join(c for i, c in enumerate(line.split(",")) if i != column) + "\n" for line in written))
    (back,) = read_samples(older)
    assert back["prompt_ms"] is None and back["first_sentence_ms"] == 250.0
    (tmp_path / "broken.csv").write_text(written[0].replace("ttft_ms,", "") + "\n")
    with pytest.raises(ArtifactError, match="ttft_ms"):
        read_samples(tmp_path / "broken.csv")


def test_load_checks_pass_on_a_consistent_run(tmp_path: Path) -> None:
    out = _fake_run(tmp_path)
    doc = json.loads((out / "load.json").read_text())
    assert [s["turns"] for s in doc["sweeps"][0]["steps"]] == [2, 2]  # warm-up and drain turns not counted
    # two judged turns per step are too few for a verdict (stats.MIN_JUDGED_TURNS)
    assert doc["sweeps"][0]["verdict"]["max_callers"] is None
    assert doc["sweeps"][0]["verdict"]["judged_per_step"] == [2, 2]
    for name, check in LOAD_CHECKS:
        assert check(out), name


@pytest.mark.parametrize("tamper, failing", [
    (lambda d: d["sweeps"][0]["steps"][1]["first_sentence_ms"].update(p90=100.0), "check_load_matches_samples"),
    (lambda d: d["sweeps"][0]["verdict"].update(max_callers=2), "check_load_verdict"),
    (lambda d: d["sweeps"][0]["steps"][0]["window"].update(start=150.0, end=160.0), "check_load_windows"),
])
def test_load_checks_fail_on_a_tampered_run(tmp_path: Path, tamper, failing: str) -> None:
    out = _fake_run(tmp_path)
    doc = json.loads((out / "load.json").read_text())
    tamper(doc)
    (out / "load.json").write_text(json.dumps(doc))
    with pytest.raises(checks.CheckFailed):
        getattr(checks, failing)(out)


def test_a_tampered_sample_breaks_the_recomputation(tmp_path: Path) -> None:
    out = _fake_run(tmp_path)
    text = (out / "load_samples.csv").read_text().replace("500.0", "1500.0")
    (out / "load_samples.csv").write_text(text)
    with pytest.raises(checks.CheckFailed):
        checks.check_load_matches_samples(out)


def test_the_load_command_never_imports_locust() -> None:
    import subprocess
    import sys

    code = ("import sys, voice_llm.cli.main, voice_llm.capabilities.load.cli, voice_llm.capabilities.load.run, voice_llm.capabilities.load.document, voice_llm.capabilities.load.runner, voice_llm.capabilities.load.checks, "
            "voice_llm.capabilities.load.report; print('locust' in sys.modules, 'gevent' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("flags, needle", [
    (["--callers", "4,x"], "comma-separated"),
    (["--callers", "8", "--max-callers", "4"], "no step of --callers"),
    (["--dialogue", "nope"], "no dialogue named 'nope'"),
    # the settings' own rules (load.settings), refused as usage errors when the settings are made
    (["--workers", "0"], "load: error: --workers must be at least 1, not 0"),
    (["--step-s", "0"], "load: error: --step-s must be more than 0, not 0"),
    (["--barge-in", "2"], "load: error: --barge-in must be 0-1, not 2"),
    (["--slo-first-sentence-ms", "-5"], "load: error: --slo-first-sentence-ms must be more than 0, not -5"),
    (["--dial-protocol", "sip"], "load: error: --dial-protocol must be one of twilio, pcm, not 'sip'"),
])
def test_bad_load_flags_are_named_before_anything_starts(tmp_path: Path, flags: list[str], needle: str) -> None:
    from clihelpers import assert_clean_failure, cli, cli_env

    # --url points at nothing: a flag error must be reported before the server is even asked
    result = cli("load", "--url", "http://127.0.0.1:9", "--out", str(tmp_path), *flags, env=cli_env(tmp_path / "state"))
    err = assert_clean_failure(result, one_line=needle != "comma-separated" and "error:" not in needle)
    assert needle in err
    assert not (tmp_path / "load.json").exists()


def test_report_sections_show_the_verdict_and_the_turns(tmp_path: Path) -> None:
    from voice_llm.capabilities.load import report

    doc = json.loads((_fake_run(tmp_path) / "load.json").read_text())
    fig, caption, extra = report.load_chart(doc)
    assert "4 slots: no verdict (fewer than 20 judged turns in every step)" in caption
    assert extra.count("<tr>") == 1 + 2  # header + one row per step
    turns = [{"turn": n, "user": f"line {n}", "ttft_ms": 100.0 * n, "first_sentence_ms": 150.0 * n,
              "prompt_n": 40 * n, "cache_n": 0, "total_ms": 300.0 * n} for n in (1, 2)]
    call = {"docs": ["a.md"] * 12, "cache_on": turns, "cache_off": turns}
    fig, caption, extra = call_report.call_chart(call)
    assert "grew from 40 to 80 tokens" in caption and "line 2" in extra


def test_think_time_speaks_at_the_measured_audio_rate(tmp_path: Path) -> None:
    from voice_llm.capabilities.load.plan import SPEECH_WORDS_PER_S
    from voice_llm.capabilities.load.speech import answer_speech_rate

    fixture = Path(__file__).parents[1] / "fixtures" / "sample_audio"
    rate, source = answer_speech_rate(fixture)
    assert source.startswith("audio.json") and rate != SPEECH_WORDS_PER_S and 1.0 < rate < 6.0
    assert answer_speech_rate(tmp_path) == (SPEECH_WORDS_PER_S, f"default {SPEECH_WORDS_PER_S:g} words/s (no readable audio.json)")
