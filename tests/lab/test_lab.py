"""The whole lab against the real server and the default model: every artifact, and the brief's relations."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from voice_llm.core.util.artifacts import REQUIRED
from voice_llm.core.sse import SSEDecoder

pytestmark = pytest.mark.server


def load(out: Path, name: str):
    return json.loads((out / name).read_text())


def test_lab_exits_zero_and_passes_its_own_check(lab_run) -> None:
    out, done = lab_run
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = re.search(r"^(\d+) passed, (\d+) findings?, 0 not checkable, 0 failed$", done.stdout, re.M)
    assert summary, done.stdout[-3000:]
    # Every check the lab printed passed or is a finding about this machine (an expectation, never a failure):
    # none failed, none was left "not checkable" on llama-server.
    lines = done.stdout.splitlines()
    passes = [line for line in lines if line.startswith("PASS ")]
    findings = [line for line in lines if line.startswith("FIND ")]
    assert int(summary.group(1)) == len(passes) and int(summary.group(2)) == len(findings)
    assert len(passes) + len(findings) >= 20
    for name in (*REQUIRED, "sse.py", "server.log", "run.json", "report.html"):
        assert (out / name).is_file(), name
    assert not list(out.glob("**/*.tmp")) and not list(out.glob("**/*.partial"))


def test_first_token_comes_after_the_role_chunk_and_before_the_end(lab_run) -> None:
    out, _ = lab_run
    decoder = SSEDecoder()
    events = decoder.feed((out / "sse_raw.txt").read_bytes())
    first = json.loads(events[0].data)["choices"][0]["delta"]
    assert first.get("role") == "assistant" and not first.get("content")
    assert events[-1].data == "[DONE]"
    chunks = [json.loads(line) for line in (out / "chunks.jsonl").read_text().splitlines()]
    contents = [json.loads(e.data)["choices"][0]["delta"].get("content") for e in events[:-1]
                if json.loads(e.data).get("choices")]
    assert [c["text"] for c in chunks] == [c for c in contents if c]
    ttft = load(out, "ttft.json")
    assert len(ttft["runs"]) == 5
    for run in ttft["runs"]:
        assert 0 < run["ttft_ms"] < run["total_ms"]
        assert run["tokens"] > 1
    assert ttft["ttft_p50"] == sorted(r["ttft_ms"] for r in ttft["runs"])[2]
    assert ttft["total_p50"] == sorted(r["total_ms"] for r in ttft["runs"])[2]


def test_long_prompt_costs_more_and_the_cache_skips_it(lab_run) -> None:
    out, _ = lab_run
    prefill = load(out, "prefill.json")
    assert [r["docs"] for r in prefill] == [0, 4, 12]
    assert prefill[0]["prompt_n"] < prefill[1]["prompt_n"] < prefill[2]["prompt_n"] < 4096
    assert prefill[0]["ttft_ms"] < prefill[1]["ttft_ms"] < prefill[2]["ttft_ms"]
    assert all(r["cache_n"] == 0 for r in prefill), "cache_prompt false must recompute the whole prompt"
    cache = load(out, "cache.json")
    first, second = cache["first"], cache["second"]
    assert second["prompt_n"] <= 2 and second["cache_n"] >= first["prompt_n"] - 1
    assert second["ttft_ms"] < first["ttft_ms"] / 5
    assert cache["changed_prefix"]["prompt_n"] > 0.9 * first["prompt_n"]
    assert cache["changed_suffix"]["prompt_n"] < 0.1 * first["prompt_n"]
    assert cache["changed_suffix"]["ttft_ms"] < cache["changed_prefix"]["ttft_ms"]


def test_sentence_and_cancel(lab_run) -> None:
    out, _ = lab_run
    sentence = load(out, "sentence.json")
    assert sentence["ttft_ms"] <= sentence["first_sentence_ms"] <= sentence["total_ms"]
    assert sentence["text"].startswith(sentence["first_sentence"])
    assert sentence["ttft_ms"] <= sentence["smart_first_sentence_ms"] <= sentence["total_ms"]
    cancel = load(out, "cancel.json")
    assert cancel["max_tokens"] == 256
    assert 0 < cancel["received_tokens"] < 256
    assert cancel["closed_at_ms"] >= 500
    assert 0 <= cancel["slot_idle_after_ms"] < 5000
    assert cancel["cancel_logged"] is True
    assert "cancel task" in (out / "server.log").read_text(errors="replace")


def test_report_is_copied_from_the_files(lab_run) -> None:
    out, _ = lab_run
    report = load(out, "report.json")
    ttft, prefill, cache = load(out, "ttft.json"), load(out, "prefill.json"), load(out, "cache.json")
    brief = {
        "ttft_p50_ms": ttft["ttft_p50"],
        "total_p50_ms": ttft["total_p50"],
        "ttft_12docs_ms": prefill[-1]["ttft_ms"],
        "prompt_n_12docs": prefill[-1]["prompt_n"],
        "cache_ttft_ms": cache["second"]["ttft_ms"],
        "first_sentence_ms": load(out, "sentence.json")["first_sentence_ms"],
        "cancel_idle_ms": load(out, "cancel.json")["slot_idle_after_ms"],
    }
    assert list(report)[: len(brief)] == list(brief)  # the brief's fields first, the others beside them
    assert {key: report[key] for key in brief} == brief
    audio = load(out, "audio.json")
    assert {f"ttfa_{name}_ms": value for name, value in audio["ttfa_ms"].items()}.items() <= report.items()
    run = load(out, "run.json")
    assert run["server_compute_ms"] > 0 and run["wall_ms"] >= run["server_compute_ms"] * 0.5


def test_the_copied_sse_py_runs_on_its_own(lab_run, tmp_path: Path) -> None:
    out, _ = lab_run
    copy = tmp_path / "sse.py"
    copy.write_bytes((out / "sse.py").read_bytes())
    done = subprocess.run([sys.executable, str(copy), "--help"], capture_output=True, text=True, timeout=30,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and "--url" in done.stdout
