"""voice-llm as the caller on WebRTC (issue 40 item 2) against a fake agent on a real aiortc peer connection
(tests/dial/webrtcagent.py, answering /api/offer as pipecat's SmallWebRTC does): what was heard at the caller's ear
equals what the agent did, within the rules of the Twilio and PCM lines (tests/dial/test_dial_call.py) plus the
codec's own delay, which is the third party's (aiortc's Opus encoder and decoder, measured here on the agent's own
burst); the same dial.json contract with line.protocol "webrtc" and line.webrtc (codec as negotiated, RTP loss and
jitter as received); each bad agent one clear line with the partial call kept, within the deadline.

One call serves the relations (module fixture, about 4 s of real time): 3 tone lines; the agent answers each after a
known delay, paced in real time as a WebRTC sender is, silence between replies (pipecat's auto-silence); the caller
cuts into reply 2 with line 3 and the agent stops sending (WebRTC has no clear).
"""

from __future__ import annotations

import fractions
import json
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("aiortc")

from dialhelpers import context, tones  # noqa: E402
from fakeagent import Reply, square  # noqa: E402
from fakeserver import free_port  # noqa: E402
from test_dial_call import EPS_MS, FRAME_MS, JITTER_MS, fast_options, slack  # noqa: E402
from webrtcagent import RATE, WebRtcAgent  # noqa: E402

from voice_llm.core.checks.base import NotCheckable  # noqa: E402
from voice_llm.cli.main import main  # noqa: E402
from voice_llm.capabilities.dial import checks  # noqa: E402
from voice_llm.capabilities.dial.call import DialError  # noqa: E402
from voice_llm.capabilities.dial.step import DialOptions, dial_step  # noqa: E402
from voice_llm.core.errors import ConfigError  # noqa: E402
from voice_llm.core.util.artifacts import read_json  # noqa: E402
from voice_llm.core.util.clocks import epoch_ns_of  # noqa: E402

LINE_MS = 200.0  # 40 ms lead + 200 ms: a line ends on a frame's end, as the Twilio test's lines do
REPLIES = [Reply(150, 400), Reply(200, 1200), Reply(120, 300)]
# slack (test_dial_call's): the event loops' slack and how late the dialer's ticks ran, either side of the rules here
# (a tick up to a frame late pops audio that arrived after its nominal time: heard sooner after its arrival than the
# jitter delay, by as much as the tick was late; check_clears allows the same)


def call_ms(doc: dict, perf: float) -> float:
    """An instant of the agent's (perf_counter, this process) on the call clock (dial.json t0_epoch_ns)."""
    return (epoch_ns_of(perf) - doc["t0_epoch_ns"]) / 1e6


def opus_delays(floor: int, burst_ms: float = 400.0) -> tuple[float, float]:
    """aiortc's Opus (its encoder and decoder classes, as both peers run them) on the agent's burst in 20 ms frames:
    how much later its first sample above ``floor`` comes out than it went in, and its last."""
    from aiortc.codecs.opus import OpusDecoder, OpusEncoder
    from aiortc.jitterbuffer import JitterFrame
    from av import AudioFrame

    lead = 960  # from a frame's start, as the agent's replies
    signal = np.zeros(RATE, np.int16)
    burst = square(burst_ms, RATE)
    signal[lead:lead + len(burst)] = burst
    encoder, decoder, out = OpusEncoder(), OpusDecoder(), []
    for k in range(len(signal) // 960):
        frame = AudioFrame.from_ndarray(signal[k * 960:(k + 1) * 960].reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = RATE, k * 960, fractions.Fraction(1, RATE)
        payloads, timestamp = encoder.encode(frame)
        for payload in payloads:
            for decoded in decoder.decode(JitterFrame(payload, timestamp)):
                out.append(decoded.to_ndarray().reshape(-1, 2)[:, 0])  # packed stereo: one channel
    loud = np.flatnonzero(np.abs(np.concatenate(out).astype(np.int32)) > floor)
    return (loud[0] - lead) * 1000.0 / RATE, (loud[-1] + 1 - lead - len(burst)) * 1000.0 / RATE


def webrtc_options(**extra: object) -> DialOptions:
    """test_dial_call's call (3 lines, a barge-in on turn 2, short waits) on a WebRTC line."""
    return fast_options(protocol="webrtc", **extra)


@pytest.fixture(scope="module")
def call(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, WebRtcAgent, Path]:
    out = tmp_path_factory.mktemp("webrtc")
    with WebRtcAgent(REPLIES) as agent:
        dial_step(context(out), webrtc_options(), agent.url, caller=tones(3, LINE_MS, rate=RATE))
    return read_json(out / "dial.json"), agent, out


def arrival_ms(rows: list[dict], agent: WebRtcAgent, left: float) -> float:
    """When the dialer received (decoded) the agent's frame that went to the agent's encoder at ``left``
    (perf_counter): its n-th frame is the n-th the dialer received, one packet each, none lost on loopback."""
    downs = [r["t_ms"] for r in rows if r.get("dir") == "down" and r["event"] == "media"]
    assert len(agent.handed) - 2 <= len(downs) <= len(agent.handed)
    return downs[[t for t, _ in agent.handed].index(left)]


def transit_ms(doc: dict, rows: list[dict], sent, agent: WebRtcAgent) -> tuple[float, float, float]:
    """The line's own times, from the two sides' clocks: how long after the caller's speech end the frame the agent
    last heard loud was sent (the event log), and each way's transit: that frame from its sending to the agent
    hearing it decoded, the agent's first reply frame from its encoder to the dialer's receipt of it decoded (Opus
    encode, SRTP, loopback UDP, decode: a few ms a way; ~0 on a local WebSocket)."""
    heard_at = call_ms(doc, sent.last_loud)
    up = max(r["t_ms"] for r in rows if r.get("dir") == "up" and r["event"] == "media" and r["t_ms"] <= heard_at)
    turn = doc["turns"][sent.turn - 1]
    return up - turn["caller"]["speech_end_ms"], heard_at - up, arrival_ms(rows, agent, sent.sent) - call_ms(doc, sent.sent)


def events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "dial" / "events.jsonl").read_text().splitlines()]


def test_heard_gaps_are_the_agents_delays_plus_the_jitter_buffer_and_the_codec(call):
    doc, agent, out = call
    onset, _ = opus_delays(doc["floor"]["heard"])
    rows = events(out)
    assert [s.turn for s in agent.sent] == [1, 2, 3]
    for turn, sent in zip(doc["turns"], agent.sent):
        # as on a WebSocket (test_dial_call): heard gap = the agent's delay + the phone's jitter delay, within one
        # frame and never less; on WebRTC plus the codec's delay (its lookahead: the sound comes out later) and the
        # line's transit both ways, each measured
        # The caller's frame leaves when its audio has ended (never before the speech end); the codec's delay
        # (6.5 ms) carries a line that ends on a frame's end into the next frame as the agent decodes it
        wait, up, down = transit_ms(doc, rows, sent, agent)
        assert 0 <= wait <= 2 * FRAME_MS + slack(doc) and 0 <= up < 10.0 and 0 <= down < 10.0, (wait, up, down)
        expected = wait + up + sent.delay_ms + down + JITTER_MS + onset
        assert abs(turn["heard"]["gap_ms"] - expected) <= FRAME_MS + slack(doc), (turn["index"], turn["heard"],
                                                                                   expected)
        assert turn["heard"]["gap_ms"] >= expected - slack(doc), (turn["index"], turn["heard"], expected)
    assert doc["summary"]["heard_gap_ms"]["n"] == 3


def test_a_reply_is_first_heard_the_jitter_delay_after_its_first_packet_arrived(call):
    """The agent's own clock against the call's: its first reply frame went to the encoder at ``sent`` and arrived
    (decoded) a few ms later; the ear plays it the jitter delay (rounded up to a frame) after it arrived, plus the
    codec's delay inside the frame, nothing of it earlier."""
    doc, agent, out = call
    onset, _ = opus_delays(doc["floor"]["heard"])
    rows = events(out)
    for turn, sent in zip(doc["turns"], agent.sent):
        _, _, down = transit_ms(doc, rows, sent, agent)
        after = turn["heard"]["first_sound_ms"] - (call_ms(doc, sent.sent) + down)
        assert JITTER_MS + onset - slack(doc) <= after <= JITTER_MS + onset + FRAME_MS + slack(doc), (turn["index"], after)


def test_a_burst_paced_in_real_time_is_heard_over_its_length(call):
    doc, _, _ = call
    onset, end = opus_delays(doc["floor"]["heard"])
    for index in (0, 2):  # replies 1 and 3 played to their end
        heard = doc["turns"][index]["heard"]
        length = heard["last_sound_ms"] - heard["first_sound_ms"]
        # within 3 ms: the codec's smear at a burst's edges varies by a few ms with its state
        assert abs(length - (REPLIES[index].burst_ms + end - onset)) <= 3.0, (index, length, onset, end)


def test_barge_in_is_heard_as_silence_once_the_agent_stopped_sending(call):
    """No clear on WebRTC: the agent stops sending when it hears the caller; the ear plays what had arrived (its
    last reply frame, through the jitter delay), then silence (the agent's silence frames)."""
    doc, agent, out = call
    barge = doc["turns"][1]["barge_in"]
    assert len(agent.stops) == 1 and barge["cleared_ms"] is None  # nothing to clear with: its reason stated
    assert any(key.startswith("turns[1].barge_in") for key in doc["unknown"]), doc["unknown"]
    _, end = opus_delays(doc["floor"]["heard"])
    stop = agent.stops[0]
    last = max(t for t, loud in agent.handed if loud and t <= stop)  # the last reply frame the agent sent
    # its audio's end: it arrived (decoded) a few ms after it left, is heard the jitter delay after that (rounded up
    # to a frame) for a frame, and the codec rings on after it
    expected = arrival_ms(events(out), agent, last) + FRAME_MS + JITTER_MS + end
    assert expected - slack(doc) <= barge["heard_silent_ms"] <= expected + FRAME_MS + slack(doc), (barge, expected)
    assert barge["onset_ms"] <= call_ms(doc, stop)  # the agent heard the caller after the caller spoke
    heard = doc["turns"][1]["heard"]
    assert heard["last_sound_ms"] - heard["first_sound_ms"] < REPLIES[1].burst_ms - 500


def test_dial_json_names_the_line_and_what_the_transport_adds(call):
    doc, agent, _ = call
    line = doc["line"]
    assert (line["protocol"], line["codec"], line["rate"], line["frame_ms"]) == ("webrtc", "pcm16", 48000, 20)
    assert doc["agent"]["protocol"] == "webrtc" and doc["agent"]["url"] == agent.url
    assert doc["agent"]["headers"]["server"] == "webrtcagent"
    webrtc = line["webrtc"]
    assert webrtc["codec"]["name"] == "audio/opus" and webrtc["codec"]["clock_rate"] == 48000  # as negotiated
    assert webrtc["pc_id"].startswith("fake-")
    # the agent sends a packet every 20 ms from its start (silence when idle): about one a tick, none lost
    received = webrtc["rtp_received"]
    assert received["lost"] == 0 and abs(received["packets"] - doc["playout"]["frames"]) <= 5, received
    assert 0 <= received["jitter_ms"] < 20.0
    # every packet decoded (the last may still have been in aiortc's decoder thread at the hang-up)
    assert received["packets"] - 2 <= webrtc["frames_decoded"] <= received["packets"]
    # every uplink frame went to the encoder (the last one, at the hang-up, may not have left before the close)
    assert doc["playout"]["frames"] - 1 <= webrtc["frames_encoded"] <= doc["playout"]["frames"]
    assert webrtc["rtp_sent"]["packets"] >= webrtc["frames_encoded"] - 1
    assert any(item.startswith("marks") for item in webrtc["not_on_this_line"])
    assert any(item.startswith("clear") for item in webrtc["not_on_this_line"])
    # the call's stream id went to the agent in the offer's request_data (its spans are attributed by it)
    assert agent.offers[0]["request_data"]["stream_sid"] == line["stream_sid"]
    assert agent.offers[0]["type"] == "offer" and "a=candidate" in agent.offers[0]["sdp"]  # no trickle ICE
    assert doc["playout"]["marks_returned"] == 0 and doc["playout"]["clears"] == 0


def test_the_checks_hold_on_a_webrtc_call(call):
    _, _, out = call
    for check in (checks.check_values, checks.check_files, checks.check_recording, checks.check_heard_gaps,
                  checks.check_barge_in, checks.check_schedule, checks.check_event_order, checks.check_uplink,
                  checks.check_summary, checks.check_real_time):
        check(out)
    with pytest.raises(NotCheckable, match="no clear was received .* nothing heard before its arrival"):
        checks.check_clears(out)  # its first law holds; a WebRTC line has no clear to check
    rows = events(out)
    media = [row for row in rows if row.get("dir") == "up" and row["event"] == "media"]
    assert [row["frame"] for row in media] == list(range(len(media)))


def test_an_agent_that_sends_nothing_when_idle(tmp_path):
    """An agent that stops sending between replies (no silence frames): the buffer runs dry, the same ear."""
    with WebRtcAgent([Reply(150, 300)], mode="dtx") as agent:
        dial_step(context(tmp_path), webrtc_options(barge_in_turns=()), agent.url, caller=tones(1, LINE_MS, rate=RATE))
    doc = read_json(tmp_path / "dial.json")
    onset, _ = opus_delays(doc["floor"]["heard"])
    wait, up, down = transit_ms(doc, events(tmp_path), agent.sent[0], agent)
    expected = wait + up + agent.sent[0].delay_ms + down + JITTER_MS + onset
    assert expected - slack(doc) <= doc["turns"][0]["heard"]["gap_ms"] <= expected + FRAME_MS + slack(doc)
    assert doc["line"]["webrtc"]["rtp_received"]["packets"] < doc["playout"]["frames"] // 2
    assert doc["playout"]["underruns"] >= 1


# --- bad agents: one clear line, the partial call kept, within the deadline ------------------------------------


def failing(out: Path, url: str, *needles: str, **extra: object) -> tuple[dict, float]:
    options = webrtc_options(barge_in_turns=(), deadline_s=3.0, **extra)
    started = time.perf_counter()
    with pytest.raises(DialError) as caught:
        dial_step(context(out), options, url, caller=tones(1, LINE_MS, rate=RATE))
    elapsed = time.perf_counter() - started
    message = str(caught.value)
    assert "\n" not in message and "dial-partial.json" in message, message
    for needle in needles:
        assert needle in message, message
    doc = read_json(out / "dial-partial.json")
    assert not (out / "dial.json").exists() and (out / "dial" / "partial-call.wav").is_file()
    assert doc["line"]["protocol"] == "webrtc" and needles[0] in doc["error"]
    return doc, elapsed


@pytest.mark.parametrize(("mode", "needle"), [
    ("http_error", "answered the WebRTC offer with HTTP 500"),
    ("not_json", "the answer to the WebRTC offer is not JSON"),
    ("bad_sdp", "the agent's SDP answer was refused"),
    ("no_audio", "the agent's answer has no two-way audio"),
])
def test_a_bad_answer_to_the_offer(tmp_path, mode, needle):
    with WebRtcAgent(REPLIES, mode=mode) as agent:
        doc, elapsed = failing(tmp_path, agent.url, needle)
    assert doc["playout"]["frames"] == 0 and elapsed < 3.0


def test_an_agent_that_never_answers_the_offer(tmp_path):
    with WebRtcAgent(REPLIES, mode="hang") as agent:
        doc, elapsed = failing(tmp_path, agent.url, "no answer to the WebRTC offer within 3 s")
    assert elapsed < 3.0 + 3.0 and doc["playout"]["frames"] == 0


def test_an_agent_that_never_replies(tmp_path):
    with WebRtcAgent(REPLIES, mode="silent") as agent:
        doc, elapsed = failing(tmp_path, agent.url, "no reply within 0.5 s in turn 1", reply_wait_s=0.5)
    assert elapsed < 3.0 and doc["turns"][0]["heard"]["first_sound_ms"] is None


def test_an_agent_that_hangs_up_mid_call(tmp_path):
    with WebRtcAgent(REPLIES, mode="hangup", close_after=8) as agent:
        doc, _ = failing(tmp_path, agent.url, "the agent hung up mid-call", "turn 1", "WebRTC")
    assert doc["playout"]["frames"] >= 8


def test_nothing_answers_the_offer(tmp_path):
    failing(tmp_path, f"http://127.0.0.1:{free_port()}/api/offer", "nothing answers the WebRTC offer at")


def test_cli_a_bad_answer_is_one_line_without_a_traceback(tmp_path, capsys):
    from dialhelpers import write_tone_wavs

    with WebRtcAgent(REPLIES, mode="http_error") as agent:
        status = main(["dial", agent.url, "--protocol", "webrtc", "--out", str(tmp_path / "out"), "--caller-audio",
                       str(write_tone_wavs(tmp_path / "wavs", 1)), "--turns", "1", "--barge-in-turns", "none",
                       "--stt", "none", "--deadline", "3", "--quiet"])
    err = capsys.readouterr().err
    assert status == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "HTTP 500" in err and read_json(tmp_path / "out" / "dial-partial.json")["playout"]["frames"] == 0


def test_the_url_and_flags_a_webrtc_line_takes():
    with pytest.raises(ConfigError, match="offer URL, http://HOST:PORT/api/offer"):
        DialOptions(url="ws://127.0.0.1:9/", protocol="webrtc")
    with pytest.raises(ConfigError, match="is for --protocol webrtc"):
        DialOptions(url="http://127.0.0.1:9/api/offer")
    with pytest.raises(ConfigError, match="Opus .as negotiated."):
        DialOptions(url="http://127.0.0.1:9/api/offer", protocol="webrtc", rate=16000)
    DialOptions(url="http://127.0.0.1:9/api/offer", protocol="webrtc")


def test_without_the_extra_one_line_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    from voice_llm.capabilities.dial import webrtc

    monkeypatch.setattr(webrtc, "available", lambda: False)
    status = main(["dial", "http://127.0.0.1:9/api/offer", "--protocol", "webrtc", "--out", str(tmp_path / "out"),
                   "--stt", "none", "--quiet"])
    err = capsys.readouterr().err
    assert status != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "pip install 'voice-llm[webrtc]'" in err and not (tmp_path / "out" / "dial-partial.json").exists()


def test_cli_dial_then_check_on_webrtc(tmp_path, capsys):
    """The command as a user runs it (the caller's own 16 kHz WAVs, put on the 48 kHz line), then `voice-llm check`
    on what it wrote: every law of the files holds on a WebRTC call."""
    from dialhelpers import write_tone_wavs

    out = tmp_path / "out"
    with WebRtcAgent([Reply(150, 300), Reply(150, 300)]) as agent:
        status = main(["dial", agent.url, "--protocol", "webrtc", "--out", str(out), "--caller-audio",
                       str(write_tone_wavs(tmp_path / "wavs", 2)), "--turns", "2", "--barge-in-turns", "none",
                       "--stt", "none", "--deadline", "10", "--reply-end-ms", "300", "--think-ms", "100", "--quiet"])
    assert status == 0, capsys.readouterr().err
    doc = read_json(out / "dial.json")
    assert doc["line"]["protocol"] == "webrtc" and all(t["heard"]["gap_ms"] is not None for t in doc["turns"])
    assert main(["check", str(out)]) == 0, capsys.readouterr().out


def test_line_conditions_on_webrtc(tmp_path):
    """--loss and --echo-db apply on WebRTC as on every line (the decoded audio down, the caller's frames up): lost
    uplink frames are logged in their place and never reach the encoder; lost downlink audio never reaches the ear;
    the checks hold the files to it."""
    with WebRtcAgent([Reply(150, 600)]) as agent:
        dial_step(context(tmp_path), webrtc_options(barge_in_turns=(), loss_pct=20.0, seed=3, echo_db=-20.0),
                  agent.url, caller=tones(1, LINE_MS, rate=RATE))
    doc = read_json(tmp_path / "dial.json")
    line = doc["line"]
    assert line["lost_up_frames"] > 0 and line["lost_down_frames"] > 0 and line["echo_db"] == -20.0
    assert line["webrtc"]["frames_encoded"] <= doc["playout"]["frames"] - line["lost_up_frames"]
    for check in (checks.check_values, checks.check_uplink, checks.check_heard_gaps, checks.check_recording):
        check(tmp_path)
