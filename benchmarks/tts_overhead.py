"""Time to first audio per strategy against the first-sentence time, and the pipeline overhead.

    python benchmarks/tts_overhead.py [OUT] [--replay N] [--json]

Reads ``OUT/audio.json`` (default ~/voice/llm, written by `voice-llm speak` or `voice-llm lab`) and
``OUT/sentence.json`` and prints, per strategy (medians over the runs, min..max):

* TTFA, the first segment's text-ready time, that segment's first audio synthesized alone (measured by the speak
  step after the live runs, the LLM idle), stalls and when the caller hears the end;
* the pipeline overhead = TTFA - (first segment text-ready + first audio alone): what speaking while the answer
  streams adds on top of the two unavoidable parts.

``--replay N`` separates the two causes of overhead: it loads the same engine and replays every recorded run N
times with the same chunk timing but without the LLM (chunks are handed to the same live pipeline at their
recorded times from a thread, no server): the overhead left is the pipeline's own (queue, thread hand-off,
Python); the difference to the live overhead is the TTS competing with the LLM for the CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from voice_llm.core.util.artifacts import SENTENCE, read_json
from voice_llm.core.server.config import default_out_dir
from voice_llm.core.sse import Chunk, StreamResult
from voice_llm.engines.speech_out.engines import load_engine
from voice_llm.capabilities.speak.artifact import AUDIO
from voice_llm.engines.speech_out.live import speak_live
from voice_llm.core.util.stats import median  # the one median rule (decision 0007)


def spread(values: Sequence[float]) -> str:
    return f"{median(values):7.1f} ({min(values):.0f}..{max(values):.0f})"


def replay_request(chunks: Sequence[tuple[float, str]], total_ms: float) -> Callable[[Callable[[Chunk], None]], StreamResult]:
    """A stand-in for the stream: hands the recorded chunks to ``on_chunk`` at their recorded times."""

    def request(on_chunk: Callable[[Chunk], None]) -> StreamResult:
        t0 = time.perf_counter()
        seen = []
        for t_ms, text in chunks:
            time.sleep(max(0.0, t0 + t_ms / 1000.0 - time.perf_counter()))
            chunk = Chunk((time.perf_counter() - t0) * 1000.0, text)
            seen.append(chunk)
            on_chunk(chunk)
        time.sleep(max(0.0, t0 + total_ms / 1000.0 - time.perf_counter()))
        return StreamResult(chunks=tuple(seen), total_ms=(time.perf_counter() - t0) * 1000.0, timings=None,
                            first_event_ms=None, finish_reason="stop", usage=None, request_body={}, received_bytes=0,
                            done=True, closed_early=False, started_at=t0)

    return request


def replay(doc: Mapping[str, Any], rounds: int) -> dict[str, list[float]]:
    """Overhead per strategy with the recorded chunk timing and no LLM computing."""
    engine = load_engine(doc["engine"], doc.get("voice_option"))
    overheads: dict[str, list[float]] = {strategy: [] for strategy in doc["strategies"]}
    for _ in range(rounds):
        for strategy, entry in doc["strategies"].items():
            for run in entry["runs"]:
                chunks = [(c["t_ms"], c["text"]) for c in run["chunks"]]
                answer = speak_live(engine, strategy, replay_request(chunks, run["total_ms"]), doc["clause_words"])
                first = answer.segments[0]
                overheads[strategy].append(answer.playback.ttfa_ms - (first.text_ready_ms + run["first_segment_alone_ms"]))
    return overheads


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path, default=default_out_dir())
    parser.add_argument("--replay", type=int, default=0, metavar="N", help="replay every run N times without the LLM")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = parser.parse_args(argv)
    doc = read_json(args.out / AUDIO)
    first_sentence = read_json(args.out / SENTENCE)["first_sentence_ms"] if (args.out / SENTENCE).is_file() else None
    rows: dict[str, dict[str, list[float]]] = {}
    for strategy, entry in doc["strategies"].items():
        runs = entry["runs"]
        rows[strategy] = {key: [run[key] for run in runs] for key in
                          ("ttfa_ms", "first_text_ms", "first_segment_alone_ms", "overhead_ms", "handoff_ms", "stall_count",
                           "stall_ms", "end_ms")}
    if args.replay:
        for strategy, values in replay(doc, args.replay).items():
            rows[strategy]["replay_overhead_ms"] = values
    if args.json:
        print(json.dumps({"engine": doc["engine"], "first_sentence_ms": first_sentence, "strategies": rows}, indent=2))
        return 0
    print(f"engine {doc['engine']} ({', '.join(f'{k} {v}' for k, v in doc['versions'].items())}), "
          f"{doc['repeat']} runs per strategy; sentence.json first sentence: "
          f"{'-' if first_sentence is None else f'{first_sentence:.0f} ms'}")
    header = f"{'strategy':<11} {'TTFA ms':>20} {'text ready':>20} {'alone':>20} {'overhead':>20} {'stalls':>6} {'stall ms':>9} {'end ms':>8}"
    print(header + ("  replay overhead" if args.replay else ""))
    for strategy, r in rows.items():
        line = (f"{strategy:<11} {spread(r['ttfa_ms']):>20} {spread(r['first_text_ms']):>20} "
                f"{spread(r['first_segment_alone_ms']):>20} {spread(r['overhead_ms']):>20} "
                f"{median(r['stall_count']):>6.0f} {median(r['stall_ms']):>9.0f} "
                f"{median(r['end_ms']):>8.0f}")
        print(line + (f"  {spread(r['replay_overhead_ms'])}" if args.replay else ""))
    overall = [v for r in rows.values() for v in r["overhead_ms"]]
    handoff = [v for r in rows.values() for v in r["handoff_ms"]]
    print(f"pipeline overhead, all strategies and runs: median {median(overall):.1f} ms; of it the "
          f"hand-off from text ready to synthesis start: median {median(handoff):.2f} ms (max {max(handoff):.2f})")
    if args.replay:
        quiet = [v for r in rows.values() for v in r["replay_overhead_ms"]]
        print(f"pipeline overhead without the LLM (replay): median {median(quiet):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
