"""Which pauses a preemptive reply should start in (issue 39 item 3): the speculative transcripts of real pauses.

The agent's ``--preemptive`` reply starts from the speculative decode of the utterance at the VAD's speech end (the
first silent frame) when that decode is ready before the endpoint. A pause that does not become the endpoint (the
caller goes on) drops it, and a dropped request still holds a 1-slot server's only slot (benchmarks/cancel_probe.py).
This replays the caller lines as the agent hears them, with no server and no clock: each line spoken by Piper as
`voice-llm dial` speaks it (the clinic lines, the pause lines, the load lines), through the Twilio line (8 kHz
mu-law, back to 16 kHz), 1.5 s of silence after it; Silero and the agent's endpointer (300 ms) frame by frame; at
each speech end the utterance so far decoded by Moonshine (1 thread, as the agent). Each pause is one row: its
transcript, its length in frames (until speech resumed or the endpoint), and whether it became the endpoint.

Then each gate (voice_llm.capabilities.agent.preemptive) is scored on those rows: the pauses it lets a preemptive
reply start in that end the turn (kept: the head start the caller hears) and those that do not (wasted: a request
dropped on the slot).

    python benchmarks/preemptive_gate.py --json benchmarks/results/<folder>/gate.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np

from voice_llm.capabilities.agent import preemptive
from voice_llm.capabilities.dial.caller_lines import LOAD_LINES, PAUSE_LINES, on_line, synthesize_lines, \
    synthesize_paused
from voice_llm.core.scenario.dialogue import load_dialogue
from voice_llm.engines.audio.resampling import Resampler
from voice_llm.engines.line import wire
from voice_llm.engines.speech_in import vad as vadmod
from voice_llm.engines.speech_in.caller_audio import FRAME_SAMPLES, SAMPLE_RATE
from voice_llm.engines.speech_in.stt import load_transcriber

TAIL_S = 1.5
PRE_ROLL_FRAMES = 5  # as the agent (voice_llm.capabilities.agent.server)


def pauses_of(samples16: np.ndarray, vad: Any, stt: Any, endpoint_ms: float) -> list[dict[str, Any]]:
    """Every pause of one line as the agent sees it (the agent's framing and utterance buffer)."""
    endpointer = vadmod.Endpointer(endpoint_ms)
    frames = [samples16[i:i + FRAME_SAMPLES] for i in range(0, len(samples16) - FRAME_SAMPLES + 1, FRAME_SAMPLES)]
    utterance: list[np.ndarray] | None = None
    recent: list[np.ndarray] = []
    rows: list[dict[str, Any]] = []
    open_row: dict[str, Any] | None = None
    for index, frame in enumerate(frames):
        events = endpointer.push(vad(frame.astype("<i2").tobytes()))
        if utterance is not None:
            utterance.append(frame)
        recent = (recent + [frame])[-PRE_ROLL_FRAMES:]
        for event in events:
            if event.kind == vadmod.SPEECH_START:
                utterance = list(recent)
            elif event.kind == vadmod.SPEECH_END and utterance:
                start = time.perf_counter()
                text = stt.transcribe(np.concatenate(utterance), "")
                open_row = {"frame": index, "transcript": text, "decode_ms": round((time.perf_counter() - start)
                                                                                   * 1000, 1)}
            elif event.kind in (vadmod.RESUMED, vadmod.ENDPOINT) and open_row is not None:
                open_row["pause_frames"] = index - open_row["frame"]
                open_row["endpoint"] = event.kind == vadmod.ENDPOINT
                rows.append(open_row)
                open_row = None
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint-ms", type=float, default=300.0)
    parser.add_argument("--json", default=None)
    options = parser.parse_args()
    line = wire.twilio_line()
    clinic = list(load_dialogue("clinic").turns)
    sets: list[tuple[str, list[Any]]] = []
    utterances, _ = synthesize_lines(clinic)
    sets.append(("clinic", utterances))
    paused, _, _ = synthesize_paused(PAUSE_LINES)
    sets.append(("pause", paused))
    loads, _ = synthesize_lines(list(LOAD_LINES))
    sets.append(("load", loads))
    vad = vadmod.SileroVAD()
    stt = load_transcriber("moonshine", 1)
    rows: list[dict[str, Any]] = []
    for name, items in sets:
        for utterance in items:
            sent = on_line(utterance, line).samples
            sent = np.concatenate([sent, np.zeros(int(TAIL_S * line.rate), np.int16)])
            resampler = Resampler(line.rate, SAMPLE_RATE)
            samples16 = np.concatenate([resampler.push(sent), resampler.flush()])
            vad = vadmod.SileroVAD()  # one per call in the agent: a fresh state per line
            for row in pauses_of(samples16, vad, stt, options.endpoint_ms):
                row.update({"lines": name, "line": utterance.index, "script": utterance.script})
                rows.append(row)
                print(json.dumps(row), flush=True)
    gates = {}
    for gate_name, gate in preemptive.STUDIED_GATES.items():
        kept = [r for r in rows if r["endpoint"] and gate(r["transcript"])]
        wasted = [r for r in rows if not r["endpoint"] and gate(r["transcript"])]
        ends = sum(1 for r in rows if r["endpoint"])
        gates[gate_name] = {"endpoints_kept": len(kept), "endpoints": ends,
                            "pauses_started_not_endpoint": len(wasted),
                            "pauses_not_endpoint": sum(1 for r in rows if not r["endpoint"]),
                            "missed": [r["transcript"] for r in rows if r["endpoint"] and not gate(r["transcript"])],
                            "wasted": [r["transcript"] for r in wasted]}
        print(gate_name, json.dumps({k: v for k, v in gates[gate_name].items()}), flush=True)
    if options.json:
        with open(options.json, "w") as f:
            json.dump({"settings": {"endpoint_ms": options.endpoint_ms, "tail_s": TAIL_S, "stt": "moonshine 1 thread",
                                    "line": "twilio 8 kHz mu-law"},
                       "loadavg": os.getloadavg(), "gates": gates, "pauses": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
