"""Every repeat kept, in the run folder, in the fast tier: prefill, cache, sentence and cancel asked for two repeats
of a server shaped like vLLM (tests/fakeshapes.py). Only the files' shape is asserted, never a time. The same on the
real server, its cache hit against its miss, and its medians over an even count are the slow tier's (the session
lab's two repeats: tests/report/test_compare_real.py, tests/run/test_identity_medians.py)."""

from __future__ import annotations

import json
from pathlib import Path

from clihelpers import SHORT_KB
from conftest import FAKE_TOKEN_S
from fakeshapes import VLLM, ShapedServer

from voice_llm.cli import main as cli
from voice_llm.core.util.stats import median

REPEATS = 2


def test_prefill_cache_sentence_and_cancel_keep_every_repeat(tmp_path: Path, state_dir: Path) -> None:
    with ShapedServer(VLLM, token_s=FAKE_TOKEN_S) as server:
        for step, kb in (("prefill", True), ("cache", True), ("sentence", False), ("cancel", False)):
            # a folder each: prefill and cache read the short KB, sentence and cancel no KB (a run is one KB)
            code = cli.main([step, "--url", server.url, "--out", str(tmp_path / step), "--repeat", str(REPEATS),
                             *(("--kb", str(SHORT_KB)) if kb else ()), "-q"])
            assert code == 0, step
    load = lambda step: json.loads((tmp_path / step / f"{step}.json").read_text())  # noqa: E731
    prefill, cache, sentence, cancel = (load(step) for step in ("prefill", "cache", "sentence", "cancel"))
    assert [row["docs"] for row in prefill] == [0, 4, 12]
    for row in prefill:  # the brief's fields are the repeats' medians, their range beside them
        assert len(row["repeats"]) == REPEATS and row["ttft_ms"] == median([r["ttft_ms"] for r in row["repeats"]])
        assert row["ttft_ms_min"] <= row["ttft_ms"] <= row["ttft_ms_max"]
    assert len(cache["repeats"]) == REPEATS
    for repeat in cache["repeats"]:  # each repeat in the brief's order, each with its own miss and hit
        assert list(repeat) == ["first", "second", "changed_suffix", "changed_prefix"]
    assert len(sentence["repeats"]) == REPEATS
    assert sentence["first_sentence_ms_min"] <= sentence["first_sentence_ms"] <= sentence["first_sentence_ms_max"]
    assert len(cancel["repeats"]) == REPEATS  # its slot-idle median is the real server's (this shape has no /slots)
    raw = {p.name for p in (tmp_path / "prefill" / "raw").iterdir()}
    assert len([name for name in raw if name.startswith("prefill-")]) == 3 * REPEATS, sorted(raw)
