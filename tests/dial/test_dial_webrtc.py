"""voice-llm as the caller on WebRTC (issue 40 item 2) against a fake agent on a real aiortc peer connection
(tests/dial/webrtcagent.py, answering /api/offer as pipecat's SmallWebRTC does): what was heard at the caller's ear
equals what the agent did, within the rules of the Twilio and PCM lines (tests/dial/test_dial_call.py) plus the
codec's own delay, which is the third party's (aiortc's Opus encoder and decoder, measured here on the agent's own
burst); the same dial.json contract with line.protocol "webrtc" and line.webrtc (codec as negotiated, RTP loss and
jitter as received); each bad agent one clear line with the partial call kept, within the deadline.

One call serves the relations (module fixture, about 4 s of real time): 3 tone lines; the agent answers each after a
known delay, paced in real time as a WebRTC sender is, silence between replies (pipecat's auto-silence); the caller
cuts into reply 2 with line 3 and the agent stops sending (WebRTC has no clear).

Each leg is measured from the side that did it (tests/truth.py), the dialer's receive path by a spy on its
playout buffer: the agent's silence keeps that buffer playing, so a reply waits for what is buffered ahead of it,
the jitter delay while packets come steadily, more after a stall of the receive path brought a burst of them (seen
on a loaded machine: 100 ms ahead, where a test assuming 40 failed). A late tick nulls a turn's gap with its reason.
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
from test_dial_call import fast_options  # noqa: E402
from truth import (EPS_MS, FRAME_MS, JITTER_MS, assert_heard_as_it_happened, check_holds, dialled,  # noqa: E402
                   heard_arrival, measured_turns, receiving, slack)
from webrtcagent import RATE, WebRtcAgent  # noqa: E402

from voice_llm.core.checks.base import NotCheckable  # noqa: E402
from voice_llm.cli.main import main  # noqa: E402
from voice_llm.capabilities.dial import checks  # noqa: E402
from voice_llm.capabilities.dial.call import DialError  # noqa: E402
from voice_llm.capabilities.dial.step import DialOptions, dial_step  # noqa: E402
from voice_llm.core.errors import ConfigError  # noqa: E402
from voice_llm.core.util.artifacts import read_json  # noqa: E402

LINE_MS = 200.0  # 40 ms lead + 200 ms: a line ends on a frame's end, as the Twilio test's lines do
REPLIES = [Reply(150, 400), Reply(200, 1200), Reply(120, 300)]
# slack (test_dial_call's): the event loops' slack and how late the dialer's ticks ran, either side of the rules here
# (a tick up to a frame late pops audio that arrived after its nominal time: heard sooner after its arrival than the
# jitter delay, by as much as the tick was late; check_clears allows the same)


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
def call(tmp_path_factory: pytest.TempPathFactory):  # (dial.json, the agent, the folder, the receive path's log)
    def attempt(_: int):
        out = tmp_path_factory.mktemp("webrtc")
        with WebRtcAgent(REPLIES) as agent, receiving() as received:
            dial_step(context(out), webrtc_options(), agent.url, caller=tones(3, LINE_MS, rate=RATE))
        return read_json(out / "dial.json"), agent, out, received.read(out)

    return dialled(attempt, lambda result: result[0])


def events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "dial" / "events.jsonl").read_text().splitlines()]


def agent_behind_frames(agent: WebRtcAgent) -> int:
    """How many frames the agent's sender ran behind its own pace at most (its log: each frame handed to the
    encoder against 20 ms after the one before it, from its first)."""
    first = agent.handed[0][0]
    return max(0, max(round((t - first) * 1000.0 / FRAME_MS) - i for i, (t, _) in enumerate(agent.handed)))


def uplink_wait_ms(doc: dict, rows: list[dict], turn: dict) -> float:
    """How long after the caller's speech end the dialer sent the frame holding it (its own log): the frame leaves
    once its audio was spoken, never before."""
    frame = int(turn["caller"]["speech_end_ms"] // FRAME_MS - 1e-9)  # the frame holding the last sample of speech
    sent = next(r["t_ms"] for r in rows if r.get("dir") == "up" and r["event"] == "media" and r["frame"] == frame)
    return sent - turn["caller"]["speech_end_ms"]


def test_heard_gaps_are_the_agents_delays_plus_the_jitter_buffer_and_the_codec(call):
    doc, agent, out, received = call
    onset, _ = opus_delays(doc["floor"]["heard"])
    rows = events(out)
    assert [s.turn for s in agent.sent] == [1, 2, 3]
    measured = measured_turns(doc, after_barge_in=True)
    for index in measured:
        turn, sent = doc["turns"][index], agent.sent[index]
        # as on a WebSocket (test_dial_call): heard gap = the agent's delay + what the ear had ahead of the reply
        # (the jitter delay while packets come steadily), within one frame and never less; on WebRTC plus the
        # codec's delay (its lookahead: the sound comes out later) and the line's transit both ways (Opus encode,
        # SRTP, loopback UDP, decode), each measured
        leg = assert_heard_as_it_happened(doc, turn, sent, received)
        assert abs(leg.onset - onset) <= 3.0 or leg.onset == 0.0, (leg, onset)  # its first frame: the codec's onset
        # The caller's frame leaves when its audio has ended (never before the speech end), within a frame and the
        # dialer's lateness; the codec's delay (6.5 ms) carries a line that ends on a frame's end into the next
        # frame as the agent decodes it: the agent hears the end after that frame left
        wait = uplink_wait_ms(doc, rows, turn)
        assert 0 <= wait <= FRAME_MS + slack(doc) and leg.heard_by_agent >= wait, (wait, leg)
    assert doc["summary"]["heard_gap_ms"]["n"] == len(measured)


def test_a_reply_is_first_heard_the_jitter_delay_after_its_first_packet_arrived(call):
    """The agent's own clock against the call's: its first reply frame went to the encoder at ``sent`` and arrived
    (decoded) some ms later; the ear plays it after what it had ahead of it (the jitter delay while packets come
    steadily: rounded up to a frame), plus the codec's delay inside the frame, nothing of it earlier."""
    doc, agent, _, received = call
    onset, _ = opus_delays(doc["floor"]["heard"])
    for index in measured_turns(doc, after_barge_in=True):
        turn, sent = doc["turns"][index], agent.sent[index]
        floor = doc["floor"]["heard"]
        arrival = heard_arrival(doc, turn, sent, received)  # played where the first sound is, to the sample
        assert arrival.t_ms >= received.call_ms(sent.sent) - EPS_MS  # received after it was sent (the shared clock)
        if arrival is received.first_loud(received.call_ms(sent.sent), floor):  # its first frame: the codec's onset
            assert abs(arrival.loud_offset_ms(floor) - onset) <= 3.0, (arrival.loud_offset_ms(floor), onset)
        after = turn["heard"]["first_sound_ms"] - arrival.t_ms
        ahead, inside = arrival.ahead_ms, arrival.loud_offset_ms(floor)
        assert ahead + inside - slack(doc) <= after <= ahead + inside + FRAME_MS + slack(doc), (index, after, ahead)


def test_a_burst_paced_in_real_time_is_heard_over_its_length(call):
    doc, _, _, _ = call
    onset, end = opus_delays(doc["floor"]["heard"])
    for index in {0, 2} & set(measured_turns(doc, after_barge_in=True)):  # replies 1 and 3 played to their end
        heard = doc["turns"][index]["heard"]
        length = heard["last_sound_ms"] - heard["first_sound_ms"]
        # within 3 ms: the codec's smear at a burst's edges varies by a few ms with its state
        assert abs(length - (REPLIES[index].burst_ms + end - onset)) <= 3.0, (index, length, onset, end)


def test_barge_in_is_heard_as_silence_once_the_agent_stopped_sending(call):
    """No clear on WebRTC: the agent stops sending when it hears the caller; the ear plays what had arrived (its
    last reply frame, through the jitter delay), then silence (the agent's silence frames)."""
    doc, agent, _, received = call
    barge = doc["turns"][1]["barge_in"]
    assert len(agent.stops) == 1 and barge["cleared_ms"] is None  # nothing to clear with: its reason stated
    assert any(key.startswith("turns[1].barge_in") for key in doc["unknown"]), doc["unknown"]
    floor = doc["floor"]["heard"]
    stop = received.call_ms(agent.stops[0])
    last_sent = received.call_ms(max(t for t, loud in agent.handed if loud and t <= agent.stops[0]))
    # the last loud audio the dialer received of reply 2: the agent's last reply frame, after it left
    loud = [a for a in received.arrivals if int(np.abs(a.samples.astype(np.int32)).max()) > floor]
    last = max((a for a in loud if a.t_ms < received.first_loud(received.call_ms(agent.sent[2].sent), floor).t_ms),
               key=lambda a: a.t_ms)
    assert last.t_ms >= last_sent - 3.0, (last, last_sent)
    # its audio's end: heard after what the ear had ahead of it, for a frame (the codec rings on into the next one),
    # then silence: on the recording exactly where the buffer played it, on the real clock what it had ahead of it
    # after its arrival, within a frame and the dialer's lateness
    tail = np.flatnonzero(np.abs(last.samples.astype(np.int32)) > floor)
    heard_end = last.position_ms + (tail[-1] + 1) * 1000.0 / RATE
    assert heard_end <= barge["heard_silent_ms"] <= heard_end + FRAME_MS, (barge, heard_end)
    expected = last.t_ms + last.ahead_ms + FRAME_MS
    assert expected - slack(doc) - FRAME_MS <= barge["heard_silent_ms"] <= expected + FRAME_MS + slack(doc), (barge, expected)
    assert barge["onset_ms"] <= stop  # the agent heard the caller after the caller spoke
    heard = doc["turns"][1]["heard"]
    assert heard["last_sound_ms"] - heard["first_sound_ms"] < REPLIES[1].burst_ms - 500


def test_dial_json_names_the_line_and_what_the_transport_adds(call):
    doc, agent, _, received = call
    line = doc["line"]
    assert (line["protocol"], line["codec"], line["rate"], line["frame_ms"]) == ("webrtc", "pcm16", 48000, 20)
    assert doc["agent"]["protocol"] == "webrtc" and doc["agent"]["url"] == agent.url
    assert doc["agent"]["headers"]["server"] == "webrtcagent"
    webrtc = line["webrtc"]
    assert webrtc["codec"]["name"] == "audio/opus" and webrtc["codec"]["clock_rate"] == 48000  # as negotiated
    assert webrtc["pc_id"].startswith("fake-")
    # the agent sends a packet every 20 ms from its start (silence when idle): about one a tick, none lost; as many
    # fewer as the agent's sender ran behind its pace at the end (a loaded machine: its own log)
    rtp = webrtc["rtp_received"]
    behind = agent_behind_frames(agent)
    assert rtp["lost"] == 0 and abs(rtp["packets"] - doc["playout"]["frames"]) <= 5 + behind, (rtp, behind)
    assert 0 <= rtp["jitter_ms"]
    # every packet decoded but those still in aiortc's decoder thread at the hang-up, each decoded frame went to the
    # ear but those still queued then (the dialer's receive path: its down media events)
    assert len(received.arrivals) <= webrtc["frames_decoded"] <= rtp["packets"], (len(received.arrivals), webrtc)
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
    _, _, out, _ = call
    for check in (checks.check_values, checks.check_files, checks.check_recording, checks.check_heard_gaps,
                  checks.check_barge_in, checks.check_schedule, checks.check_event_order, checks.check_uplink,
                  checks.check_summary, checks.check_real_time):
        check_holds(check, out)
    with pytest.raises(NotCheckable, match="no clear was received .* nothing heard before its arrival"):
        checks.check_clears(out)  # its first law holds; a WebRTC line has no clear to check
    rows = events(out)
    media = [row for row in rows if row.get("dir") == "up" and row["event"] == "media"]
    assert [row["frame"] for row in media] == list(range(len(media)))


def test_an_agent_that_sends_nothing_when_idle(tmp_path):
    """An agent that stops sending between replies (no silence frames): the buffer runs dry, the same ear."""
    with WebRtcAgent([Reply(150, 300)], mode="dtx") as agent, receiving() as received:
        dial_step(context(tmp_path), webrtc_options(barge_in_turns=()), agent.url, caller=tones(1, LINE_MS, rate=RATE))
    doc = read_json(tmp_path / "dial.json")
    received.read(tmp_path)
    if measured_turns(doc, at_least=0):  # its one turn, unless a late tick nulled it (with its reason)
        leg = assert_heard_as_it_happened(doc, doc["turns"][0], agent.sent[0], received)
        assert leg.ahead == JITTER_MS, leg  # nothing came before the reply: an idle buffer's jitter delay
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


def test_the_offer_asks_no_stun_server(tmp_path, monkeypatch):
    """Host candidates only: aiortc's default ICE server is Google's public STUN server, whose name the dialer would
    resolve before every offer (a resolver that does not answer holds the connect bound; the caller's address goes
    to a third party). Every name looked up while the offer is made is recorded: none is a STUN server's."""
    import socket

    looked_up: list[str] = []
    for name in ("getaddrinfo", "gethostbyname"):  # aioice resolves its STUN server with gethostbyname
        def spy(host, *args, _real=getattr(socket, name), **kwargs):
            looked_up.append(str(host))
            return _real(host, *args, **kwargs)

        monkeypatch.setattr(socket, name, spy)
    with WebRtcAgent(REPLIES, mode="http_error") as agent:
        failing(tmp_path, agent.url, "answered the WebRTC offer with HTTP 500")
        assert "typ srflx" not in agent.offers[0]["sdp"] and "a=candidate" in agent.offers[0]["sdp"]
    assert not [host for host in looked_up if "stun" in host], looked_up


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
    assert doc["line"]["protocol"] == "webrtc"
    measured_turns(doc, at_least=0)  # a gap each, but where a late tick nulled it (with its reason)
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
        check_holds(check, tmp_path)
