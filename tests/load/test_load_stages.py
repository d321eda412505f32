"""Dialing callers' saturating stage (load --dial --otlp-listen): the agent's spans matched to the calls by their
streamSid, the median of each stage per step, the stage that grew most from the first step, its verdict line, the
checks; on made-up samples and spans, and once through the agent's real span export into the run's receiver."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from voice_llm.capabilities.dial.otlp import Span
from voice_llm.core.errors import ConfigError
from voice_llm.capabilities.load import CAPABILITY as LOAD_CAPABILITY
from voice_llm.capabilities.load import checks, cli, stages, stats
from voice_llm.capabilities.load.document import load_document, sweep_document
from voice_llm.capabilities.load.plan import SweepPlan
from voice_llm.capabilities.load.run import dial_caller
from voice_llm.capabilities.load.samples import read_samples, write_samples
from voice_llm.capabilities.load.settings import LoadSettings

SLO = 1500.0
T0_NS = 1_700_000_000 * 10**9  # a call's sample 0 (epoch ns)
BASE = {"endpoint_wait": 300.0, "stt": 200.0, "handoff": 2.0, "request_to_first_token": 150.0,
        "first_token_to_first_segment": 80.0, "segment_to_first_audio": 120.0, "audio_to_sent": 1.0}


def _span(sid: str | None, end_ms: float, parts: dict[str, float], *, t0: int = T0_NS, trace: str = "t1",
          name: str = "invoke_agent", span_id: str = "s") -> Span:
    attributes = {"voice_llm.latency.reported_ms": sum(parts.values()),
                  **{f"voice_llm.breakdown.{k}_ms": v for k, v in parts.items()}}
    if sid is not None:
        attributes[stages.STREAM_SID] = sid
    end_ns = t0 + int(end_ms * 1e6)
    return Span(trace, span_id, None, name, end_ns - 10**9, end_ns, attributes, "voice-llm", 1,
                arrival_ms=end_ns / 1e6 + 5.0)  # arrived 5 ms after it ended, in epoch ms (the run's receiver)


def _row(step: int, sid: str, turn: int, end_ms: float, gap: float, **extra: object) -> dict:
    row = {name: None for name in stats.SAMPLE_FIELDS}
    row.update({"step": step, "callers": step + 1, "phase": "measure", "worker": "w1", "caller": "w1/1",
                "call": turn, "turn": turn, "start": 105.0 + 100 * step + turn, "error": None, "cancelled": False,
                "tokens": 0, "refused": False, "barge_in": False, "call_frames": 1000, "late_frames": 0,
                "heard_gap_ms": gap, "speech_end_ms": end_ms, "first_sound_ms": end_ms + gap,
                "stream_sid": sid, "t0_epoch_ns": T0_NS, **extra})
    row.pop("slots")
    return row


def test_spans_go_to_their_call_by_stream_sid_and_to_its_turns_by_speech_end() -> None:
    rows = [_row(0, "MZa", 1, 3000.0, 900.0), _row(0, "MZa", 2, 9000.0, 950.0), _row(0, "MZb", 1, 3000.0, 800.0)]
    slow = {**BASE, "stt": 700.0}
    spans = [_span("MZa", 9800.0, slow, span_id="a2"), _span("MZa", 3900.0, BASE, span_id="a1"),
             # call b's span has no sid of its own: its trace's call span names the call
             _span(None, 3700.0, {**BASE, "stt": 400.0}, trace="tb", span_id="b1"),
             Span("tb", "call", None, "voice_llm.call", T0_NS, T0_NS + 10**10, {stages.STREAM_SID: "MZb"}, None, 2,
                  T0_NS / 1e6 + 10_005.0),
             _span(None, 3900.0, {**BASE, "stt": 5000.0}, trace="nobody", span_id="x"),  # names no call: left out
             _span("MZzz", 3900.0, {**BASE, "stt": 5000.0}, span_id="y")]  # a call no sample is of
    attached = stages.attach(rows, spans)
    assert (attached.calls, attached.turns, attached.without_sid) == (2, 3, 1)
    assert [r["agent_stt_ms"] for r in rows] == [200.0, 700.0, 400.0]
    assert rows[1]["agent_reported_ms"] == sum(slow.values())
    assert all(r[stats.stage_column(s)] == BASE[s] for r in rows for s in stats.AGENT_STAGES if s != "stt")


def _steps(stt_per_step: list[float], gaps: list[float]) -> list[dict]:
    steps = []
    for index, (stt, gap) in enumerate(zip(stt_per_step, gaps)):
        rows = [_row(index, f"MZ{index}-{n}", 1, 3000.0, gap, **{stats.stage_column(s): v for s, v in
                                                              {**BASE, "stt": stt + n}.items()}) for n in range(20)]
        summary = stats.summarize_step(rows, SLO, 60.0, stats.DIAL_METRIC)
        steps.append({"callers": index + 1, "generator_bound": False, **summary})
    return steps


def test_the_stage_that_grew_most_is_named_at_the_first_step_past_the_verdict() -> None:
    steps = _steps([200.0, 260.0, 1100.0], [900.0, 1000.0, 2500.0])
    # medians over the step's 20 turns (stt + 0..19), by the one median rule (util.stats.median)
    assert steps[0]["agent_stages_ms"]["stt"] == 210.0 and steps[0]["agent_stage_turns"] == 20
    growth = stats.stage_growth(steps)
    assert growth["from_callers"] == 1 and [r["grew_most"] for r in growth["steps"]] == ["stt", "stt"]
    assert growth["steps"][1]["growth_ms"]["stt"] == 900.0 and growth["steps"][1]["growth_ms"]["handoff"] == 0.0
    verdict = stats.verdict(steps, None, early=True)
    assert verdict["max_callers"] == 2 and verdict["limited_by"] == "agent"
    assert verdict["saturating_stage"] == {"stage": "stt", "callers": 3, "growth_ms": 900.0, "from_callers": 1}
    line = cli.verdict_line({"mode": "dial", "slo_heard_ms": SLO, "step_s": 60.0},
                            {"url": "ws://a/", "slots": None, "steps": steps, "verdict": verdict})
    assert "limited by agent: STT at 3 callers (+900 ms median from 1 caller)" in line
    # growth within STAGE_GROWTH_MIN_MS names no stage; no spans at all: nothing to compare
    assert stats.verdict(_steps([200.0, 230.0], [900.0, 2500.0]), None, early=True)["saturating_stage"] is None
    # max callers = 0 (the 1-caller step failed) in a --no-stop sweep: the last timed step names the stage
    failing = _steps([200.0, 260.0, 1100.0], [2500.0, 2600.0, 2700.0])
    zero = stats.verdict(failing, None, early=True)
    assert zero["max_callers"] == 0
    assert zero["saturating_stage"] == {"stage": "stt", "callers": 3, "growth_ms": 900.0, "from_callers": 1}
    one = stats.verdict(failing[:1], None, early=True)
    assert one["saturating_stage"] is None  # one step: nothing grew
    # ... but the verdict line still names the stage that takes most of the gap at 1 caller
    assert stats.largest_stage(failing[0]) == {"stage": "endpoint_wait", "ms": BASE["endpoint_wait"], "callers": 1}
    slow_stt = _steps([1100.0], [2500.0])
    assert stats.largest_stage(slow_stt[0]) == {"stage": "stt", "ms": 1110.0, "callers": 1}
    line = cli.verdict_line({"mode": "dial", "slo_heard_ms": SLO, "step_s": 60.0},
                            {"url": "ws://a/", "slots": None, "steps": slow_stt,
                             "verdict": stats.verdict(slow_stt, None, early=True)})
    assert "max callers = 0" in line and "at 1 caller the agent's largest stage: STT 1110 ms median of a 2500 ms" in line
    bare = [{**s, "agent_stage_turns": 0} for s in steps]
    assert stats.largest_stage(bare[0]) is None
    assert stats.stage_growth(bare) is None and stats.verdict(bare, None, early=True)["saturating_stage"] is None


def _fake_run(tmp_path: Path) -> Path:
    caller, dial, _ = dial_caller(LoadSettings(dial="ws://127.0.0.1:9/"))
    plan = SweepPlan(caller=caller, callers=(1, 2), step_s=10.0, dial=dial)
    rows = [_row(0, "MZa", 1, 3000.0, 900.0), _row(0, "MZa", 2, 9000.0, 1000.0), _row(1, "MZb", 1, 3000.0, 1900.0)]
    spans = [_span("MZa", 3900.0, BASE, span_id="1"), _span("MZa", 9900.0, BASE, span_id="2"),
             _span("MZb", 4800.0, {**BASE, "request_to_first_token": 900.0}, span_id="3")]
    attached = stages.attach(rows, spans)
    result = {"started": 0.0, "ended": 300.0, "workers": ["w1"], "stopped": None, "samples": rows,
              "steps": [{"step": i, "callers": i + 1, "window": {"start": 100.0 + 100 * i, "end": 130.0 + 100 * i,
                         "drain_s": 0.5}, "cpu": {}, "generator_bound": False,
                         "host": {"cpu_busy": 0.5, "loadavg_1m": 1.0, "master_cpu_s": 0.1}} for i in range(2)]}
    sweep, samples = sweep_document(plan, result, None, dial.url)
    settings = LoadSettings(dial=dial.url, step_s=10.0, warmup_s=5.0, callers=(1, 2), stop_on_budget=False,
                            otlp_listen="127.0.0.1:4318")
    described = {"mode": "dial", "agent_spans": stages.block("127.0.0.1:4318", None, [attached])}
    (tmp_path / "load.json").write_text(json.dumps(load_document(settings, described, [sweep])))
    write_samples(tmp_path / "load_samples.csv", samples)
    return tmp_path


def test_a_run_with_stage_times_passes_its_checks_and_tampered_stages_fail(tmp_path: Path) -> None:
    out = _fake_run(tmp_path)
    doc = json.loads((out / "load.json").read_text())
    assert doc["load_schema_version"] == 5 and doc["caller"]["agent_spans"]["turns_matched"] == 3
    first, second = doc["sweeps"][0]["steps"]
    assert first["agent_stages_ms"]["request_to_first_token"] == 150.0
    assert second["agent_stages_ms"]["request_to_first_token"] == 900.0
    # 1 judged turn at 2 callers: no verdict, but the stage that grew most is still said (the last step's)
    assert doc["sweeps"][0]["verdict"]["saturating_stage"]["stage"] == "request_to_first_token"
    assert read_samples(out / "load_samples.csv")[0]["agent_stt_ms"] == 200.0  # the CSV keeps them, as numbers
    for entry in LOAD_CAPABILITY.checks:
        assert entry.run(out), entry.name
    second["agent_stages_ms"]["stt"] = 1.0
    (out / "load.json").write_text(json.dumps(doc))
    with pytest.raises(checks.CheckFailed, match="agent_stages_ms"):
        checks.check_load_matches_samples(out)
    second["agent_stages_ms"]["stt"] = 200.0
    doc["sweeps"][0]["verdict"]["saturating_stage"]["stage"] = "stt"
    (out / "load.json").write_text(json.dumps(doc))
    with pytest.raises(checks.CheckFailed, match="verdict"):
        checks.check_load_verdict(out)


def test_the_agents_own_span_export_reaches_the_runs_receiver_with_its_stream_sid() -> None:
    """The agent's SpanExport (agent/otel.py) into load's one receiver: the turn span carries the call's streamSid
    and its breakdown, and attach puts it on that call's turn."""
    from voice_llm.capabilities.agent.otel import Clock, SpanExport

    receiver = stages.start_receiver("127.0.0.1:0")
    try:
        host, port = receiver.address
        export = SpanExport(f"http://{host}:{port}", Clock(), {"service.name": "voice-llm-agent"})
        now = time.perf_counter() - 2.0  # the turn ended a second ago (a span is sent after it ends)
        call = export.start_call(now, {"voice_llm.call.number": 1})
        call.set_attribute(stages.STREAM_SID, "MZreal")  # what the agent's server does on `start`
        events = {"vad_speech_end": now + 0.1, "first_audio_sent": now + 0.9}
        export.turn(call, {"events": events, "span_start": now + 0.1, "span_end": now + 1.0, "end_reason": "completed",
                           "number": 1, "reported_ms": 800.0, "breakdown": BASE})
        assert export.flush()
        t0 = export.clock.epoch_ns(now)
        spans = receiver.spans()
    finally:
        export.shutdown()
        receiver.stop()
    (turn,) = [s for s in spans if s.name == "invoke_agent"]
    assert turn.attributes[stages.STREAM_SID] == "MZreal"
    row = _row(0, "MZreal", 1, 50.0, 900.0, t0_epoch_ns=t0)
    assert stages.attach([row], spans).turns == 1
    assert row["agent_stt_ms"] == 200.0 and row["agent_reported_ms"] == 800.0


def test_otlp_listen_is_refused_in_one_line_when_it_cannot_listen() -> None:
    with pytest.raises(ConfigError, match="--otlp-listen takes HOST:PORT"):
        stages.start_receiver("nowhere")
    taken = stages.start_receiver("127.0.0.1:0")
    try:
        with pytest.raises(ConfigError, match="cannot listen there"):
            stages.start_receiver(f"127.0.0.1:{taken.address[1]}")
    finally:
        taken.stop()


def test_the_report_draws_the_stages_per_step(tmp_path: Path) -> None:
    from voice_llm.capabilities.load import report

    doc = json.loads((_fake_run(tmp_path) / "load.json").read_text())
    fig, caption, extra = report.load_chart(doc)
    assert len(fig.axes) == 2 and "the agent's stage that grew most: LLM first token at 2 callers (+750 ms)" in caption
    assert 'class="load-stages"' in extra and "(+750)" in extra
    stages_fig, why = report.stages_chart(doc)  # its own chart, with its own caption
    (ax,) = stages_fig.axes
    assert "stage medians" in ax.get_ylabel() and "grew most: LLM first token (+750 ms at 2 callers)" in ax.get_title()
    assert "LLM first token grew most, by 750 ms at 2 callers" in why and "Why it matters" in why
    page = report.load_section(doc)
    assert page.count('<figure class="chart"') == 2 and 'id="chart-loadstages"' in page
    assert page.index('id="chart-loadstages"') < page.index('class="load-stages"') < page.index("</section>")
    # a verdict of 0 with nothing grown names the first step's largest stage (its 1 caller misses the SLO)
    zero = json.loads(json.dumps(doc))
    zero["sweeps"][0]["verdict"].update(max_callers=0, saturating_stage=None)
    _, caption, _ = report.load_chart(zero)
    assert "max callers = 0" in caption and "at 1 caller the agent's largest stage: end-of-turn wait" in caption
    # no spans: one chart, no stage table
    for step in doc["sweeps"][0]["steps"]:
        step["agent_stage_turns"] = 0
    doc["sweeps"][0]["verdict"]["saturating_stage"] = None
    fig, _, extra = report.load_chart(doc)
    assert report.stages_chart(doc) is None and "load-stages" not in extra
    assert report.load_section(doc).count('<figure class="chart"') == 1


def test_a_calls_samples_carry_its_stream_sid_clock_and_its_own_breakdown(tmp_path: Path) -> None:
    from voice_llm.capabilities.dial.doc import (AgentReported, DialDoc, Files, Floor, Heard, Line, Playout, Settings, Turn,
                                    TurnCaller)
    from voice_llm.capabilities.load import dialing

    turn = Turn(index=1, script="hi", caller_wav="dial/caller-01.wav",
                caller=TurnCaller(offset_ms=2000.0, speech_start_ms=2200.0, speech_end_ms=3000.0),
                heard=Heard(first_sound_ms=3900.0, gap_ms=900.0), agent_reported=AgentReported(latency_ms=700.0),
                agent_breakdown=BASE)
    later = replace(turn, index=2, agent_breakdown=None,
                    caller=TurnCaller(offset_ms=8000.0, speech_start_ms=8200.0, speech_end_ms=9000.0))
    doc = DialDoc(t0_epoch_ns=T0_NS, turns=(turn, later), playout=Playout(frames=500, late_frames=0),
                  line=Line(protocol="twilio", codec="mulaw", rate=8000, frame_ms=20.0, jitter_ms=40.0,
                            stream_sid="MZone"),
                  floor=Floor(caller=100, heard=100), settings=Settings(turns=2), files=Files())
    (tmp_path / "dial.json").write_text(json.dumps(doc.as_dict()))
    rows = dialing.call_samples(tmp_path, 0, "", dialing.CallId("w", "w/1", 1, T0_NS / 1e9), dialing.PhaseClock())
    assert [(r["stream_sid"], r["t0_epoch_ns"]) for r in rows] == [("MZone", T0_NS)] * 2
    assert rows[0]["agent_stt_ms"] == 200.0 and rows[1]["agent_stt_ms"] is None
    # spans received by the run's receiver fill only the turn that has none (the call's own came first)
    spans = [_span("MZone", 3800.0, {**BASE, "stt": 999.0}, span_id="1"),
             _span("MZone", 9900.0, {**BASE, "stt": 300.0}, span_id="2")]
    assert stages.attach(rows, spans).turns == 1 and [r["agent_stt_ms"] for r in rows] == [200.0, 300.0]


def test_a_dialing_sweeps_report_opens_with_its_first_steps_heard_gap(tmp_path: Path) -> None:
    """The caller's number of a load --dial run: its first step's heard p50/p90 (load's ``headline`` hook), not
    "not measured"; a text sweep has no caller's ear and says so; a broken load.json is one line, no traceback."""
    from voice_llm.core.analysis.keynumbers import headline
    from voice_llm.core.util.stats import median

    out = _fake_run(tmp_path)
    doc = json.loads((out / "load.json").read_text())
    first = doc["sweeps"][0]["steps"][0]
    assert first["callers"] == 1 and first["heard_gap_ms"]["p50"] == median([900.0, 1000.0])
    found = headline(out)
    assert (found.source, found.median_ms, found.p90_ms) == ("load.json", first["heard_gap_ms"]["p50"],
                                                              first["heard_gap_ms"]["p90"])
    assert found.sentence().startswith(f"The caller hears the assistant {first['heard_gap_ms']['p50']:.0f} ms after")
    assert "at 1 caller, over 2 judged turns of the dialing sweep" in found.sentence()
    # a first step that heard nothing: the next one's
    doc["sweeps"][0]["steps"][0]["heard_gap_ms"] = {"p50": None, "p90": None, "p99": None}
    (out / "load.json").write_text(json.dumps(doc))
    assert "at 2 callers" in headline(out).sentence()
    doc["mode"] = "text"
    (out / "load.json").write_text(json.dumps(doc))
    assert headline(out).median_ms is None and "was not measured in this run" in headline(out).sentence()
    (out / "load.json").write_text("{")
    broken = headline(out)
    assert broken.median_ms is None and broken.sentence().startswith("The caller's number (mouth to ear) cannot be read")
