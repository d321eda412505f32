"""Repeats, medians and spread, the noise verdict and the rank test, from files and values alone (no server)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from voice_llm.core.analysis import compare, metrics, noise
from voice_llm.core.run import meta as runmeta
from voice_llm.core.util import stats
from voice_llm.core.checks.core import FAIL, NOT_CHECKABLE, PASS, run_checks
from voice_llm.core.lab import cancel, sentence

SAMPLE_OUT = Path(__file__).parents[1] / "fixtures" / "sample_out"


def test_median_is_a_measured_value_and_its_repeat_is_named() -> None:
    assert stats.median([3.0, 1.0, 2.0]) == 2.0
    assert stats.median([4.0, 1.0, 3.0, 2.0]) == 3.0  # the upper middle: a value that was measured
    assert stats.median_index([9.0, 5.0, 7.0]) == 2
    assert stats.relative_spread([90.0, 100.0, 120.0]) == pytest.approx(0.3)
    assert stats.relative_spread([5.0]) is None
    doc = stats.summarize([{"t": 3.0, "n": 7}, {"t": 1.0, "n": 7}, {"t": 2.0, "n": 7}], ("t", "n"), ("t",))
    assert doc == {"t": 2.0, "t_min": 1.0, "t_max": 3.0, "n": 7}


def test_mann_whitney_matches_the_exact_distribution() -> None:
    # Five against five with no overlap: 2 of the 252 splits are as extreme (two-sided), p = 2/252.
    assert stats.mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)
    assert stats.mann_whitney_p([1, 3, 5, 7, 9], [2, 4, 6, 8, 10]) == pytest.approx(0.6905, abs=1e-4)  # scipy's
    assert stats.mann_whitney_p([5, 5, 5, 5, 5], [5, 5, 5, 5, 5]) == 1.0
    many = [float(i) for i in range(40)]
    assert stats.mann_whitney_p(many, [x + 100 for x in many]) < 1e-6  # the normal approximation


def _measured(key: str, samples: list[float]) -> metrics.Measured:
    return metrics.Measured(metrics.by_key()[key], stats.median(samples), tuple(samples))


def test_a_verdict_per_metric_in_words() -> None:
    faster = compare.compare_metric(_measured("first_sentence_ms", [300, 310, 320]),
                                    _measured("first_sentence_ms", [230, 240, 250]))
    assert faster.significant and faster.test == "ranges" and faster.noticeable
    assert faster.line.startswith("first sentence 310 -> 240 ms, 23 % sooner, significant")
    assert "a listener would notice" in faster.line
    small = compare.compare_metric(_measured("cache_ttft_ms", [20, 21, 22]), _measured("cache_ttft_ms", [30, 31, 32]))
    assert small.significant and not small.noticeable and "would not notice" in small.line
    overlap = compare.compare_metric(_measured("ttft_p50_ms", [60, 70, 80, 90, 100]),
                                     _measured("ttft_p50_ms", [65, 75, 85, 95, 105]))
    assert overlap.test == "mann-whitney" and overlap.significant is False and "within the noise" in overlap.line
    single = compare.compare_metric(_measured("cancel_idle_ms", [10]), _measured("cancel_idle_ms", [90]))
    assert single.significant is None and "cannot tell" in single.line


def _sentence_repeat(ttft: float, first: float, total: float, text: str) -> dict:
    return {"ttft_ms": ttft, "first_sentence_ms": first, "total_ms": total, "first_sentence": text.split(".")[0] + ".",
            "text": text, "smart_first_sentence": "", "smart_first_sentence_ms": first, "chunks": []}


def test_sentence_times_are_medians_and_the_text_is_the_median_answer() -> None:
    repeats = [_sentence_repeat(50, 400, 900, "A. b."), _sentence_repeat(40, 300, 800, "C. d."),
               _sentence_repeat(60, 350, 1000, "E. f.")]
    doc = sentence.summary_document(repeats)
    assert (doc["ttft_ms"], doc["first_sentence_ms"], doc["total_ms"]) == (50, 350, 900)
    assert (doc["first_sentence_ms_min"], doc["first_sentence_ms_max"]) == (300, 400)
    assert doc["median_repeat"] == 3 and doc["text"] == "E. f." and doc["repeats"] == repeats


def test_cancel_keeps_one_real_cut_with_the_median_idle_time() -> None:
    cuts = [{"max_tokens": 256, "received_tokens": n, "closed_at_ms": c, "slot_idle_after_ms": i, "cancel_logged": True,
             "chunks": [{"t_ms": 1.0, "text": "1"}] * n} for n, c, i in ((30, 501, 9.0), (25, 503, 20.0), (28, 502, 4.0))]
    doc = cancel.summary_document(cuts)
    assert doc["slot_idle_after_ms"] == 9.0 and doc["median_repeat"] == 1
    assert doc["received_tokens"] == 30 == len(doc["chunks"]) and doc["closed_at_ms"] == 501
    assert (doc["slot_idle_after_ms_min"], doc["slot_idle_after_ms_max"]) == (4.0, 20.0)
    cuts[2]["cancel_logged"] = False
    assert cancel.summary_document(cuts)["cancel_logged"] is False  # one missed cancel is a failed cancel


def _with_repeats(tmp_path: Path) -> Path:
    """sample_out with its single measurements turned into three repeats each (times x0.95, x1.0, x1.05)."""
    out = Path(shutil.copytree(SAMPLE_OUT, tmp_path / "out"))
    rows = json.loads((out / "prefill.json").read_text())
    for row in rows:
        reps = [{k: (v * f if k in ("prompt_ms", "ttft_ms") else v) for k, v in row.items() if k != "docs"}
                for f in (0.95, 1.0, 1.05)]
        row.update(stats.summarize(reps, ("prompt_n", "prompt_ms", "ttft_ms", "cache_n"), ("prompt_ms", "ttft_ms")))
        row["repeats"] = reps
    (out / "prefill.json").write_text(json.dumps(rows))
    return out


def test_noise_names_the_spread_numbers_and_a_loaded_machine(tmp_path: Path) -> None:
    out = _with_repeats(tmp_path)
    quiet = noise.assess(out, {"metadata": {"machine": {"cores": 2}}, "load_average_start": [0.2, 0.2, 0.2]})
    # sample_out's five ttft runs spread 41 %; prefill's 10 % stays under the limit.
    assert quiet["noisy"] and quiet["affected"] == ["ttft_p50_ms"]
    assert "prefill_12docs_ttft_ms" in quiet["spread"] and quiet["spread"]["prefill_12docs_ttft_ms"] == pytest.approx(0.1)
    run = {"metadata": {"machine": {"cores": 2}, "server": {"threads": 2}}, "load_average_start": [0.3, 0, 0],
           "steps": [{"step": "ttft", "wall_ms": 1000, "server_compute_ms": 500, "load_average": [1.8, 0, 0]},
                     {"step": "report", "wall_ms": 10, "server_compute_ms": 0, "load_average": [9.0, 0, 0]}]}
    # 1.8 during ttft, of which about 2 threads x 50 % = 1.0 is the lab's own server: 0.8 from others, under 1.0.
    assert noise.assess(out, run)["others_load_max"] == pytest.approx(0.8)
    run["steps"][0]["load_average"] = [3.5, 0, 0]
    loaded = noise.assess(out, run)
    assert loaded["others_load_max"] == pytest.approx(2.5) and "load average 3.50 after ttft" in loaded["reasons"][0]
    assert "first_sentence_ms" in loaded["affected"] and "prompt_n_12docs" not in loaded["affected"]
    assert noise.summary_lines(loaded)[0].startswith("warning: the machine was noisy")


def test_spread_checks_pass_on_medians_and_fail_on_a_wrong_one(tmp_path: Path) -> None:
    out = _with_repeats(tmp_path)
    by_name = {r.name: r for r in run_checks(out)}
    assert by_name["prefill repeats: medians, prompt_n grows in each"].status == PASS
    assert by_name["cache repeats: medians, hit and miss in each"].status == NOT_CHECKABLE  # no repeats in sample_out
    rows = json.loads((out / "prefill.json").read_text())
    rows[2]["ttft_ms"] = rows[2]["ttft_ms_max"]
    rows[1]["repeats"][1]["prompt_n"] = rows[2]["prompt_n"] + 1
    (out / "prefill.json").write_text(json.dumps(rows))
    result = {r.name: r for r in run_checks(out)}["prefill repeats: medians, prompt_n grows in each"]
    assert result.status == FAIL and "is not the median" in result.detail


def test_compare_refuses_runs_of_other_prompts_or_documents_unless_forced(tmp_path: Path) -> None:
    a = _with_repeats(tmp_path)
    b = Path(shutil.copytree(a, tmp_path / "b"))
    with pytest.raises(compare.IncomparableRunsError, match="no run.json"):
        compare.compare_runs(a, b)
    for out in (a, b):
        record = runmeta.RunRecord.start(out, {"kb": {"sha256": "k" * 64}, "prompts": {"sha256": "p" * 64}}, {})
        record.save()
    assert compare.compare_runs(a, b).metrics
    doc = json.loads((b / "run.json").read_text())
    doc["metadata"]["kb"]["sha256"] = "x" * 64
    (b / "run.json").write_text(json.dumps(doc))
    with pytest.raises(compare.IncomparableRunsError, match="KB documents differ"):
        compare.compare_runs(a, b)
    forced = compare.compare_runs(a, b, force=True)
    assert forced.forced and all(m.ratio == 1.0 for m in forced.metrics)


def _sse(tokens: int, done: bool = False) -> bytes:
    events = [{"choices": [{"delta": {"content": f"{i},"}}]} for i in range(tokens)]
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return body + (b"data: [DONE]\n\n" if done else b"")


def test_the_cancel_check_reads_the_raw_stream_of_the_repeat_shown(tmp_path: Path) -> None:
    from voice_llm.core.checks.core import check_cancel_cut

    out = tmp_path / "out"
    (out / "raw").mkdir(parents=True)
    chunks = [{"t_ms": t, "text": f"{i},"} for i, t in enumerate((400.0, 420.0, 440.0))]
    doc = {"max_tokens": 256, "received_tokens": 3, "closed_at_ms": 500.0, "slot_idle_after_ms": 30.0,
           "cancel_logged": True, "raw": "raw/cancel-r2.sse", "chunks": chunks, "median_repeat": 2}
    (out / "cancel.json").write_text(json.dumps(doc))
    (out / "raw" / "cancel.sse").write_bytes(_sse(5))  # repeat 1: another cut
    (out / "raw" / "cancel-r2.sse").write_bytes(_sse(3))
    assert "3/256 tokens" in check_cancel_cut(out)  # the stream of repeat 2 agrees
    (out / "raw" / "cancel-r2.sse").write_bytes(_sse(3, done=True))
    with pytest.raises(Exception, match=r"raw/cancel-r2.sse ends with \[DONE\]"):
        check_cancel_cut(out)
    doc["raw"] = "../../cancel-r2.sse"  # only a raw/cancel*.sse file is read
    (out / "cancel.json").write_text(json.dumps(doc))
    with pytest.raises(Exception, match=r"not a raw/cancel\*\.sse file"):
        check_cancel_cut(out)


def test_first_audio_is_a_metric_with_its_runs_as_samples(tmp_path: Path) -> None:
    """Time to first audio joins the noise warning, compare and the report's ranges like every other number."""
    doc = json.loads((Path(__file__).parents[1] / "fixtures" / "sample_audio" / "audio.json").read_text())
    runs = doc["strategies"]["clauses"]["runs"]
    doc["strategies"]["clauses"]["runs"] = [{**runs[0], "ttfa_ms": ms} for ms in (900.0, 1000.0, 1400.0)]
    doc["strategies"]["clauses"]["summary"]["ttfa_ms"]["median"] = 1000.0
    (tmp_path / "audio.json").write_text(json.dumps(doc))
    found = metrics.measure_all(tmp_path)
    clauses = found["ttfa_clauses_ms"]
    assert (clauses.median, clauses.samples, clauses.metric.audible) == (1000.0, (900.0, 1000.0, 1400.0), True)
    assert clauses.spread == pytest.approx(0.5)
    assert found["ttfa_whole_ms"].samples == (doc["strategies"]["whole"]["summary"]["ttfa_ms"]["median"],)
    assessed = noise.assess(tmp_path, {"metadata": {"machine": {"cores": 2}}, "load_average_start": [0.2, 0.2, 0.2]})
    assert assessed["affected"] == ["ttfa_clauses_ms"]
