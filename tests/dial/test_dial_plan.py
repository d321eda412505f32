"""Issue 41 item 25: a run's planned steps are those its commands planned. `voice-llm dial --out DIR` alone into an
empty folder plans dial only, so `check` lists no "planned steps not run: health, sse, ..." a lone dial never
planned; a later command joining the run adds its own steps to the plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dialhelpers import write_tone_wavs
from fakeagent import FakeAgent, Reply

from voice_llm.core.checks.core import NOT_RUN_CHECK, run_checks
from voice_llm.cli.main import main
from voice_llm.core.lab import pipeline


def test_a_lone_dial_plans_dial_only_and_check_lists_no_unplanned_step(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    with FakeAgent([Reply(100, 200, "m1")]) as agent:
        status = main(["dial", agent.url, "--out", str(out), "--caller-audio", str(write_tone_wavs(tmp_path / "w", 1)),
                       "--turns", "1", "--barge-in-turns", "none", "--stt", "none", "--deadline", "10", "--quiet"])
    assert status == 0, capsys.readouterr().err
    run = json.loads((out / "run.json").read_text())
    assert run["steps_planned"] == ["dial"] and list(run["artifacts_by_step"]) == ["dial"]
    assert run["expected_artifacts"] == ["dial.json"]
    assert not [r for r in run_checks(out) if r.name == NOT_RUN_CHECK]
    capsys.readouterr()
    main(["check", str(out)])
    assert "planned steps not run" not in capsys.readouterr().out


def test_a_step_alone_plans_its_own_steps() -> None:
    from voice_llm.core.lab import LabSettings

    plan = pipeline._plan_of(LabSettings(out=Path("/nonexistent")), "speak", ["speak"], whole_run=False)
    assert list(plan.steps) == ["speak"]
