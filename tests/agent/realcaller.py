"""A small real-time Twilio caller for the agent's slow tests (the real dialer is voice_llm.dial): 20 ms ticks on
absolute deadlines, the caller's lines sent as mu-law media, the agent's audio played out by a minimal phone's ear
(a buffer drained one frame per tick, marks echoed when the audio before them has played, ``clear`` empties it and
returns the pending marks), the heard channel kept frame by frame. Heard gap per turn = first heard frame above
the floor after the caller's speech end - that speech end, both on this caller's clock.

Runnable: ``python tests/agent/realcaller.py ws://127.0.0.1:18300/ [--barge 2]`` prints one JSON document.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from voice_llm.line import wire
from voice_llm.scenario.dialogue import load_dialogue

FRAME = 160  # 20 ms at 8 kHz
FLOOR = 100  # speech.caller.FLOOR_MIN: a frame is sound when its peak is above it
JITTER_FRAMES = 2  # 40 ms: playout starts two frames after audio arrives at an idle buffer
END_SILENCE_FRAMES = 35  # the reply is over after 700 ms of heard silence
THINK_FRAMES = 15


@dataclass
class Ear:
    buffer: list[np.ndarray] = field(default_factory=list)
    marks: list[tuple[int, str]] = field(default_factory=list)  # (samples ahead of it when queued, name)
    buffered: int = 0
    wait: int = 0
    playing: bool = False

    def push(self, samples: np.ndarray) -> None:
        if not self.playing and not self.buffered:
            self.wait = JITTER_FRAMES
        self.buffer.append(samples)
        self.buffered += len(samples)

    def mark(self, name: str) -> None:
        self.marks.append((self.buffered, name))

    def clear(self) -> list[str]:
        self.buffer, self.buffered, self.playing = [], 0, False
        names = [n for _, n in self.marks]
        self.marks = []
        return names

    def pop(self) -> tuple[np.ndarray, list[str]]:
        if self.wait > 0 or not self.buffered:
            self.wait = max(0, self.wait - 1)
            self.playing = False
            done = [n for ahead, n in self.marks if ahead <= 0]
            self.marks = [(a, n) for a, n in self.marks if a > 0]
            return np.zeros(FRAME, np.int16), done
        self.playing = True
        data = np.concatenate(self.buffer)
        frame, rest = data[:FRAME], data[FRAME:]
        self.buffer = [rest] if len(rest) else []
        taken = len(frame)
        self.buffered -= taken
        self.marks = [(a - taken, n) for a, n in self.marks]
        done = [n for a, n in self.marks if a <= 0]
        self.marks = [(a, n) for a, n in self.marks if a > 0]
        out = np.zeros(FRAME, np.int16)
        out[:taken] = frame
        return out, done


def caller_lines(turns: int) -> list[tuple[str, np.ndarray]]:
    """The clinic's caller lines, synthesized with Piper and resampled to 8 kHz."""
    from voice_llm.agent.audio import Resampler
    from voice_llm.tts import load_engine

    engine = load_engine()
    out = []
    for text in load_dialogue().turns[:turns]:
        pcm = b"".join(c.pcm for c in engine.synthesize(text))
        samples = Resampler(engine.sample_rate, 8000)
        line = np.concatenate([samples.push(np.frombuffer(pcm, "<i2")), samples.flush()])
        out.append((text, line))
    return out


def call(url: str, lines: list[tuple[str, np.ndarray]], barge: int | None = None, barge_after_ms: int = 500,
         reply_wait_s: float = 60.0) -> dict[str, Any]:
    from websockets.sync.client import connect

    line = wire.twilio_line()
    ear = Ear()
    turns: list[dict[str, Any]] = []
    heard_frames: list[np.ndarray] = []
    with connect(url, max_queue=None) as ws:
        seq = 0

        def send(text: str) -> None:
            ws.send(text)
        seq += 1
        send(wire.connected())
        send(wire.start(seq, "MZreal", "CAreal", "ACreal"))
        t0 = time.perf_counter()
        t0_epoch_ns = time.time_ns()
        k = 0
        late = 0
        current: list[np.ndarray] = []  # frames of the line being said
        index = 0
        next_start = 25  # turn 1 after 500 ms of silence
        silent = 0
        sounded = False
        clears = 0
        while index <= len(lines):
            due = t0 + k * 0.02
            now = time.perf_counter()
            if now < due:
                time.sleep(due - now)
            elif now - due > 0.02:
                late += 1
            if not current and index < len(lines) and k >= next_start:
                text, samples = lines[index]
                current = wire.frames(samples, FRAME)
                loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > FLOOR)
                turns.append({"index": index + 1, "script": text, "start_ms": k * 20 + loud[0] / 8.0,
                              "end_ms": k * 20 + (loud[-1] + 1) / 8.0, "first_sound_ms": None})
                index += 1
                sounded, silent = False, 0
                next_start = 1 << 40  # the next line waits for this one's reply
            up = current.pop(0) if current else np.zeros(FRAME, np.int16)
            seq += 1
            send(wire.caller_media(seq, "MZreal", k + 1, k * 20, wire.encode(line, up)))
            frame, done = ear.pop()
            heard_frames.append(frame)
            for name in done:
                seq += 1
                send(wire.mark_played(seq, "MZreal", name))
            loud = np.flatnonzero(np.abs(frame.astype(np.int32)) > FLOOR)
            turn = turns[-1] if turns else None
            if turn is not None and not current:
                if loud.size and turn["first_sound_ms"] is None and k * 20 >= turn["end_ms"]:
                    turn["first_sound_ms"] = k * 20 + loud[0] / 8.0
                    turn["gap_ms"] = turn["first_sound_ms"] - turn["end_ms"]
                if turn["first_sound_ms"] is not None:
                    sounded = sounded or bool(loud.size)
                    silent = 0 if loud.size else silent + 1
                    barge_due = barge == turn["index"] and k * 20 >= turn["first_sound_ms"] + barge_after_ms
                    if barge_due and index < len(lines):
                        next_start = k + 1
                        turn["barged_ms"] = (k + 1) * 20
                    elif silent >= END_SILENCE_FRAMES and not ear.buffered:
                        if index >= len(lines):
                            break
                        next_start = k + THINK_FRAMES
                elif k * 20 - turn["end_ms"] > reply_wait_s * 1000:
                    raise RuntimeError(f"no reply within {reply_wait_s:.0f} s in turn {turn['index']}")
            while True:
                try:
                    message = ws.recv(timeout=0)
                except TimeoutError:
                    break
                event = json.loads(message)
                if event["event"] == "media":
                    ear.push(wire.decode(line, base64.b64decode(event["media"]["payload"])))
                elif event["event"] == "mark":
                    ear.mark(event["mark"]["name"])
                elif event["event"] == "clear":
                    clears += 1
                    if turns:
                        turns[-1].setdefault("cleared_ms", k * 20)
                    for name in ear.clear():
                        seq += 1
                        send(wire.mark_played(seq, "MZreal", name))
            k += 1
        seq += 1
        send(wire.stop(seq, "MZreal", "CAreal", "ACreal"))
    return {"turns": turns, "frames": k, "late_frames": late, "clears": clears, "t0_perf": t0, "t0_epoch_ns": t0_epoch_ns}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--barge", type=int, default=None)
    args = parser.parse_args()
    print(json.dumps(call(args.url, caller_lines(args.turns), args.barge), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
