"""The barge-in plan against the number of synthesized caller lines: a barge-in on turn N is line N+1 cutting into
reply N, so a call with N lines or fewer has none on turn N. Before, `voice-llm lab --turns 2` kept the default
plan (turn 3) in dial.json and failed its own "every value is possible" check. Piper is replaced by tones here:
what is tested is the plan, not the voice."""

from __future__ import annotations

import numpy as np
import pytest

from voice_llm.capabilities.dial import step
from voice_llm.capabilities.dial.call import DEFAULT_BARGE_IN_TURNS
from voice_llm.capabilities.dial.step import DialOptions, caller_lines
from voice_llm.engines.speech_in.caller_audio import SAMPLE_RATE, Utterance


def _tones(scripts, *args, **kwargs):
    lead = np.zeros(SAMPLE_RATE // 10, np.int16)
    body = (8000 * np.sign(np.sin(np.arange(SAMPLE_RATE // 2) * 0.2))).astype(np.int16)
    samples = np.concatenate([lead, body])
    return [Utterance(i, text, samples, "synthesized", None, 100, len(lead), len(samples))
            for i, text in enumerate(scripts, 1)], None


@pytest.fixture(autouse=True)
def no_piper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(step, "synthesize_lines", _tones)


@pytest.mark.parametrize("turns", [1, 2, 3])
def test_too_few_lines_for_the_default_barge_in_drop_it_and_say_so(turns: int) -> None:
    assert DEFAULT_BARGE_IN_TURNS == (3,)
    caller = caller_lines(DialOptions(turns=turns))
    assert len(caller.lines) == turns
    assert caller.barge_in_turns == ()
    assert caller.notes == (f"{turns} caller lines: no barge-in on turn 3 (it needs the next line to cut in with)",)


def test_enough_lines_keep_the_plan() -> None:
    caller = caller_lines(DialOptions(turns=4))
    assert caller.barge_in_turns == (3,) and caller.notes == ()
    caller = caller_lines(DialOptions(turns=4, barge_in_turns=(1, 4)))
    assert caller.barge_in_turns == (1,) and "no barge-in on turn 4" in caller.notes[0]
