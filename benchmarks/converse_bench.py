"""The converse pipeline's own cost per turn: everything that is neither VAD compute, STT compute, the server nor
synthesis.

    python benchmarks/converse_bench.py [OUT] [--turns N] [--rounds N] [--json]

1. **Replay, without the LLM** (no server, no STT, no synthesis). The caller turns of ``OUT/converse`` (the
   caller-NN.wav files at their caller_offset_ms) or, without OUT, the clinic dialogue's caller lines synthesized
   as the step does (Piper, voice_llm.speech.caller) are fed through the loop's own frame path as fast as the
   CPU allows, the path the live loop runs once per 32 ms frame: the frame cut from the caller's line
   (CallerLine.frame), kept for the utterance buffer, its Silero probability (computed once before: VAD compute
   is measured apart and excluded), the endpointer (Endpointer.push). At each endpoint, the turn's own work
   before and around STT: the utterance buffer concatenated, a worker thread started (the loop hands STT to a
   thread: the hand-off until the worker runs is timed), the STT stand-in (--stt none's: the script), the
   messages built (history + transcript); then the turn's breakdown and gap from its events (step.breakdown).
   Printed per frame (median, p99), per turn (all of its frames + the endpoint work) and on the gap's critical
   path (only the frames from the caller's true end to the endpoint, + the endpoint work): the part of the
   caller's silence that is the pipeline's own bookkeeping.
2. **Live, from OUT/converse.json**: the hand-offs the call itself measured inside the gap, which no engine
   computes: committed -> STT started (thread hand-off), transcript -> request sent (history, request body),
   first audio -> playback start (the player). Their sum per turn is the pipeline's own share of the live gap
   (with whatever the shared CPU added to it).

3. **The matrix** (``--matrix --url URL``, a running llama-server): the converse step itself for endpoint
   200/300/500 ms x strategy whole/sentences/clauses x preemptive off/on, each call in OUT/matrix/<setting>/
   (converse.json, call.wav: `voice-llm check` applies), printed as mouth-to-ear median and p90, time saved and
   tokens wasted with --preemptive, next to the floor of that setting on this machine: the endpoint as it fired
   (endpoint - true end, median) + STT of each utterance alone + a cached first token alone + the first
   segment's synthesis alone (each measured after the calls, the CPU otherwise idle).

    python benchmarks/converse_bench.py OUT --matrix --url http://127.0.0.1:8080 [--turns N]

Nothing is asserted; the numbers are printed (and with --json as JSON) for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from voice_llm.util.artifacts import inside, read_artifact_bytes, read_json
from voice_llm.speech import caller as callermod
from voice_llm.converse.voice import synthesize_lines
from voice_llm.speech import vad as vadmod
from voice_llm.speech.caller import FRAME_SAMPLES, SAMPLE_RATE
from voice_llm.converse.checks import ARTIFACT
from voice_llm.converse.frames import CallerLine
from voice_llm.converse.step import breakdown
from voice_llm.scenario.dialogue import DEFAULT_DIALOGUE, load_dialogue
from voice_llm.util.stats import percentile

GAP_TAIL_FRAMES = 30  # frames fed after the endpoint before the next turn: the line is idle while the reply plays


def spread(values: Sequence[float], digits: int = 3) -> str:
    return (f"{statistics.median(values):.{digits}f} (p90 {percentile(values, 90):.{digits}f}, "
            f"max {max(values):.{digits}f})")


# --- the caller's turns ---------------------------------------------------------------------------------------


def _mono(path: Path) -> np.ndarray:
    import io
    import wave

    with wave.open(io.BytesIO(read_artifact_bytes(path)), "rb") as wav:
        return np.frombuffer(wav.readframes(wav.getnframes()), "<i2").copy()


def recorded_turns(out: Path) -> list[tuple[str, np.ndarray, float]]:
    """(script, samples, true end in samples from the WAV's start) of each turn of a converse run."""
    doc = read_json(out / ARTIFACT)
    turns = []
    for turn in doc["turns"]:
        samples = _mono(inside(out, turn["caller_wav"]))
        end = (turn["events"]["speech_end"] - turn["caller_offset_ms"]) * SAMPLE_RATE / 1000.0
        turns.append((turn["script"], samples, end))
    return turns


def synthesized_turns(count: int) -> list[tuple[str, np.ndarray, float]]:
    lines = load_dialogue(DEFAULT_DIALOGUE).turns[:count]
    utterances, _ = synthesize_lines(lines)
    return [(u.script, u.samples, float(u.end)) for u in utterances]


# --- replay ---------------------------------------------------------------------------------------------------


def _line(turns: Sequence[tuple[str, np.ndarray, float]]) -> tuple[CallerLine, list[int], int]:
    """The caller's line with each turn after the previous one's endpoint time (+ a reply's worth of silence)."""
    line = CallerLine()
    offsets, at = [], 0
    for _, samples, _ in turns:
        at = -(-at // FRAME_SAMPLES) * FRAME_SAMPLES
        line.schedule(at, samples)
        offsets.append(at)
        at += len(samples) + (GAP_TAIL_FRAMES + 12) * FRAME_SAMPLES
    return line, offsets, -(-at // FRAME_SAMPLES)


def vad_probabilities(line: CallerLine, frames: int) -> tuple[list[float], list[float]]:
    """Silero's probability of every frame of the line, and its compute time per frame (ms): excluded below."""
    vad = vadmod.SileroVAD()
    probabilities, costs = [], []
    for k in range(frames):
        data = line.frame(k).tobytes()
        t = time.perf_counter()
        probabilities.append(vad(data))
        costs.append((time.perf_counter() - t) * 1000.0)
    return probabilities, costs


def _handoff(samples: np.ndarray, script: str) -> tuple[float, str]:
    """Start the STT worker as the loop does (a thread) and return when it began running (perf_counter)."""
    started: dict[str, Any] = {}
    ready = threading.Event()

    def work() -> None:
        started["t"] = time.perf_counter()
        started["text"] = script  # --stt none: the script stands in for the transcript
        ready.set()

    threading.Thread(target=work, name="stt", daemon=True).start()
    ready.wait()
    return started["t"], started["text"]


def replay(turns: Sequence[tuple[str, np.ndarray, float]], probabilities: Sequence[float], line: CallerLine,
           offsets: Sequence[int], frames: int, endpoint_ms: float = vadmod.DEFAULT_ENDPOINT_MS) -> dict[str, Any]:
    """One pass over the line: per frame and per turn costs (ms) of the loop's own work."""
    endpointer = vadmod.Endpointer(endpoint_ms)
    kept: list[np.ndarray] = []
    buffer_start: int | None = None
    per_frame: list[float] = []
    frame_turn: list[int] = []
    endpoint_work: list[float] = []
    handoffs: list[float] = []
    history: list[dict[str, str]] = [{"role": "system", "content": "You are the clinic's receptionist."}]
    turn_of = 0
    events_per_turn: list[dict[str, float]] = []
    for k in range(frames):
        while turn_of + 1 < len(offsets) and offsets[turn_of + 1] <= k * FRAME_SAMPLES:
            turn_of += 1
        t0 = time.perf_counter()
        samples = line.frame(k)
        kept.append(samples)
        fired = endpointer.push(probabilities[k])
        t1 = time.perf_counter()
        per_frame.append((t1 - t0) * 1000.0)
        frame_turn.append(turn_of)
        for event in fired:
            if event.kind == vadmod.SPEECH_START and buffer_start is None:
                buffer_start = max(0, k - 5)
            elif event.kind == vadmod.ENDPOINT and buffer_start is not None:
                t2 = time.perf_counter()
                utterance = np.concatenate(kept[buffer_start:k + 1])
                began, transcript = _handoff(utterance, turns[turn_of][0])
                messages = [*history, {"role": "user", "content": transcript}]
                body = json.dumps({"messages": messages, "stream": True, "max_tokens": 48, "cache_prompt": True})
                end_ms = (offsets[turn_of] + turns[turn_of][2]) * 1000.0 / SAMPLE_RATE
                now = (k + 1) * FRAME_SAMPLES * 1000.0 / SAMPLE_RATE
                events = {"speech_end": end_ms, "turn_detected": now, "stt_end": now, "first_token": now + 80,
                          "first_segment_text": now + 180, "first_audio_ready": now + 270, "playback_start": now + 270}
                parts = breakdown(events)
                gap = events["playback_start"] - events["speech_end"]
                t3 = time.perf_counter()
                assert parts is not None and body
                endpoint_work.append((t3 - t2) * 1000.0)
                handoffs.append((began - t2) * 1000.0)
                history += [{"role": "user", "content": transcript}, {"role": "assistant", "content": "Sure."}]
                events_per_turn.append({"turn": turn_of, "work_ms": endpoint_work[-1], "gap_ms": gap,
                                        "endpoint_frame": k, "end_frame": int(end_ms * SAMPLE_RATE / 1000 // FRAME_SAMPLES)})
                buffer_start = None
    per_turn, critical = [], []
    for index in range(len(turns)):
        mine = [seen for seen in events_per_turn if seen["turn"] == index]
        if not mine:
            continue  # never endpointed (cannot happen with the caller's own turns; kept honest)
        work = sum(seen["work_ms"] for seen in mine)
        per_turn.append(sum(c for c, turn in zip(per_frame, frame_turn) if turn == index) + work)
        last = mine[-1]  # a pause inside the line may endpoint it twice: the last endpoint ends the turn
        critical.append(sum(per_frame[last["end_frame"]:last["endpoint_frame"] + 1]) + last["work_ms"])
    return {"per_frame_ms": per_frame, "endpoint_work_ms": endpoint_work, "thread_handoff_ms": handoffs,
            "per_turn_ms": per_turn, "critical_path_ms": critical, "endpoints": len(events_per_turn),
            "turns_endpointed": len({seen["turn"] for seen in events_per_turn})}


# --- live hand-offs ---------------------------------------------------------------------------------------------


def live_handoffs(out: Path) -> dict[str, list[float]]:
    """The hand-offs inside each turn's gap in a real call (ms)."""
    doc = read_json(out / ARTIFACT)
    rows: dict[str, list[float]] = {"commit_to_stt": [], "transcript_to_request": [], "audio_to_playback": [],
                                    "sum": [], "gap_ms": []}
    for turn in doc["turns"]:
        e = turn["events"]
        if turn.get("gap_ms") is None or None in (e.get("stt_start"), e.get("request_sent")):
            continue
        parts = (e["stt_start"] - e["turn_detected"], e["request_sent"] - e["stt_end"],
                 e["playback_start"] - e["first_audio_ready"])
        for key, value in zip(("commit_to_stt", "transcript_to_request", "audio_to_playback"), parts):
            rows[key].append(value)
        rows["sum"].append(sum(parts))
        rows["gap_ms"].append(turn["gap_ms"])
    return rows


# --- the matrix ---------------------------------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def run_matrix(out: Path, url: str, turns: int, endpoints: Sequence[float],
               strategies: Sequence[str]) -> list[dict[str, Any]]:
    """Every setting's call (the converse step, real VAD, STT and TTS against ``url``), then the floor's parts
    measured alone. Returns one row per setting."""
    from voice_llm.client.api import ServerClient
    from voice_llm.converse import step
    from voice_llm.speech.stt import default_threads, load_transcriber
    from voice_llm.scenario.dialogue import load_dialogue, system_prompt
    from voice_llm.scenario.kb import default_kb_dir, load_kb
    from voice_llm.lab.context import LabContext
    from voice_llm.tts import load_engine

    rows = []
    for endpoint in endpoints:
        for strategy in strategies:
            for preemptive in (False, True):
                label = f"{endpoint:g}ms-{strategy}-{'preemptive' if preemptive else 'endpoint'}"
                folder = out / "matrix" / label
                ctx = LabContext(out=folder, client=ServerClient(url), kb_dir=default_kb_dir())
                options = step.ConverseOptions(endpoint_ms=endpoint, strategy=strategy, preemptive=preemptive,
                                               turns=turns)
                step.converse_step(ctx, options)
                doc = read_json(folder / ARTIFACT)
                heard = [t for t in doc["turns"] if t.get("gap_ms") is not None]
                saved = [t["preemptive"]["time_saved_ms"] for t in heard
                         if isinstance(t.get("preemptive"), dict) and t["preemptive"].get("kept")]
                fired = [t["events"]["endpoint"] - t["events"]["speech_end"] for t in heard
                         if t["events"].get("endpoint") is not None]
                rows.append({"setting": label, "endpoint_ms": endpoint, "strategy": strategy, "preemptive": preemptive,
                             "folder": str(folder),
                             **{f"mouth_to_ear_{k}": v for k, v in doc["summary"]["mouth_to_ear_ms"].items()},
                             "time_saved_ms": _median(saved), "tokens_wasted": doc["summary"]["tokens_wasted"],
                             "endpoint_fired_ms": _median(fired),
                             "first_segments": [t["reply"]["segments"][0]["text"] for t in heard
                                                if (t.get("reply") or {}).get("segments")],
                             "caller_wavs": [str(folder / t["caller_wav"]) for t in doc["turns"]],
                             "stt_threads": (doc["engines"].get("stt") or {}).get("cpu_threads")})
    # the floor's parts, each alone (the calls are over)
    first = rows[0]
    stt = load_transcriber("faster-whisper", first["stt_threads"] or default_threads())
    dialogue = load_dialogue(step.ConverseOptions().dialogue)
    stt_alone = []
    for path, script in zip(first["caller_wavs"], dialogue.turns):
        samples = _mono(Path(path))
        t = time.perf_counter()
        stt.transcribe(samples, script)
        stt_alone.append((time.perf_counter() - t) * 1000.0)
    ctx = LabContext(out=out / "matrix" / "alone", client=ServerClient(url), kb_dir=default_kb_dir())
    docs = step.ConverseOptions().docs
    system = system_prompt(dialogue, load_kb(default_kb_dir(), need=docs)[:docs] if docs else [])
    ttft_alone = []
    for index, line in enumerate(dialogue.turns[:turns]):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": line}]
        for repeat in range(2):  # the second is the cached one, as a turn's prompt prefix is in the live call
            result = ctx.request(f"alone-{index + 1}-{repeat + 1}", messages, max_tokens=4, cache_prompt=True)
        ttft_alone.append(result.chunks[0].t_ms if result.chunks else float("nan"))
    engine = load_engine("piper")
    for row in rows:
        synth = []
        for text in row["first_segments"]:
            t = time.perf_counter()
            next(iter(engine.synthesize(text)))
            synth.append((time.perf_counter() - t) * 1000.0)
        row["stt_alone_ms"], row["ttft_alone_ms"] = _median(stt_alone), _median(ttft_alone)
        row["first_segment_synthesis_alone_ms"] = _median(synth)
        parts = (row["endpoint_fired_ms"], row["stt_alone_ms"], row["ttft_alone_ms"],
                 row["first_segment_synthesis_alone_ms"])
        row["floor_ms"] = None if None in parts else sum(parts)  # type: ignore[arg-type]
    return rows


def print_matrix(rows: Sequence[dict[str, Any]]) -> None:
    def ms(value: Any) -> str:
        return "-" if value is None else f"{value:.0f}"

    print(f"{'setting':<28} {'mouth-to-ear median':>19} {'p90':>6} {'saved':>6} {'wasted':>6} {'floor':>6} "
          f"{'(endpoint + STT + 1st token + synth, alone)':>44}")
    for r in rows:
        print(f"{r['setting']:<28} {ms(r['mouth_to_ear_median']):>19} {ms(r['mouth_to_ear_p90']):>6} "
              f"{ms(r['time_saved_ms']):>6} {r['tokens_wasted']:>6} {ms(r['floor_ms']):>6} "
              f"{ms(r['endpoint_fired_ms']):>12} + {ms(r['stt_alone_ms'])} + {ms(r['ttft_alone_ms'])} + "
              f"{ms(r['first_segment_synthesis_alone_ms'])}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path, help="a converse run folder (default: synthesize the lines)")
    parser.add_argument("--turns", type=int, default=4, help="caller lines to synthesize without OUT (default 4)")
    parser.add_argument("--rounds", type=int, default=20, help="replays of the whole line (default 20)")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    parser.add_argument("--matrix", action="store_true", help="run the endpoint x strategy x preemptive calls")
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="the llama-server for --matrix")
    parser.add_argument("--endpoints", default="200,300,500", help="--matrix endpoint settings, ms")
    parser.add_argument("--strategies", default="whole,sentences,clauses", help="--matrix strategies")
    args = parser.parse_args(argv)
    if args.matrix:
        if args.out is None:
            parser.error("--matrix needs OUT (the calls are written under OUT/matrix/)")
        rows = run_matrix(args.out, args.url, args.turns, [float(e) for e in args.endpoints.split(",")],
                          args.strategies.split(","))
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            print_matrix(rows)
        return 0
    turns = recorded_turns(args.out) if args.out else synthesized_turns(args.turns)
    line, offsets, frames = _line(turns)
    probabilities, vad_costs = vad_probabilities(line, frames)
    rounds = [replay(turns, probabilities, line, offsets, frames) for _ in range(args.rounds)]
    merged = {key: [v for r in rounds for v in r[key]] for key in
              ("per_frame_ms", "endpoint_work_ms", "thread_handoff_ms", "per_turn_ms", "critical_path_ms")}
    live = live_handoffs(args.out) if args.out and (args.out / ARTIFACT).is_file() else None
    result = {"source": str(args.out) if args.out else f"{len(turns)} synthesized clinic lines",
              "turns": len(turns), "frames_per_round": frames, "rounds": args.rounds,
              "endpoints_per_round": rounds[0]["endpoints"], "turns_endpointed": rounds[0]["turns_endpointed"], "vad_compute_per_frame_ms": vad_costs,
              **merged, "live": live}
    if args.json:
        print(json.dumps({k: (v if not isinstance(v, list) else {"median": statistics.median(v),
                                                                  "p90": percentile(v, 90), "max": max(v)})
                          for k, v in result.items() if k != "live"} | {"live": live}, indent=2))
        return 0
    print(f"source: {result['source']}; {frames} frames per round, {args.rounds} rounds; per round "
          f"{result['endpoints_per_round']} endpoints in {result['turns_endpointed']} of {len(turns)} turns")
    print(f"VAD compute per frame (excluded):         {spread(vad_costs)} ms")
    print(f"loop's own work per frame:                {spread(merged['per_frame_ms'], 4)} ms")
    print(f"endpoint work per turn (buffer, thread hand-off, messages, breakdown): {spread(merged['endpoint_work_ms'])} ms")
    print(f"  of it the thread hand-off to STT:       {spread(merged['thread_handoff_ms'])} ms")
    print(f"pipeline's own cost per turn (all its frames + endpoint work): {spread(merged['per_turn_ms'])} ms")
    print(f"  on the gap's critical path (true end -> endpoint frames + endpoint work): "
          f"{spread(merged['critical_path_ms'])} ms")
    if live and live["sum"]:
        print(f"live, from {ARTIFACT} ({len(live['sum'])} turns): commit -> STT start {spread(live['commit_to_stt'], 1)} ms, "
              f"transcript -> request {spread(live['transcript_to_request'], 1)} ms, first audio -> playback "
              f"{spread(live['audio_to_playback'], 1)} ms; sum {spread(live['sum'], 1)} ms of gaps "
              f"{spread(live['gap_ms'], 0)} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
