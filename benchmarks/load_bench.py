"""voice-llm load benchmark: what the Locust caller adds, and how many callers a server takes.

    .venv/bin/python benchmarks/load_bench.py overhead [--url URL] [--rounds 30]
    .venv/bin/python benchmarks/load_bench.py capacity [--slots 1,4] [--callers 1,2,4,8] [--step-s 60] [--warmup-s 15]

overhead  Concurrency 1, the same cached streaming request, round-robin: the raw-socket floor (benchmarks/clients.py)
          and voice_llm.core.sse (the reader the Locust caller uses), both inside a process that imported locust first
          (so gevent has patched socket and http.client, as in a worker), and once more in a plain process.
          Prints each one's first-token time minus the floor's in the same round. Then the whole Locust path at
          1 caller (`voice-llm load --dialogue lab-ttft --callers 1`) beside `voice-llm ttft` on the same server.
capacity  `voice-llm load` over the slot counts and caller steps, sampling the machine's load average every 5 s;
          prints the capacity table (callers x slots) and the load average during the run.

Without --url each command starts its own managed llama-server on a free port (state in a temp folder).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from voice_llm.core.util.stats import median  # the one median rule (decision 0007): the upper middle

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def voice_llm(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "voice_llm", *args], env=env, text=True, capture_output=True)
    if check and result.returncode != 0:
        raise SystemExit(f"voice-llm {' '.join(args)} failed:\n{result.stderr}")
    return result


# ---------------------------------------------------------------------------------------------------------------
# overhead: run inside a child process, patched by gevent or not.
# ---------------------------------------------------------------------------------------------------------------


def overhead_child(url: str, rounds: int, patched: bool) -> dict[str, Any]:
    if patched:
        import locust  # noqa: F401  gevent.monkey.patch_all(), as in a Locust worker
    sys.path.insert(0, str(HERE))
    import bench  # noqa: E402
    import clients  # noqa: E402
    from voice_llm.core import sse  # noqa: E402

    body = sse.chat_body(list(sse.STEP2_MESSAGES), 64, True)
    made = [clients.RawClient(url, body), clients.VoiceLLMClient(url, body)]
    bench.run_rounds(made, 1, log=lambda *_: None)  # warm-up: the prompt in the KV cache
    samples, _, errors = bench.run_rounds(made, rounds, log=lambda *_: None)
    stats = bench.overhead_stats(samples)
    socket_patched = False
    if patched:
        from gevent import monkey

        socket_patched = monkey.is_module_patched("socket")
    return {"gevent": patched, "socket_patched": socket_patched, "rounds": rounds, "errors": errors,
            "raw_ttft_ms": stats["raw"]["ttft_ms"], "voice_llm": stats["voice_llm"]}


def run_overhead(args: argparse.Namespace, url: str, env: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for patched in (True, False):
        code = (f"import sys, json; sys.path.insert(0, {str(HERE)!r}); import load_bench; "
                f"print(json.dumps(load_bench.overhead_child({url!r}, {args.rounds}, {patched})))")
        if patched:
            code = "import locust; " + code
        result = subprocess.run([sys.executable, "-c", code], env=env, text=True, capture_output=True)
        if result.returncode != 0:
            raise SystemExit(result.stderr)
        out["gevent" if patched else "plain"] = json.loads(result.stdout.strip().splitlines()[-1])
    with tempfile.TemporaryDirectory() as tmp:
        voice_llm("ttft", "--url", url, "--out", tmp, "-q", env=env)
        lab = json.loads((Path(tmp) / "ttft.json").read_text())
        voice_llm("load", "--url", url, "--out", tmp, "-q", "--dialogue", "lab-ttft", "--callers", "1", "--workers", "1",
                  "--step-s", str(args.locust_s), "--warmup-s", "2", "--think-scale", "0", "--barge-in", "0", env=env)
        load = json.loads((Path(tmp) / "load.json").read_text())
    step = load["sweeps"][0]["steps"][0]
    out["locust_1_caller"] = {"turns": step["turns"], "ttft_p50_ms": step["ttft_ms"]["p50"],
                              "lab_ttft_p50_ms": lab["ttft_p50"], "lab_runs_ms": [r["ttft_ms"] for r in lab["runs"]]}
    return out


def print_overhead(result: dict[str, Any]) -> None:
    print("| process | rounds | floor TTFT median ms | voice_llm TTFT median ms | overhead median ms | p90 ms |")
    print("|---|---|---|---|---|---|")
    for key in ("gevent", "plain"):
        r = result[key]
        v = r["voice_llm"]
        print(f"| {'locust imported (gevent)' if key == 'gevent' else 'plain'} | {v['rounds_ok']} | "
              f"{r['raw_ttft_ms']['median']:.2f} | {v['ttft_ms']['median']:.2f} | "
              f"{v['first_chunk_overhead_ms']['median']:.3f} | {v['first_chunk_overhead_ms']['p90']:.3f} |")
    lc = result["locust_1_caller"]
    print(f"\nLocust path, 1 caller, lab-ttft request: median TTFT {lc['ttft_p50_ms']:.1f} ms over {lc['turns']} turns; "
          f"`voice-llm ttft` median {lc['lab_ttft_p50_ms']:.1f} ms (runs {', '.join(f'{x:.1f}' for x in lc['lab_runs_ms'])})")


# ---------------------------------------------------------------------------------------------------------------
# capacity
# ---------------------------------------------------------------------------------------------------------------


class LoadAverage:
    """The 1-minute load average every few seconds while the run lasts."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.values: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)

    def _run(self, every_s: float) -> None:
        while not self.stop.wait(every_s):
            self.values.append(os.getloadavg()[0])

    def __enter__(self) -> LoadAverage:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def run_capacity(args: argparse.Namespace, env: dict[str, str], out: Path) -> dict[str, Any]:
    command = ["load", "--out", str(out), "--slots", args.slots, "--callers", args.callers, "--step-s", str(args.step_s),
               "--warmup-s", str(args.warmup_s), "--workers", str(args.workers), "--docs", str(args.docs)]
    command += ["--no-stop"] if args.no_stop else []
    command += ["--url", args.url] if args.url else ["--port", str(free_port()), "--threads", str(args.threads)]
    log(f"voice-llm {' '.join(command)}")
    t0 = time.time()
    with LoadAverage() as load:
        result = subprocess.run([sys.executable, "-m", "voice_llm", *command], env=env, text=True)
    if result.returncode != 0:
        raise SystemExit(f"voice-llm load failed ({result.returncode})")
    doc = json.loads((out / "load.json").read_text())
    return {"load": doc, "loadavg": load.values, "wall_s": time.time() - t0, "cores": os.cpu_count()}


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}"


def print_capacity(result: dict[str, Any]) -> None:
    from voice_llm.capabilities.load.stats import slots_label

    doc = result["load"]
    sweeps = doc["sweeps"]
    callers = sorted({s["callers"] for sw in sweeps for s in sw["steps"]})
    print("| callers | " + " | ".join(f"{slots_label(sw['slots'])}: 1st sentence p50/p90 ms, goodput, turns" for sw in sweeps) + " |")
    print("|---|" + "---|" * len(sweeps))
    for n in callers:
        cells = []
        for sw in sweeps:
            step = next((s for s in sw["steps"] if s["callers"] == n), None)
            if step is None:
                cells.append("(stopped)")
                continue
            first = step["first_sentence_ms"]
            goodput = "–" if step["goodput"] is None else f"{100 * step['goodput']:.0f} %"
            mark = " generator-bound" if step["generator_bound"] else ""
            cells.append(f"{_ms(first['p50'])}/{_ms(first['p90'])}, {goodput}, {step['turns']}{mark}")
        print(f"| {n} | " + " | ".join(cells) + " |")
    print()
    for sw in sweeps:
        v = sw["verdict"]
        print(f"- {slots_label(sw['slots'])}: **max callers = {v['max_callers']}** (tested up to {v['tested_up_to']}"
              + (f", limited by {v['limited_by']}" if v["limited_by"] else "") + ")"
              + (f"; stopped: {sw['stopped']}" if sw["stopped"] else ""))
    values = result["loadavg"]
    if values:
        print(f"\nLoad average (1 min) during the run, {result['cores']} cores: min {min(values):.2f}, "
              f"median {median(values):.2f}, max {max(values):.2f} ({len(values)} samples over "
              f"{result['wall_s']:.0f} s)")
    caller = doc["caller"]
    print(f"Callers: {caller['dialogue']} call, {caller['docs']} documents, {caller['turns']} turns, "
          f"think time from {caller['think']['answer_rate_source']}, {100 * caller['barge_in_share']:.0f} % barge-in; "
          f"budget {doc['slo_first_sentence_ms']:.0f} ms; steps {doc['step_s']:g} s after {doc['warmup_s']:g} s warm-up.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("overhead")
    p.add_argument("--url")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--locust-s", type=float, default=15.0, help="measured window of the 1-caller Locust run")
    p = sub.add_parser("capacity")
    p.add_argument("--url")
    p.add_argument("--slots", default="1,4")
    p.add_argument("--callers", default="1,2,4,8")
    p.add_argument("--step-s", type=float, default=60.0)
    p.add_argument("--warmup-s", type=float, default=15.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--docs", type=int, default=12, help="KB documents in the callers' system prompt")
    p.add_argument("--no-stop", action="store_true", help="run every step past the budget (the whole table)")
    p.add_argument("--threads", type=int, default=1, help="server threads of the managed servers (see BENCHMARKS.md)")
    p.add_argument("--out", type=Path, default=HERE / "results" / "load")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    if args.what == "capacity":
        args.out.mkdir(parents=True, exist_ok=True)
        result = run_capacity(args, env, args.out)
        (args.out / "capacity.json").write_text(json.dumps({k: v for k, v in result.items() if k != "load"}, indent=1))
        print_capacity(result)
        return 0
    with tempfile.TemporaryDirectory() as state:
        env["VOICE_LLM_STATE"] = state
        port = free_port()
        url = args.url
        if url is None:
            voice_llm("up", "--port", str(port), "--threads", "1", "-q", env=env)
            url = f"http://127.0.0.1:{port}"
        try:
            print_overhead(run_overhead(args, url, env))
        finally:
            if args.url is None:
                voice_llm("down", "--port", str(port), env=env, check=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
