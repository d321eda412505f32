"""`voice-llm agent --turn smart` with the REAL smart-turn v3.2 model (pipecat's, from the optional extra).

1. The model as the agent asks it: caller lines synthesized by Piper (voice_llm.capabilities.dial.caller_lines.synthesize_lines, the
   dialer's own caller voice), Silero frame by frame through the agent's TurnTaker, the model run at the CHECK on
   the utterance so far. What it really does (measured first, 16 kHz): a complete line is complete (P 0.98 for "I'd
   like to move my appointment to Friday."); the same line cut before its last word is still judged complete here
   (P 0.79: Piper's voice drops its pitch at "to" as at a sentence's end) but lower; a line that stops on "and" is
   incomplete (P 0.01). Asserted as relations and the 0.5 verdict, not as the numbers.
2. A real call: `voice-llm dial` (as the lab's converse step runs it, plus --turn smart) against the built-in agent
   on a real llama-server: every clinic line is answered, each turn's record, span and the dial's agent block say
   smart. No time is asserted."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from clihelpers import SHORT_KB

from voice_llm.capabilities.agent import turn as turnmod
from voice_llm.capabilities.agent.turn import CHECK, TurnTaker, Verdict
from voice_llm.engines.speech_in import vad as vadmod
from voice_llm.engines.speech_in.caller_audio import FRAME_SAMPLES, SAMPLE_RATE

pytest.importorskip("pipecat.audio.turn.smart_turn.local_smart_turn_v3",
                    reason="the pipecat extra is not installed (make test installs it)")

COMPLETE = "I'd like to move my appointment to Friday."
CUT = "I'd like to move my appointment to"
TRAILING = "Good. My doctor also wants a fasting blood test, and"
TURNS = 2  # the real call's clinic lines
# The real call's agent answers in at most this many tokens (the lab's: 48): the caller listens to each reply in real
# time, and what is asserted is the turn's end (smart's decision), not the reply.
REPLY_TOKENS = 16


@pytest.fixture(scope="module")
def model() -> turnmod.SmartTurnModel:
    return turnmod.SmartTurnModel()


def judged_at_the_end(model: turnmod.SmartTurnModel, samples: np.ndarray) -> Verdict:
    """The verdict the agent would get at the line's last pause: Silero and the TurnTaker over the line and 1 s of
    silence, the model run on every frame so far at each CHECK (the last one is the line's end)."""
    padded = np.concatenate([np.zeros(SAMPLE_RATE // 5, np.int16), samples, np.zeros(SAMPLE_RATE, np.int16)])
    silero, taker = vadmod.SileroVAD(), TurnTaker("smart")
    frames: list[np.ndarray] = []
    verdicts: list[Verdict] = []
    for start in range(0, len(padded) - FRAME_SAMPLES + 1, FRAME_SAMPLES):
        frame = padded[start:start + FRAME_SAMPLES]
        frames.append(frame)
        for event in taker.push(silero(frame.astype("<i2").tobytes())):
            if event.kind == CHECK:
                verdicts.append(model.judge(np.concatenate(frames)))
                taker.verdict(event.frame, verdicts[-1])
    assert verdicts, "Silero heard no pause after the line"
    return verdicts[-1]


@pytest.mark.slow
def test_the_real_model_judges_a_complete_line_complete_and_a_cut_one_lower(model: turnmod.SmartTurnModel) -> None:
    from voice_llm.capabilities.dial.caller_lines import synthesize_lines

    utterances, _ = synthesize_lines([COMPLETE, CUT, TRAILING])
    complete, cut, trailing = (judged_at_the_end(model, u.samples) for u in utterances)
    assert complete.complete and complete.probability > 0.5, complete
    assert cut.probability < complete.probability, (cut, complete)
    assert not trailing.complete and trailing.probability < 0.5, trailing
    for verdict in (complete, cut, trailing):
        assert verdict.inference_ms > 0
    info = model.info()
    assert info["version"] == "1.14.0" and info["threads"] == turnmod.MODEL_THREADS


@pytest.mark.slow
@pytest.mark.server
def test_a_real_call_against_the_smart_agent_is_answered_and_says_smart(module_server, tmp_path: Path) -> None:
    from voice_llm.core.client.api import ServerClient
    from voice_llm.capabilities.agent.settings import AgentSettings
    from voice_llm.capabilities.dial import converse, otlp
    from voice_llm.core.run.flags import as_json
    from voice_llm.capabilities.dial.step import DialOptions, Tracing, dial_step, options_of, prepare_call
    from voice_llm.core.run.context import LabContext, StepOptions
    from voice_llm.core.util.artifacts import read_json

    # two short questions (the load lines): each turn proves the same thing (answered, smart in its record, span and
    # the agent block). One sentence each: the clinic's second line, "Okay. Do you take Medicare?", is two, and the
    # model may rightly judge "Okay." complete and the agent answer it while the caller goes on (a talked-over turn)
    agent_asked = AgentSettings(stt_threads=1, turn="smart", max_tokens=REPLY_TOKENS)
    ctx = LabContext(out=tmp_path, client=ServerClient(module_server.url), kb_dir=SHORT_KB,
                     options=StepOptions(plugins={"dial": DialOptions(turns=TURNS, barge_in_turns=(),
                                                                      caller_lines="load", agent=agent_asked)}))
    options = options_of(ctx)
    prepared = prepare_call(ctx, options)
    with tempfile.TemporaryDirectory(prefix="voice-llm-agent-") as tmp:
        ready_file, log_path = Path(tmp) / "ready.json", Path(tmp) / "agent.log"
        settings_file = Path(tmp) / "settings.json"
        tracing = Tracing("127.0.0.1:0")
        try:
            settings_file.write_text(json.dumps(as_json(converse.agent_settings(ctx, options, ready_file,
                                                                                tracing.endpoint))))
            with converse.Agent(converse.agent_command(settings_file), ready_file, log_path) as agent:
                try:
                    ready = agent.wait_ready()
                    dial_step(ctx, options, ready["listen"], identity=converse.identity_of(ready),
                              prepared=prepared, tracing=tracing)
                finally:
                    status = agent.stop()
                    log = log_path.read_text() if log_path.is_file() else ""
        finally:
            tracing.stop()
    assert status == 0 and "Traceback" not in log, log[-3000:]
    doc = read_json(tmp_path / "dial.json")
    turn_block = doc["agent"]["identity"]["engines"]["turn"]
    assert turn_block["mode"] == "smart" and turn_block["model"]["class"] == "LocalSmartTurnAnalyzerV3"
    assert turn_block["smart_silence_ms"] == turnmod.SMART_SILENCE_MS
    assert doc["agent"]["identity"]["engines"]["llm"]["max_tokens"] == REPLY_TOKENS
    assert len(doc["turns"]) == TURNS
    for row in doc["turns"]:
        # answered: the reply heard after the line. Its gap is measured unless the dialer ran a tick late near the
        # line's end or the reply's start (LATE_TICK_RULE: a loaded machine; CI saw a 165 ms stall of the whole
        # dialer process there), which nulls the gap with its reason; what this test is about, the turn's end, holds
        assert row["heard"]["first_sound_ms"] is not None, (row, doc["unknown"])
        assert row["heard"]["gap_ms"] is not None or row["heard"]["late_tick"] is True, (row, doc["unknown"])
        assert row["agent_breakdown"] is not None and row["agent_breakdown"]["endpoint_wait"] > 0, row
    spans = [span for name in doc["files"]["otlp"]
             for span in otlp.flatten(otlp.decode_request((tmp_path / name).read_bytes(), otlp.PROTOBUF), 0, 0.0)]
    turns = [s for s in spans if s.name == "invoke_agent"]
    assert len(turns) >= TURNS
    for span in turns:
        a = span.attributes
        assert a["voice_llm.turn.mode"] == "smart", a
        assert a["voice_llm.turn.rule"] in (turnmod.RULE_COMPLETE, turnmod.RULE_FALLBACK), a
        if a["voice_llm.turn.rule"] == turnmod.RULE_COMPLETE:
            assert a["voice_llm.smart_turn.probability"] > 0.5 and a["voice_llm.smart_turn.inference_ms"] > 0
            assert a["voice_llm.turn.silence_ms"] >= turnmod.SMART_SILENCE_MS
        else:
            assert a["voice_llm.turn.silence_ms"] >= turnmod.SMART_FALLBACK_MS
    assert log.count("turn smart ") >= TURNS, log[-3000:]
