"""`call` is its own capability (issue 26.3): its checks and its report section are registered by voice_llm.capabilities.conversation,
so with `load` left out (VOICE_LLM_WITHOUT=load) a call is still measured and still checked. Against the scripted
fake server (tests/fakeserver.py): the cache-on turns answer at once and say what they reused, the cache-off
turns answer later and reuse nothing, as a llama-server with a working prompt cache does."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakeserver import DONE, TIMINGS, FakeServer, Reply, chunk_payload, event

from voice_llm.core import registry
from voice_llm.capabilities.conversation import CAPABILITY as CALL
from voice_llm.cli import main as cli
from voice_llm.core.scenario.dialogue import DEFAULT_DIALOGUE, load_dialogue

TURNS = len(load_dialogue(DEFAULT_DIALOGUE).turns)
PER_TURN = 100  # tokens each turn adds to the conversation (the fake's count)
HIT_S, MISS_S = 0.0, 0.1  # first content after the headers: a cache hit at once, a miss after a prefill


def _answer(first_after_s: float, prompt_n: int, cache_n: int) -> Reply:
    timings = {**TIMINGS, "prompt_n": prompt_n, "cache_n": cache_n}
    pieces = [(0.0, event(chunk_payload({"role": "assistant", "content": None}))),
              (first_after_s, event(chunk_payload({"content": "Yes, we are open at nine."}))),
              (0.0, event(chunk_payload({"content": " See you then."}))),
              (0.0, event(chunk_payload({}, "stop", timings=timings)))]
    return Reply.stream([*pieces, (0.0, DONE)])


def _script() -> list[Reply]:
    """The call's requests in order: empty the slot, the turns with the cache on, empty it, the turns without."""
    filler = _answer(0.0, 8, 0)
    on = [_answer(HIT_S, PER_TURN if turn == 1 else 20, 0 if turn == 1 else PER_TURN * turn - 20)
          for turn in range(1, TURNS + 1)]
    off = [_answer(MISS_S, PER_TURN * turn, 0) for turn in range(1, TURNS + 1)]
    return [filler, *on, filler, *off]


def test_without_load_a_call_is_still_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    # In-process, as `VOICE_LLM_WITHOUT=load voice-llm call ...` runs it: the registry reads the variable each time.
    monkeypatch.setenv(registry.WITHOUT_ENV, "load")
    monkeypatch.setenv("VOICE_LLM_STATE", str(tmp_path / "state"))
    assert not registry.enabled("load") and registry.enabled("call")
    out = tmp_path / "out"
    with FakeServer(_script()) as fake:
        assert cli.main(["call", "--url", fake.url, "--out", str(out), "-q"]) == 0
    assert len(fake.requests) == 2 * (TURNS + 1)  # every turn of both runs was asked, nothing more
    assert (out / "call.json").is_file()
    capsys.readouterr()

    assert cli.main(["check", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    for entry in CALL.checks:  # each of call's checks ran and passed (none silently left out with load)
        (line,) = [line for line in lines if f"  {entry.name}: " in line]
        assert line.startswith("PASS"), line
    assert not [line for line in lines if "load:" in line]  # load's are gone with load
    assert cli.main(["load", "--help"]) == cli.EXIT_USAGE  # and so is its command; the call step is not
    assert capsys.readouterr().err == ("voice-llm load: not available: the load capability is left out "
                                       "(VOICE_LLM_WITHOUT=load)\n")
