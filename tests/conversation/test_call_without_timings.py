"""`call --url` against an OpenAI-compatible server that streams no llama-server ``timings`` (vLLM's shape,
tests/fakeshapes.py; newcomer walkthrough item 3): the call runs, prompt_n and cache_n are null with their reason
in call.json's ``unknown`` (as the lab's cache step leaves them), the token count says its source, and the checks
that need the missing numbers are not checkable, never FAIL; the report draws the call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakeshapes import VLLM, ShapedServer

from voice_llm.capabilities.conversation import CAPABILITY as CALL
from voice_llm.cli import main as cli
from voice_llm.core.client.capabilities import SOURCE_CHUNK_COUNT, SOURCE_CLIENT
from voice_llm.core.scenario.dialogue import DEFAULT_DIALOGUE, load_dialogue

TURNS = len(load_dialogue(DEFAULT_DIALOGUE).turns)


def test_a_call_against_a_server_without_timings_runs_and_says_what_it_cannot_count(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VOICE_LLM_STATE", str(tmp_path / "state"))
    out = tmp_path / "out"
    with ShapedServer(VLLM, token_s=0.001, prefill_s_per_char=0.00002) as fake:
        status = cli.main(["call", "--url", fake.url, "--out", str(out), "-q"])
    captured = capsys.readouterr()
    assert status == cli.EXIT_OK, captured.err
    doc = json.loads((out / "call.json").read_text())
    rows = [*doc["cache_on"], *doc["cache_off"]]
    assert len(rows) == 2 * TURNS
    assert all(row["prompt_n"] is None and row["cache_n"] is None for row in rows)
    assert all(row["ttft_ms"] > 0 and row["tokens"] > 0 for row in rows)
    assert doc["unknown"]["prompt_n"].startswith("no timings.cache_n in the stream")
    assert doc["unknown"]["cache_n"] == doc["unknown"]["prompt_n"]
    assert "may reuse the previous prompt's KV cache" in doc["unknown"]["cache_off"]
    assert doc["sources"]["tokens"] == SOURCE_CHUNK_COUNT and doc["sources"]["ttft_ms"] == SOURCE_CLIENT
    assert "prompt_n" not in doc["sources"]

    assert cli.main(["check", str(out)]) == cli.EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    by_name = {entry.name: next(line for line in lines if f"  {entry.name}: " in line) for entry in CALL.checks}
    assert by_name["call: ttft <= first sentence <= total"].startswith("PASS")
    same = by_name["call: both runs send the same growing prompts"]
    assert same.startswith("N/C") and "prompt_n is null: no timings.cache_n in the stream" in same, same
    fast = by_name["call: the cache keeps later turns fast"]
    assert fast.startswith("N/C") and "'cache off' is not guaranteed" in fast and "median ttft" in fast, fast
    assert not [line for line in lines if line.startswith("FAIL")], lines

    assert cli.main(["report", "--out", str(out), "-q"]) == cli.EXIT_OK
    page = (out / "report.html").read_text()
    assert "did not say its prompt tokens" in page and "not said + not said" in page
