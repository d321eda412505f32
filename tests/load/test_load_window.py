"""When a text-mode load step's measured window ends (issue 30, item 4: a verdict in minutes): at its 20th judged
turn, --step-s being only the longest window; a step that never gets there says so. Fakes only: the rule is
stats.window_end / stats.short_of_turns (the master calls them), the plan is run.plan_of."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders import SLO, load_sample as sample
from voice_llm.capabilities.load import run as load_run
from voice_llm.capabilities.load import stats
from voice_llm.capabilities.load.plan import DEFAULT_STEP_S, LOAD_MAX_TOKENS, LOAD_THINK_SCALE, CallerConfig
from voice_llm.capabilities.load.settings import DEFAULT_SLOTS, LoadSettings
from voice_llm.core.scenario import dialogue as dialogues

CALLER = CallerConfig(url="http://x", system="s", turns=("a",))


def _turns(count: int, first: float | None = 300.0, **kw) -> list[dict]:
    return [sample(0, first, start=105.0 + n, **kw) for n in range(count)]


def test_a_step_ends_at_its_20th_judged_turn_and_not_before() -> None:
    nineteen = _turns(19)
    assert stats.window_end(nineteen, 0, SLO) is None
    assert stats.window_end(nineteen + _turns(1), 0, SLO) == "judged"
    # only the step's own measured turns count: its warm-up and drain turns, and another step's, do not
    others = _turns(5, phase="warmup") + _turns(5, phase="drain") + [sample(1, 300.0) for _ in range(5)]
    assert stats.window_end(nineteen + others, 0, SLO) is None
    # a turn the caller cut before its first sentence cannot be judged, so it does not end the window; an error can
    cut = _turns(1, first=None, cancelled=True)
    assert stats.window_end(nineteen + cut, 0, SLO) is None
    assert stats.window_end(nineteen + _turns(1, first=None, error="boom"), 0, SLO) == "judged"


def test_the_window_ends_on_how_many_turns_came_never_on_what_they_measured() -> None:
    late = _turns(20, first=10 * SLO)  # all late: judged all the same (and the step then fails on them)
    assert stats.window_end(late, 0, SLO) == "judged"
    # early (the plan's decide_early, both modes): more misses than 1 in 20 end the window too, a failing step;
    # one miss does not (20 turns may hold one)
    assert stats.window_end(late[:3], 0, SLO) is None
    assert stats.window_end(late[:3], 0, SLO, early=True) == "failed early"
    assert stats.window_end(late[:1] + _turns(5), 0, SLO, early=True) is None


def test_a_step_that_never_reaches_20_judged_turns_says_so() -> None:
    short = stats.summarize_step(_turns(7), SLO, 120.0)
    line = stats.short_of_turns(short, 120.0)
    assert line is not None and "7 judged turns" in line and "120 s" in line and "no verdict" in line
    assert stats.short_of_turns(stats.summarize_step(_turns(20), SLO, 30.0), 120.0) is None
    # and the verdict rests on no such step; a short step that missed 2 turns is judged (failed early): 'no step held'
    assert stats.verdict([{**short, "callers": 1}], 4, early=True)["max_callers"] is None
    missed = stats.summarize_step(_turns(2, first=10 * SLO), SLO, 120.0)
    assert stats.short_of_turns(missed, 120.0, early=True) is None
    held = stats.verdict([{**missed, "callers": 1}], 4, early=True)
    assert held["max_callers"] == 0 and held["failed_early"] == [1]


def test_text_load_plans_the_early_end_with_step_s_as_the_longest_window() -> None:
    settings = LoadSettings()
    assert settings.step_s == DEFAULT_STEP_S and settings.think_scale == LOAD_THINK_SCALE
    plan = load_run.plan_of(settings, CALLER, None)
    assert plan.enough_judged == stats.MIN_JUDGED_TURNS and plan.step_s == DEFAULT_STEP_S
    assert plan.decide_early, "a text step that missed 2 turns is failed early, as a dialing one is"
    dialing = LoadSettings(dial="ws://h:1/")
    dial = load_run.plan_of(dialing, CALLER, load_run.dial_caller(dialing)[1])
    assert dial.enough_judged == stats.MIN_JUDGED_TURNS and dial.decide_early


def test_load_replies_are_capped_unless_asked_and_the_lab_ttft_request_is_kept(tmp_path: Path) -> None:
    clinic = dialogues.load_dialogue("clinic")
    config, described = load_run.caller_config(LoadSettings(out=tmp_path), "http://x", tmp_path)
    assert config.max_tokens == described["max_tokens"] == min(clinic.max_tokens, LOAD_MAX_TOKENS)
    config, _ = load_run.caller_config(LoadSettings(out=tmp_path, max_tokens=64), "http://x", tmp_path)
    assert config.max_tokens == 64
    lab = dialogues.load_dialogue(dialogues.LAB_TTFT)
    config, _ = load_run.caller_config(LoadSettings(out=tmp_path, dialogue=dialogues.LAB_TTFT), "http://x", tmp_path)
    assert config.max_tokens == lab.max_tokens


def test_warm_up_waits_for_each_callers_first_turn() -> None:
    one = [sample(1, 300.0, phase="warmup", worker="w1")]
    assert not stats.warmed(one, 1, 2)
    assert stats.warmed(one + [sample(1, 300.0, phase="warmup", worker="w2")], 1, 2)
    # the previous step's turns, or this step's measured ones, do not warm a caller for this step's window
    assert not stats.warmed(one + [sample(0, 300.0, phase="warmup", worker="w2"),
                                   sample(1, 300.0, phase="measure", worker="w2")], 1, 2)


class _Record:
    def __init__(self, slots: int, ctx: int) -> None:
        self.port, self.slots, self.ctx, self.url = 18100, slots, ctx, "http://127.0.0.1:18100"


@pytest.mark.parametrize("running", [True, False])
def test_load_without_url_or_slots_sweeps_the_managed_server_as_it_runs(monkeypatch: pytest.MonkeyPatch,
                                                                        running: bool) -> None:
    monkeypatch.setattr(load_run.server, "read_record", lambda port: _Record(4, 16384) if running else None)
    monkeypatch.setattr(load_run.server, "is_alive", lambda record: True)
    said: list[str] = []
    got = load_run.managed_as_it_runs(LoadSettings(port=18100), said.append)
    if running:
        assert got.url == "http://127.0.0.1:18100" and got.slots == (4,)
        assert "as it is (4 slots, -c 16384)" in said[0]
    else:
        assert got.url is None and got.slots == DEFAULT_SLOTS and not said
    # --slots or --url given: as asked, whatever runs
    assert load_run.managed_as_it_runs(LoadSettings(port=18100, slots=(1,)), said.append).slots == (1,)
    assert load_run.managed_as_it_runs(LoadSettings(url="http://h:1"), said.append).url == "http://h:1"


class _Clock:
    """The master's wait on a fake clock: samples arrive at their report times; ``wait(seconds, enough)`` steps
    half a second at a time, as sweep.Sweep.wait polls, until ``enough()`` or the time is up."""

    def __init__(self, arrivals: list[tuple[float, dict]]) -> None:
        self.now, self.arrivals, self.samples = 0.0, sorted(arrivals, key=lambda a: a[0]), []

    def _arrive(self) -> None:
        while self.arrivals and self.arrivals[0][0] <= self.now:
            self.samples.append(self.arrivals.pop(0)[1])

    def wait(self, seconds: float, enough) -> None:
        end = self.now + seconds
        self._arrive()
        while self.now < end - 1e-9 and not enough():
            self.now = min(end, self.now + 0.5)
            self._arrive()


def test_the_window_opens_only_once_each_caller_has_finished_a_turn_however_long_its_cold_prefill() -> None:
    """The newcomer's run: --step-s 2 --warmup-s 1, one caller whose first turn (a cold prefill: prompt_n 2976)
    started 3.5 s in and was reported 86 s in. The window used to open at warmup_s + step_s (3 s) with the caller's
    cold turn judged in it; now the warm-up lasts until that turn is done, so it is a warm-up turn."""
    plan = load_run.plan_of(LoadSettings(step_s=2.0, warmup_s=1.0, callers=(1,)), CALLER, None)
    cold = sample(0, 82792.0, phase="warmup", start=3.5)
    clock = _Clock([(86.0, cold)])
    warmup_s = stats.warm_up(clock.wait, lambda: clock.samples, 0, 1, plan.warmup_s, plan.warmup_cap_s,
                             clock=lambda: clock.now)
    assert warmup_s == pytest.approx(86.0)  # not 3 s: the step_s cap is gone
    assert plan.warmup_cap_s >= plan.warmup_s + CALLER.timeout_s + plan.step_s
    # two callers: one warm turn is not enough, the second's first turn ends the warm-up
    clock = _Clock([(4.0, sample(0, 300.0, phase="warmup", worker="w1")),
                    (30.0, sample(0, 300.0, phase="warmup", worker="w1", start=10.0)),
                    (45.0, sample(0, 9000.0, phase="warmup", worker="w2"))])
    assert stats.warm_up(clock.wait, lambda: clock.samples, 0, 2, 1.0, 500.0, clock=lambda: clock.now) == 45.0
    # a warm-up never shorter than --warmup-s, even when every caller is done at once
    clock = _Clock([(0.0, sample(0, 300.0, phase="warmup"))])
    assert stats.warm_up(clock.wait, lambda: clock.samples, 0, 1, 15.0, 500.0, clock=lambda: clock.now) == 15.0


def test_a_caller_that_finishes_no_turn_stops_the_sweep_instead_of_opening_the_window() -> None:
    clock = _Clock([(2.0, sample(0, 300.0, phase="warmup", worker="w1"))])
    with pytest.raises(stats.WarmUpTooLong, match=r"^1 of 2 callers finished a turn within the warm-up's 130 s"):
        stats.warm_up(clock.wait, lambda: clock.samples, 0, 2, 1.0, 130.0, clock=lambda: clock.now)
    assert clock.now == pytest.approx(130.0)
