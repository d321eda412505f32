"""Unregistering a capability removes it cleanly: with tts taken out of the registry, the lab runs without the
speak step (no audio.json, no WAV, speak not planned), and the run's check has no audio rows and no failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from fakeshapes import VLLM, ShapedServer

from voice_llm.core import registry
from voice_llm.core.checks.core import FAIL
from voice_llm.core.lab import LabSettings, run_lab
from voice_llm.core.run.context import StepOptions
from voice_llm.core.lab.steps import lab_steps, steps


@pytest.mark.slow
def test_the_lab_without_tts_runs_without_speak(tmp_path: Path) -> None:
    assert "speak" in lab_steps()  # registered: the lab runs it
    out = tmp_path / "out"
    with registry.without("tts"), ShapedServer(VLLM, model="vllm-model") as server:
        assert "speak" not in steps() and "speak" not in lab_steps()
        result = run_lab(LabSettings(out=out, url=server.url, options=StepOptions(repeat=1), render_html=False))
    assert "speak" in lab_steps()  # back once the block ends
    ran = [step["step"] for step in result.run["steps"]]
    assert "speak" not in ran and "speak" not in result.run["steps_planned"] and "sentence" in ran
    assert not (out / "audio.json").exists() and not (out / "audio").exists()
    assert not any("audio" in name for name in result.run["artifacts"])
    names = [check.name for check in result.checks]
    assert names and not [name for name in names if "audio" in name.lower() or "speak" in name.lower()], names
    assert not [check for check in result.checks if check.status == FAIL], result.checks
