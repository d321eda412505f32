"""A long caller turn inside a real call (issue 39 item 2: "with Moonshine the cost grows with the utterance: long
turns must not starve the line (measure a 15 s caller line)").

    nice -n 5 python benchmarks/long_turn.py [--port 18495] [--out benchmarks/results/long-turn]

One real call against `voice-llm agent` (the defaults: Moonshine tiny, speculative STT, the echo gate) on the
managed llama-server of the default model (`voice-llm up --port PORT`, stopped at the end): three caller turns
spoken by the dialer's own caller voice (Piper, the clinic call's settings), given to `voice-llm dial` as the
user's own recordings (`--caller-audio DIR`, one WAV per turn, `script.txt` beside them, no barge-in):
1. a short question ("Do you take Medicare?", about 1.5 s), the control;
2. the six clinic lines joined into one turn with Piper's own pauses between sentences (about 15-18 s);
3. the same short question again, right after the long turn.

What "starving the line" would look like, each read from the files of the call: the agent's own stages for the long
turn against the short ones (its endpoint wait: the VAD and the endpoint run in the agent's event loop beside the
decode; its STT on the critical path: the part of the decode left after the endpoint), the heard gap of each
turn, the dialer's late ticks and the heard channel's underruns during the agent's replies. Nothing is asserted:
the table is printed and written to --out as JSON and Markdown, with the load average at the start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import wave
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import line_matrix  # noqa: E402  (a sibling script, not a package)

from voice_llm.capabilities.dial.caller_lines import synthesize_lines  # noqa: E402
from voice_llm.core.scenario.dialogue import load_dialogue  # noqa: E402
from voice_llm.engines.speech_in.caller_audio import SAMPLE_RATE  # noqa: E402

SHORT = "Do you take Medicare?"


def write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(samples.astype("<i2").tobytes())


def longest_pause_ms(samples: np.ndarray, rate: int, floor: int = 200) -> float:
    """The longest run of samples below ``floor`` between the first and the last sound: the pause the agent's
    endpoint must not end the turn in."""
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > floor)
    if len(loud) < 2:
        return 0.0
    return float(np.diff(loud).max() - 1) * 1000.0 / rate


MAX_PAUSE_MS = 150.0  # the long turn's pauses between sentences, at most: under the agent's 300 ms endpoint, so
# the whole text is one turn (Piper pauses ~370 ms after a sentence; a caller reading on pauses less)


def shorten_pauses(samples: np.ndarray, rate: int, max_ms: float = MAX_PAUSE_MS, floor: int = 200) -> np.ndarray:
    """``samples`` with every quiet run (below ``floor``) between two sounds cut to ``max_ms``."""
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > floor)
    if len(loud) < 2:
        return samples
    keep = round(max_ms * rate / 1000)
    pieces, at = [], 0
    for a, b in zip(loud[:-1], loud[1:]):
        if b - a - 1 > keep:
            pieces.append(samples[at:a + 1 + keep // 2])
            at = b - (keep - keep // 2)
    pieces.append(samples[at:])
    return np.concatenate(pieces)


def caller_folder(folder: Path) -> dict[str, Any]:
    """The three turns as WAVs (16 kHz, the caller voice's) and script.txt; what each holds."""
    long_text = " ".join(load_dialogue("clinic").turns)
    utterances, _ = synthesize_lines([SHORT, long_text, SHORT])
    lines = []
    for n, utterance in enumerate(utterances, 1):
        samples = shorten_pauses(utterance.samples, SAMPLE_RATE) if n == 2 else utterance.samples
        write_wav(folder / f"turn-{n}.wav", samples, SAMPLE_RATE)
        lines.append({"turn": n, "text": utterance.script, "seconds": round(len(samples) / SAMPLE_RATE, 2),
                      "longest_pause_ms": round(longest_pause_ms(samples, SAMPLE_RATE), 1)})
    (folder / "script.txt").write_text("\n".join(u.script or "" for u in utterances) + "\n")
    return {"lines": lines}


def breakdown_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for turn in doc.get("turns") or []:
        parts = turn.get("agent_breakdown") or {}
        heard = turn.get("heard") or {}
        rows.append({"turn": turn.get("index"), "heard_gap_ms": heard.get("gap_ms"),
                     "agent_reported_ms": (turn.get("agent_reported") or {}).get("latency_ms"),
                     "endpoint_wait_ms": parts.get("endpoint_wait"), "stt_ms": parts.get("stt"),
                     "first_token_ms": parts.get("request_to_first_token"),
                     "wer": turn.get("wer"), "late_tick": heard.get("late_tick"),
                     "talked_over": heard.get("talked_over")})
    return rows


def markdown(result: dict[str, Any]) -> str:
    fmt = line_matrix.fmt
    out = ["| turn | caller line (s) | longest pause inside (ms) | heard gap (ms) | agent's own (ms) | endpoint wait "
           "(ms) | STT after the endpoint (ms) | first token (ms) | word errors |", "|---|---|---|---|---|---|---|---|---|"]
    for line, row in zip(result["caller"]["lines"], result["turns"]):
        wer = row.get("wer") or {}
        out.append(f"| {row['turn']} | {line['seconds']} | {line['longest_pause_ms']} | {fmt(row['heard_gap_ms'])} | "
                   f"{fmt(row['agent_reported_ms'])} | {fmt(row['endpoint_wait_ms'])} | {fmt(row['stt_ms'])} | "
                   f"{fmt(row['first_token_ms'])} | {wer.get('errors')}/{wer.get('words')} |")
    call = result["call"]
    out.append("")
    out.append(f"Late frames {fmt(call.get('late_frames'))} of the call's; heard underruns "
               f"{fmt(result.get('underruns'))}; load {call.get('load_start')} -> {call.get('load_end')}.")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=18495, help="the managed llama-server's port")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "long-turn")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="long-turn-"))
    audio = work / "caller"
    audio.mkdir()
    caller = caller_folder(audio)
    print(json.dumps(caller["lines"]), file=sys.stderr)
    url = f"http://127.0.0.1:{args.port}"
    result: dict[str, Any] = {"schema_version": 1, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "cpus": os.cpu_count(), "load_before": list(os.getloadavg()), "caller": caller,
                              "folder": str(work)}
    line_matrix.voice_llm("up", "--port", str(args.port))
    try:
        otlp_port = line_matrix.free_port()
        agent = line_matrix.Agent("builtin", "silence", url, otlp_port, work)
        try:
            call = line_matrix.dial(agent, otlp_port, work / "call", "clean",
                                    ["--caller-audio", str(audio), "--barge-in-turns", "none"])
        finally:
            agent.stop()
    finally:
        line_matrix.voice_llm("down", "--port", str(args.port), check=False)
    result["call"] = call
    doc = json.loads(Path(call["dial_json"]).read_text()) if call.get("dial_json") else {}
    result["turns"] = breakdown_rows(doc)
    result["underruns"] = (doc.get("playout") or {}).get("underruns")
    result["load_after"] = list(os.getloadavg())
    (args.out / "long-turn.json").write_text(json.dumps(result, indent=1) + "\n")
    md = markdown(result)
    (args.out / "long-turn.md").write_text(md)
    print(md)
    return 0 if call.get("exit") == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
