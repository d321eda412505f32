"""Issue 31 item 17: a step run alone prints its key numbers, one short table as the lab's summary, read back
from the files it wrote (the same numbers report.json copies). In-process against an in-process fake server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakeshapes import VLLM, ShapedServer

from voice_llm.capabilities.conversation.step import numbers as call_numbers
from voice_llm.cli import main as cli
from voice_llm.core.lab.summary import step_numbers


def fast() -> ShapedServer:
    return ShapedServer(VLLM, base_s=0.001, token_s=0.0005, prefill_s_per_char=0.0)


@pytest.mark.parametrize("step, labels", [
    ("ttft", ["median time to first token", "median time to the whole answer"]),
    ("sentence", ["time to the first sentence"]),
])
def test_a_step_alone_prints_its_key_numbers(step: str, labels: list[str], tmp_path: Path, state_dir: Path,
                                             capsys: pytest.CaptureFixture[str], monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "out"
    with fast() as server:
        assert cli.main([step, "--url", server.url, "--out", str(out), "-q"]) == 0
    printed = capsys.readouterr().out
    assert f"voice-llm {step}" in printed
    rows = step_numbers(out, step)
    assert [label.split(" (")[0] for label, _ in rows] == labels  # the label may say "(cache not disabled)"
    doc = json.loads((out / f"{step}.json").read_text())
    first = doc["ttft_p50"] if step == "ttft" else doc["first_sentence_ms"]
    assert rows[0][1] == f"{first:.0f} ms"  # from the file the step wrote
    for label, value in rows:
        assert label in printed and value in printed
    assert printed.rstrip().splitlines()[-1] == str(out / f"{step}.json")  # the artifact's path still last


def test_a_step_without_key_numbers_prints_no_table(tmp_path: Path, state_dir: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    with fast() as server:
        assert cli.main(["health", "--url", server.url, "--out", str(out), "-q"]) == 0
    assert step_numbers(out, "health") == []
    assert "voice-llm health" not in capsys.readouterr().out


def test_the_call_says_cache_on_against_off(tmp_path: Path) -> None:
    turns = lambda ttfts: [{"turn": n, "ttft_ms": t, "first_sentence_ms": t + 100, "prompt_n": 40, "cache_n": 900}
                           for n, t in enumerate(ttfts, 1)]
    (tmp_path / "call.json").write_text(json.dumps({"cache_on": turns([100, 120, 110]), "cache_off": turns([900, 1000, 950])}))
    assert call_numbers(tmp_path) == [
        ("first token, cache on (median of 3 turns)", "110 ms"),
        ("first sentence, cache on (median of 3 turns)", "210 ms"),
        ("first token, cache off (median of 3 turns)", "950 ms"),
        ("first sentence, cache off (median of 3 turns)", "1050 ms"),
        ("turn 3, cache on: tokens prefilled / from the cache", "40 / 900 tokens"),
    ]
