"""What the caller hears from two agents, two ways of ending a turn and three lines (issue 29 item 5).

    nice -n 5 python benchmarks/line_matrix.py [--port 18480] [--agents builtin,pipecat] [--turns silence,smart]
                                               [--lines clean,loss2,echo20] [--out benchmarks/results/line-matrix]
                                               [--pause/--no-pause]

Every cell is a real call: `voice-llm dial` (the caller: Twilio Media Streams, 20 ms frames in real time, a 40 ms
jitter buffer, the heard channel recorded as it left that buffer) against `voice-llm agent` (voice-llm's own
pipeline, or pipecat 1.14's with `--engine pipecat`) on loopback, both on the managed llama-server of the default
model (`voice-llm up --port P`, stopped at the end). Each agent exports its OpenTelemetry spans to the dialer's
receiver, so the agent's own per-turn latency is put beside what was heard. One agent process per (agent, turn
mode), started before its calls and stopped after them (SIGTERM), serves the cells of the three lines in turn.

The cells:
- agent: `builtin` | `pipecat`;
- end of turn: `silence` (the VAD stop plus silence up to 300 ms, the agents' default) | `smart` (pipecat's
  smart-turn v3.2 model after a short silence; for the built-in agent through the same model);
- line: `clean` | `loss2` (2 % of 20 ms frames lost both ways, seed 1) | `echo20` (a speakerphone with no echo
  canceller: the heard audio back into the uplink 60 ms later at -20 dB).

Per cell: the four clinic lines (turn 3 is cut into by line 4: a planned barge-in) and, on the clean line with
--pause (the default), a second call of the pause line (`--caller-lines pause`: a sentence with a planned 600 ms pause in its middle)
whose turn must not be ended inside the pause: a reply heard while the caller is still mid-sentence is a cut-off.
Read from each call's dial.json: heard gap median/p90 over the answered turns, heard minus the agent's own
latency (its self-report error), false barge-ins (the agent cut its own reply, the caller silent), cut-offs, the
agent's word errors on the caller's lines, late frames, and the load average at the call's start and end.

Nothing is asserted: the table is printed, and written as JSON and Markdown to --out, for BENCHMARKS.md. The
machine's load is recorded beside every call: on 2 shared cores the absolute gaps are the machine's; relations
inside one run are the finding.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LINES = {"clean": [], "loss2": ["--loss", "2", "--seed", "1"], "echo20": ["--echo-db", "-20"]}
AGENTS = ("builtin", "pipecat")
TURN_MODES = ("silence", "smart")
READY_S = 300.0  # an agent's start: Whisper, Piper (and pipecat's imports) loaded, the prompt primed
DIAL_TIMEOUT_S = 900.0
PAUSE_LAST_WORD = "anything"  # "... next Tuesday afternoon, if you have anything." (voice_llm.capabilities.dial.caller_lines.PAUSE_LINES)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def voice_llm(*args: str, timeout: float = 600.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "voice_llm", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise SystemExit(f"voice-llm {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-600:]}")
    return done


def load() -> float:
    return round(os.getloadavg()[0], 2)


class Agent:
    """One `voice-llm agent` process, ready once its --ready-file is written."""

    def __init__(self, engine: str, turn: str, url: str, otlp_port: int, folder: Path,
                 protocol: str = "twilio") -> None:
        self.engine, self.turn, self.protocol = engine, turn, protocol
        self.ready_file = folder / f"ready-{engine}-{turn}-{protocol}.json"
        self.log = (folder / f"agent-{engine}-{turn}-{protocol}.log").open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "voice_llm", "agent", "--engine", engine, "--turn", turn, "--listen",
             "127.0.0.1:0", "--url", url, "--otlp", f"http://127.0.0.1:{otlp_port}", "--ready-file",
             str(self.ready_file), "--protocol", protocol],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + READY_S
        while not self.ready_file.exists():
            if self.process.poll() is not None:
                raise SystemExit(f"the {engine} agent (--turn {turn}) exited {self.process.returncode} before it was "
                                 f"ready; see {self.log.name}")
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"the {engine} agent (--turn {turn}) was not ready in {READY_S:g} s")
            time.sleep(0.2)
        self.ready = json.loads(self.ready_file.read_text())

    @property
    def url(self) -> str:
        return str(self.ready["listen"])

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()


def dial(agent: Agent, otlp_port: int, out: Path, line: str, extra: Sequence[str]) -> dict[str, Any]:
    """One call; its dial.json's numbers (or the error, one line)."""
    started = load()
    done = voice_llm("dial", agent.url, "--out", str(out), "--otlp", f"127.0.0.1:{otlp_port}", "--deadline", "120",
                     "--quiet", "--protocol", agent.protocol, *LINES[line], *extra, timeout=DIAL_TIMEOUT_S, check=False)
    doc_path = out / "dial.json"
    if not doc_path.exists():
        doc_path = out / "dial-partial.json"
    doc = json.loads(doc_path.read_text()) if doc_path.exists() else None
    result: dict[str, Any] = {"exit": done.returncode, "load_start": started, "load_end": load(),
                              "error": done.stderr.strip().splitlines()[-1][:300] if done.returncode else None,
                              "dial_json": str(doc_path) if doc else None}
    if doc is not None:
        result.update(numbers(doc))
    return result


def numbers(doc: dict[str, Any]) -> dict[str, Any]:
    turns = doc.get("turns") or []
    summary = doc.get("summary") or {}
    errors = sum((t.get("wer") or {}).get("errors") or 0 for t in turns if t.get("wer"))
    words = sum((t.get("wer") or {}).get("words") or 0 for t in turns if t.get("wer"))
    playout = doc.get("playout") or {}
    return {
        "heard_gap_ms": [(t.get("heard") or {}).get("gap_ms") for t in turns],
        "heard_median_ms": (summary.get("heard_gap_ms") or {}).get("median"),
        "heard_p90_ms": (summary.get("heard_gap_ms") or {}).get("p90"),
        "reported_ms": [(t.get("agent_reported") or {}).get("latency_ms") for t in turns],
        "reported_source": next(((t.get("agent_reported") or {}).get("source") for t in turns
                                 if t.get("agent_reported")), None),
        "heard_minus_reported_median_ms": (summary.get("heard_minus_reported_ms") or {}).get("median"),
        "false_barge_ins": summary.get("false_barge_ins"),
        "cut_offs": summary.get("cut_offs"),
        "word_errors": [errors, words] if words else None,
        "barge_in_heard_after_onset_ms": (summary.get("barge_in_heard_after_onset_ms") or {}).get("median"),
        "late_frames": playout.get("late_frames"),
        "agent_engines": ((doc.get("agent") or {}).get("identity") or {}).get("engines"),
        "agent_transcripts": [t.get("agent_transcript") for t in turns],
        "agent_word_errors": [[(t.get("wer") or {}).get("errors"), (t.get("wer") or {}).get("words")] for t in turns],
    }


def answered_whole(pause: dict[str, Any]) -> bool | None:
    """Did the agent answer the pause line's whole sentence, or only its first half (its turn ended inside the
    pause, and the reply was to "I need to move my appointment to")? From the agent's own transcript of turn 1, as
    its spans report it: the second half's last word in it. None when the agent reported no transcript."""
    transcripts = pause.get("agent_transcripts") or []
    if not transcripts or not transcripts[0]:
        return None
    return PAUSE_LAST_WORD in transcripts[0].lower()


def fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.0f}{unit}"
    return f"{value}{unit}"


def markdown(result: dict[str, Any]) -> str:
    rows = ["| agent | end of turn | line | heard median / p90 (ms) | heard − self-reported (median ms) | "
            "false barge-ins | barge-in heard after onset (ms) | agent's word errors | pause line (600 ms mid-sentence) | load |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for cell in result["cells"]:
        call, pause = cell["call"], cell.get("pause") or {}
        heard = (f"{fmt(call.get('heard_median_ms'))} / {fmt(call.get('heard_p90_ms'))}"
                 if call.get("exit") == 0 else f"failed: {call.get('error')}")
        words = call.get("word_errors")
        pause_text = "—"
        if pause:
            whole = answered_whole(pause)
            answer = {True: "answered the whole sentence", False: "answered the first half (turn ended in the pause)",
                      None: "no transcript reported"}[whole]
            pause_text = (f"{answer}; heard talk-over {fmt(pause.get('cut_offs'))}; heard gap "
                          f"{fmt((pause.get('heard_gap_ms') or [None])[0])} ms" if pause.get("exit") == 0
                          else f"failed: {pause.get('error')}")
        rows.append(f"| {cell['agent']} | {cell['turn']} | {cell['line']} | {heard} | "
                    f"{fmt(call.get('heard_minus_reported_median_ms'))} | {fmt(call.get('false_barge_ins'))} | "
                    f"{fmt(call.get('barge_in_heard_after_onset_ms'))} | "
                    f"{f'{words[0]}/{words[1]}' if words else '—'} | {pause_text} | "
                    f"{call.get('load_start')}→{call.get('load_end')} |")
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=18480, help="the managed llama-server's port")
    parser.add_argument("--agents", default=",".join(AGENTS))
    parser.add_argument("--turns", default=",".join(TURN_MODES))
    parser.add_argument("--lines", default=",".join(LINES))
    parser.add_argument("--pause", action=argparse.BooleanOptionalAction, default=True,
                        help="a second call per cell: the pause line (cut-offs)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "line-matrix")
    parser.add_argument("--render", action="store_true",
                        help="re-read the calls of --out's line-matrix.json and write its table again (no call)")
    args = parser.parse_args(argv)
    if args.render:
        result = json.loads((args.out / "line-matrix.json").read_text())
        for cell in result["cells"]:
            for key in ("call", "pause"):
                if cell.get(key) and cell[key].get("dial_json"):
                    cell[key].update(numbers(json.loads(Path(cell[key]["dial_json"]).read_text())))
        (args.out / "line-matrix.json").write_text(json.dumps(result, indent=1) + "\n")
        (args.out / "line-matrix.md").write_text(markdown(result))
        print(markdown(result))
        return 0
    agents, modes = args.agents.split(","), args.turns.split(",")
    lines = args.lines.split(",")
    unknown = [x for x in lines if x not in LINES] + [x for x in agents if x not in AGENTS] + \
              [x for x in modes if x not in TURN_MODES]
    if unknown:
        raise SystemExit(f"unknown cell(s): {', '.join(unknown)}")
    args.out.mkdir(parents=True, exist_ok=True)
    calls = Path(tempfile.mkdtemp(prefix="line-matrix-"))
    url = f"http://127.0.0.1:{args.port}"
    result: dict[str, Any] = {"schema_version": 1, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "load_before": list(os.getloadavg()), "cpus": os.cpu_count(), "server": url,
                              "calls_folder": str(calls), "cells": []}
    print(f"calls in {calls}", file=sys.stderr)
    voice_llm("up", "--port", str(args.port))
    try:
        for engine in agents:
            for mode in modes:
                otlp_port = free_port()
                agent = Agent(engine, mode, url, otlp_port, calls)
                try:
                    for line in lines:
                        name = f"{engine}-{mode}-{line}"
                        print(f"{name}: calling (load {load()})", file=sys.stderr)
                        cell: dict[str, Any] = {"agent": engine, "turn": mode, "line": line,
                                                "call": dial(agent, otlp_port, calls / name, line, [])}
                        if args.pause and line == "clean":  # the endpoint decides a cut-off, not the line
                            cell["pause"] = dial(agent, otlp_port, calls / f"{name}-pause", line,
                                                 ["--caller-lines", "pause", "--barge-in-turns", "none"])
                        print(f"{name}: {json.dumps({k: cell['call'].get(k) for k in ('heard_gap_ms', 'reported_ms', 'error')})}",
                              file=sys.stderr)
                        result["cells"].append(cell)
                finally:
                    agent.stop()
    finally:
        voice_llm("down", "--port", str(args.port), check=False)
    result["load_after"] = list(os.getloadavg())
    (args.out / "line-matrix.json").write_text(json.dumps(result, indent=1) + "\n")
    md = markdown(result)
    (args.out / "line-matrix.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
