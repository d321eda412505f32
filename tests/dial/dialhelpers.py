"""Caller lines made of tones (no Piper) and a context to run the dial step in (no LLM server)."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

from voice_llm.core.client.api import ServerClient
from voice_llm.capabilities.dial.call import CallLog, CallSettings, TurnLog
from voice_llm.capabilities.dial.caller_lines import CallerLine
from voice_llm.capabilities.dial.measure import caller_sound
from voice_llm.capabilities.dial.step import Caller, _Unknown, measure_turns
from voice_llm.core.run.context import LabContext, StepOptions
from voice_llm.engines.line import wire
from voice_llm.core.scenario.kb import default_kb_dir


def tone_line(index: int, ms: float, rate: int, lead_ms: float = 40.0, amplitude: int = 8000) -> CallerLine:
    lead = np.zeros(int(lead_ms * rate / 1000), np.int16)
    n = int(ms * rate / 1000)
    period = rate // 250
    body = np.where((np.arange(n) // (period // 2)) % 2 == 0, amplitude, -amplitude).astype(np.int16)
    line = wire.twilio_line() if rate == wire.TWILIO_RATE else wire.pcm_line(rate)
    samples = wire.decode(line, wire.encode(line, np.concatenate([lead, body])))
    floor, (start, end) = caller_sound(samples, rate, line.frame_samples)  # the dialer's rule
    return CallerLine(index, f"tone {index}", samples, rate, "test tone", None, floor, start, end)


def tones(count: int, ms: float = 200.0, rate: int = wire.TWILIO_RATE) -> Caller:
    return Caller(tuple(tone_line(i, ms, rate) for i in range(1, count + 1)), None, "test tones", "clinic")


def context(out: Path) -> LabContext:
    return LabContext(out=out, client=ServerClient("http://127.0.0.1:1"), kb_dir=default_kb_dir(),
                      options=StepOptions())


def write_tone_wavs(folder: Path, count: int, ms: float = 200.0) -> Path:
    """--caller-audio: 16 kHz mono tone bursts as WAVs (speech.caller.load_folder takes them as they are)."""
    folder.mkdir(parents=True, exist_ok=True)
    rate = 16000
    n = int(ms * rate / 1000)
    for i in range(1, count + 1):
        body = np.where((np.arange(n) // 32) % 2 == 0, 8000, -8000).astype("<i2")
        with wave.open(str(folder / f"turn-{i:02d}.wav"), "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(rate)
            wav.writeframes(body.tobytes())
    return folder


def a_log(lines: list[CallerLine], offsets: list[int], right: np.ndarray, barged: tuple[int, ...] = ()) -> CallLog:
    """A call as the dialer would have left it: the lines at their frame offsets on the left, ``right`` heard."""
    total = len(right)
    frame = wire.twilio_line().frame_samples
    left = np.zeros(total, np.int16)
    for line, tick in zip(lines, offsets):
        left[tick * frame:tick * frame + len(line.samples)] = line.samples
    log = CallLog(CallSettings("ws://fake/", wire.twilio_line()), lines)
    log.turns = [TurnLog(line.index, tick, barged=line.index in barged) for line, tick in zip(lines, offsets)]
    log.left = [left[k:k + frame] for k in range(0, total, frame)]
    log.right = [right[k:k + frame] for k in range(0, total, frame)]
    return log


def measured(log: CallLog) -> tuple[list[dict], dict[str, str]]:
    unknown = _Unknown()
    return measure_turns(log, None, unknown, "not transcribed"), unknown.reasons
