"""voice-llm benchmark: does the reader add anything to what it measures?

    .venv/bin/pip install -e '.[bench]'            # the peers (or: pip install -r benchmarks/requirements.txt)
    .venv/bin/python benchmarks/bench.py           # starts its own llama-server, 30 rounds, 5 cancel runs, lab
    .venv/bin/python benchmarks/bench.py --url http://127.0.0.1:8080 --rounds 50

Phases (see BENCHMARKS.md for what each number means):

1. Client overhead, real server: the same cached streaming request timed by a raw-socket floor, voice_llm.core.sse.stream
   and the peers (openai, httpx, requests, aiohttp), round-robin with the order rotated each round; each client's
   times minus the floor's times in the same round.
2. Intrinsic delay, replay: a loopback server (benchmarks/replay.py) replays the recorded answer with fixed gaps
   and knows when it sent each chunk, so every client's lateness is measured against the true send time. A
   control run with a close-delimited body shows what a buffering reader looks like.
3. Cancellation: voice_llm.core.lab.cancel.run repeated; slot_idle_after_ms vs predicted_per_token_ms of an
   uncancelled identical request.
4. Lab efficiency: `voice-llm lab` wall time vs the server's prompt_ms + predicted_ms (its run.json).

Writes bench.json and bench.md to --out (default benchmarks/results/) and prints the Markdown.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import clients as clients_mod  # noqa: E402
from voice_llm.core import sse  # noqa: E402
from voice_llm.core.client.api import ServerClient  # noqa: E402
from voice_llm.core.util.children import stop_child  # noqa: E402
from voice_llm.capabilities.load.stats import percentile  # noqa: E402
from voice_llm.core.util.stats import median  # noqa: E402

MESSAGES = list(sse.STEP2_MESSAGES)
MAX_TOKENS = 64
OVERHEAD_TARGET_MS = 0.2
LAB_TARGET = 1.1
CANCEL_SLACK_MS = 5.0
BUFFERING_MS = 1.0  # a median per-chunk lateness above the floor's by more than this is called buffering


# ---------------------------------------------------------------------------------------------------------------
# Statistics.
# ---------------------------------------------------------------------------------------------------------------


def summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "median": None, "p90": None, "min": None, "max": None}
    return {"n": len(values), "median": median(values), "p90": percentile(values, 90),
            "min": min(values), "max": max(values)}


def r4(x: float) -> float:
    return round(x, 4)


# ---------------------------------------------------------------------------------------------------------------
# Machine and server facts.
# ---------------------------------------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_facts() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
    }


def load_avg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def library_versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for dist in ("voice-llm", "openai", "httpx", "httpx2", "requests", "urllib3", "aiohttp"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


# ---------------------------------------------------------------------------------------------------------------
# Phase 1 and 2: rounds of requests.
# ---------------------------------------------------------------------------------------------------------------


def run_rounds(clients: list[clients_mod.Client], rounds: int, after_request: Any = None,
               log: Any = print) -> tuple[dict[str, list[clients_mod.Sample | None]], dict[str, list[Any]], dict[str, list[str]]]:
    """Round-robin, order rotated each round. Returns per row the sample of each round (None on error), the
    extra per-request data ``after_request`` returned (per client name), and errors per client name."""
    samples: dict[str, list[clients_mod.Sample | None]] = {row: [] for c in clients for row in c.rows}
    extras: dict[str, list[Any]] = {c.name: [] for c in clients}
    errors: dict[str, list[str]] = {c.name: [] for c in clients}
    n = len(clients)
    for r in range(rounds):
        order = clients[r % n:] + clients[:r % n]
        for client in order:
            try:
                got = client.request()
                extra = after_request(client, got) if after_request else None
            except Exception as exc:  # one failing client must not stop the others
                errors[client.name].append(f"round {r}: {exc.__class__.__name__}: {exc}")
                got, extra = {}, None
            for row in client.rows:
                samples[row].append(got.get(row))
            extras[client.name].append(extra)
        log(f"  round {r + 1}/{rounds} done")
    return samples, extras, errors


def overhead_stats(samples: dict[str, list[clients_mod.Sample | None]], floor: str = "raw") -> dict[str, Any]:
    """Each row minus the floor, paired round by round: first content chunk, and every chunk index k."""
    out: dict[str, Any] = {}
    base = samples[floor]
    for row, per_round in samples.items():
        first, ttft, delays = [], [], []
        same_tokens = ok = 0
        for r, sample in enumerate(per_round):
            if sample is None or not sample.texts:
                continue
            ok += 1
            rel = sample.relative_ms()
            ttft.append(rel[0])
            ref = base[r] if r < len(base) else None
            if ref is None or not ref.texts:
                continue
            ref_rel = ref.relative_ms()
            first.append(rel[0] - ref_rel[0])
            delays += [rel[k] - ref_rel[k] for k in range(min(len(rel), len(ref_rel)))]
            same_tokens += sample.texts == ref.texts
        out[row] = {
            "rounds_ok": ok,
            "same_tokens_as_floor": same_tokens,
            "ttft_ms": summary(ttft),
            "first_chunk_overhead_ms": summary(first),
            "chunk_delay_ms": summary(delays),
        }
    return out


def lateness_stats(samples: dict[str, list[clients_mod.Sample | None]], send_times: dict[str, list[Any]],
                   row_client: dict[str, str]) -> dict[str, Any]:
    """Each chunk's receive time minus a reference time of that same chunk of the same request: the replay
    server's send time, or the kernel's loopback timestamp (wire.py). ``send_times[client][round]`` is None when
    the reference is missing or did not match the chunks."""
    out: dict[str, Any] = {}
    for row, per_round in samples.items():
        sends_list = send_times[row_client[row]]
        first, every = [], []
        by_round: list[float | None] = []
        ok = mismatched = 0
        for r, sample in enumerate(per_round):
            sends = sends_list[r] if r < len(sends_list) else None
            if sample is None or not sample.texts or not isinstance(sends, list) or not sends:
                by_round.append(None)
                continue
            ok += 1
            got = sample.absolute()
            if len(got) != len(sends):
                mismatched += 1
            late = [(got[k] - sends[k]) * 1000.0 for k in range(min(len(got), len(sends)))]
            first.append(late[0])
            by_round.append(r4(late[0]))
            every += late
        out[row] = {"rounds_ok": ok, "chunk_count_mismatch": mismatched,
                    "first_chunk_lateness_ms": summary(first), "chunk_lateness_ms": summary(every),
                    "first_chunk_lateness_by_round_ms": by_round}
    floor = out.get("raw", {}).get("chunk_lateness_ms", {}).get("median")
    floor_first = out.get("raw", {}).get("first_chunk_lateness_ms", {}).get("median")
    for row in out.values():
        med = row["chunk_lateness_ms"]["median"]
        fmed = row["first_chunk_lateness_ms"]["median"]
        row["chunk_minus_floor_ms"] = None if med is None or floor is None else med - floor
        row["first_minus_floor_ms"] = None if fmed is None or floor_first is None else fmed - floor_first
    return out


def raw_series(samples: dict[str, list[clients_mod.Sample | None]]) -> dict[str, list[list[float] | None]]:
    """Per row, per round: the chunk times in ms from the client's own start (None if the round failed)."""
    return {row: [None if s is None else [r4(x) for x in s.relative_ms()] for s in per_round]
            for row, per_round in samples.items()}


def start_replay(recording: Path, interval_ms: float, first_ms: float, framing: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "replay.py"), "--recording", str(recording), "--interval-ms", str(interval_ms),
         "--first-ms", str(first_ms), "--framing", framing],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"replay server did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def replay_phase(recording: Path, rounds: int, interval_ms: float, first_ms: float, framing: str,
                 body: dict[str, Any], only: set[str] | None, log: Any) -> dict[str, Any]:
    proc, url = start_replay(recording, interval_ms, first_ms, framing)
    try:
        client = ServerClient(url, timeout=10)
        made, skipped = clients_mod.make_clients(url, body, only)
        expected = {"n": 0}

        def sendtimes(_client: clients_mod.Client, _got: Any) -> list[float]:
            expected["n"] += 1
            deadline = time.monotonic() + 5
            while True:
                got = client.get_json("/sendtimes")[1]
                if got["request"] >= expected["n"] or time.monotonic() > deadline:
                    return got["content_send_s"]
                time.sleep(0.001)

        try:
            log(f"replay ({framing}): warm-up")
            run_rounds(made, 1, sendtimes, log=lambda *_: None)
            log(f"replay ({framing}): {rounds} rounds, {interval_ms:g} ms between chunks")
            samples, sends, errors = run_rounds(made, rounds, sendtimes, log=log)
        finally:
            for c in made:
                c.close()
        row_client = {row: c.name for c in made for row in c.rows}
        return {
            "url": url, "framing": framing, "rounds": rounds, "interval_ms": interval_ms, "first_ms": first_ms,
            "skipped": skipped, "errors": {k: v for k, v in errors.items() if v},
            "per_client": lateness_stats(samples, sends, row_client),
            "labels": {row: label for c in made for row, label in c.rows.items()},
        }
    finally:
        stop_child(proc)


class WireCapture:
    """benchmarks/wire.py as a child process: kernel timestamps of the server's content chunks on loopback."""

    def __init__(self, server_port: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "wire.py"), "--port", str(server_port)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "READY":
            err = self.proc.stderr.read() if self.proc.stderr else ""
            stop_child(self.proc)
            raise RuntimeError(f"wire capture did not start: {line!r} {err.strip()[-300:]}")

    def flush(self) -> list[dict[str, Any]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("FLUSH\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def after_request(self, _client: clients_mod.Client, got: dict[str, clients_mod.Sample]) -> list[float] | dict[str, Any]:
        """The wire times of this request's content chunks, or (when they do not match what the client received)
        a dict saying why, kept in bench.json."""
        events = self.flush()
        texts = next((s.texts for s in got.values() if s is not None), None)
        if texts is None or [e["c"] for e in events] != texts:
            return {"mismatch": True, "wire_chunks": len(events), "client_chunks": None if texts is None else len(texts),
                    "ports": sorted({e["port"] for e in events})}
        return [e["t"] for e in events]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        stop_child(self.proc)


def wire_unavailable(url: str) -> str | None:
    import urllib.parse

    import wire

    from voice_llm.core.server.config import is_loopback

    host = urllib.parse.urlsplit(url).hostname or ""
    if not is_loopback(host):
        return f"the server ({host}) is not on loopback"
    return wire.available()


# ---------------------------------------------------------------------------------------------------------------
# Phase 3: cancellation. Phase 4: lab.
# ---------------------------------------------------------------------------------------------------------------


def cancel_phase(url: str, runs: int, server_log: Path | None, work: Path, log: Any) -> dict[str, Any]:
    from voice_llm.core.scenario import prompts
    from voice_llm.core.scenario.kb import default_kb_dir
    from voice_llm.core.lab import cancel
    from voice_llm.core.run.context import LabContext

    client = ServerClient(url)
    messages = prompts.chat(prompts.ONE_SENTENCE_SYSTEM, prompts.CANCEL_REQUEST)
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    for i in range(runs):
        twin = client.chat(messages, cancel.MAX_TOKENS, True)  # uncancelled identical request: the token time
        token_ms = (twin.timings or {}).get("predicted_per_token_ms")
        out = work / f"cancel-{i}"
        out.mkdir(parents=True, exist_ok=True)
        ctx = LabContext(out=out, client=client, kb_dir=Path(default_kb_dir()), server_log=server_log)
        try:
            cancel.run(ctx)
        except Exception as exc:  # e.g. no token before the cut on a busy machine: record it, go on
            errors.append(f"run {i}: {exc.__class__.__name__}: {exc}")
            log(f"  cancel {i + 1}/{runs}: {exc}")
            continue
        doc = json.loads((out / "cancel.json").read_text())
        rows.append({
            "run": i, "slot_idle_after_ms": doc["slot_idle_after_ms"], "closed_at_ms": doc["closed_at_ms"],
            "received_tokens": doc["received_tokens"], "cancel_logged": doc["cancel_logged"],
            "predicted_per_token_ms": token_ms, "twin_predicted_n": (twin.timings or {}).get("predicted_n"),
        })
        log(f"  cancel {i + 1}/{runs}: idle {doc['slot_idle_after_ms']:.1f} ms, token {token_ms or 0:.1f} ms")
    idle = [r["slot_idle_after_ms"] for r in rows]
    tok = [r["predicted_per_token_ms"] for r in rows if r["predicted_per_token_ms"] is not None]
    med_idle = median(idle) if idle else None
    med_tok = median(tok) if tok else None
    return {
        "runs": rows,
        "errors": errors,
        "slot_idle_after_ms": summary(idle),
        "predicted_per_token_ms": summary(tok),
        "within_token_plus_slack": [r["slot_idle_after_ms"] <= (r["predicted_per_token_ms"] or 0) + CANCEL_SLACK_MS
                                    for r in rows],
        "ok": None if med_idle is None or med_tok is None else med_idle <= med_tok + CANCEL_SLACK_MS,
    }


def lab_phase(url: str, work: Path, log: Any) -> dict[str, Any]:
    out = work / "lab"
    cmd = [sys.executable, "-m", "voice_llm", "lab", "--url", url, "--out", str(out), "--quiet"]
    log("lab: " + " ".join(cmd[1:]))
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    run_json = out / "run.json"
    if not run_json.is_file():
        return {"error": f"lab exited {done.returncode} without run.json: {done.stderr.strip()[-500:]}"}
    run = json.loads(run_json.read_text())
    ratio = run.get("wall_over_compute")
    return {
        "exit_code": done.returncode,
        "process_s": elapsed,
        "wall_ms": run.get("wall_ms"),
        "server_compute_ms": run.get("server_compute_ms"),
        "wall_over_compute": ratio,
        "requests": run.get("requests"),
        "steps": run.get("steps"),
        "ok": None if ratio is None else ratio <= LAB_TARGET,
    }


# ---------------------------------------------------------------------------------------------------------------
# Server.
# ---------------------------------------------------------------------------------------------------------------


def start_managed_server(state: Path, threads: int | None, log: Any) -> tuple[str, int, Path]:
    os.environ["VOICE_LLM_STATE"] = str(state)
    from voice_llm.core.server import lifecycle as server, provision
    from voice_llm.core.server.config import ServerSettings

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    binary = provision.ensure_server_binary()
    model = provision.ensure_model()
    log(f"starting llama-server on port {port} ({model.name})")
    record, _ = server.up(ServerSettings(port=port, threads=threads), binary, model)
    return record.url, port, server.log_path(port)


# ---------------------------------------------------------------------------------------------------------------
# Report.
# ---------------------------------------------------------------------------------------------------------------


def f(x: Any, nd: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    return f"{x:.{nd}f}"


PEER_EXCLUDE = ("raw", "voice_llm", "voice_llm_on_chunk")


def _vs_floor_and_peers(values: dict[str, float | None], where: str, what: str) -> list[dict[str, Any]]:
    """Targets for voice_llm's value (already minus the floor) against the limit and against every peer."""
    vl = values.get("voice_llm")
    if vl is None:
        return []
    out = [{"target": f"voice_llm median {what} minus raw floor <= {OVERHEAD_TARGET_MS} ms ({where})",
            "measured": f"{vl:+.3f} ms", "ok": vl <= OVERHEAD_TARGET_MS}]
    peers = {k: v for k, v in values.items() if k not in PEER_EXCLUDE and v is not None}
    if peers:
        best = min(peers, key=lambda k: peers[k])
        out.append({"target": f"voice_llm median {what} no worse than any peer ({where})",
                    "measured": f"voice_llm {vl:+.3f} ms; best peer {best} {peers[best]:+.3f} ms",
                    "ok": vl <= peers[best]})
    return out


def evaluate_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    targets: list[dict[str, Any]] = []
    ov = result.get("overhead") or {}
    per = ov.get("per_client") or {}
    targets += _vs_floor_and_peers({k: v["first_chunk_overhead_ms"]["median"] for k, v in per.items()},
                                   "real server, paired by round", "first-chunk overhead")
    wire = ov.get("wire") or {}
    targets += _vs_floor_and_peers({k: v["first_minus_floor_ms"] for k, v in wire.items()},
                                   "real server, same request timed on the wire", "first-chunk lateness")
    rp = (result.get("replay") or {}).get("per_client") or {}
    targets += _vs_floor_and_peers({k: v["first_minus_floor_ms"] for k, v in rp.items()},
                                   "replay, true send times", "first-chunk lateness")
    for phase, per_client in (("real server, wire", wire), ("replay", rp),
                              ("control", (result.get("control") or {}).get("per_client") or {})):
        late = [f"{k} {v['chunk_minus_floor_ms']:+.2f} ms" for k, v in per_client.items()
                if v.get("chunk_minus_floor_ms") is not None and v["chunk_minus_floor_ms"] > BUFFERING_MS]
        if per_client:
            targets.append({"target": f"readers that buffer ({phase}: median per-chunk lateness > floor + {BUFFERING_MS:g} ms)",
                            "measured": ", ".join(late) or "none", "ok": None})
    lab = result.get("lab") or {}
    if lab.get("wall_over_compute") is not None:
        targets.append({"target": f"lab wall / server compute <= {LAB_TARGET}",
                        "measured": f"{lab['wall_over_compute']:.3f} ({lab['wall_ms'] / 1000:.1f} s / "
                                    f"{lab['server_compute_ms'] / 1000:.1f} s)", "ok": lab["ok"]})
    cancel = result.get("cancel") or {}
    if cancel.get("runs"):
        idle = cancel["slot_idle_after_ms"]["median"]
        tok = cancel["predicted_per_token_ms"]["median"]
        targets.append({"target": f"cancel: median slot_idle_after_ms <= median token time + {CANCEL_SLACK_MS:g} ms "
                                  f"({len(cancel['runs'])} runs)",
                        "measured": f"idle {f(idle, 1)} ms vs token {f(tok, 1)} ms", "ok": cancel["ok"]})
    return targets


def overhead_table(per: dict[str, Any], labels: dict[str, str]) -> list[str]:
    lines = [
        "| client | rounds | TTFT median ms | first-chunk overhead median ms | p90 ms | per-chunk delay median ms | p90 ms | same tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row, s in per.items():
        lines.append(
            f"| {labels.get(row, row)} | {s['rounds_ok']} | {f(s['ttft_ms']['median'], 2)} | "
            f"{f(s['first_chunk_overhead_ms']['median'])} | {f(s['first_chunk_overhead_ms']['p90'])} | "
            f"{f(s['chunk_delay_ms']['median'])} | {f(s['chunk_delay_ms']['p90'])} | {s['same_tokens_as_floor']}/{s['rounds_ok']} |"
        )
    return lines


def lateness_table(per: dict[str, Any], labels: dict[str, str]) -> list[str]:
    lines = [
        "| client | rounds | first chunk late median ms | p90 ms | every chunk late median ms | p90 ms | median minus floor ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row, s in per.items():
        lines.append(
            f"| {labels.get(row, row)} | {s['rounds_ok']} | {f(s['first_chunk_lateness_ms']['median'])} | "
            f"{f(s['first_chunk_lateness_ms']['p90'])} | {f(s['chunk_lateness_ms']['median'])} | "
            f"{f(s['chunk_lateness_ms']['p90'])} | {f(s['chunk_minus_floor_ms'])} |"
        )
    return lines


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    m = meta["machine"]
    out = [
        f"# voice-llm benchmark — {meta['finished']}",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {m['nproc']} CPUs, {m['cpu_model']}, Python {m['python']}; llama.cpp build "
        f"`{meta['server'].get('build_info')}`, model `{Path(meta['server'].get('model') or '?').name}`  ",
        f"Load average (1/5/15 min) before {meta['load_before']}, after {meta['load_after']}"
        + "".join(f"; {k} {v}" for k, v in (meta.get("load_by_phase") or {}).items()) + "  ",
        "Request: `" + json.dumps(meta["request_body"], separators=(",", ":")) + "`",
        "",
    ]
    skipped = meta.get("skipped_clients") or {}
    if skipped:
        out += ["Skipped clients: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()), ""]
    ov = result.get("overhead")
    if ov:
        out += [f"## Client overhead (real server, {ov['rounds']} rounds, paired with the raw floor by round)", ""]
        out += overhead_table(ov["per_client"], ov["labels"])
        if ov.get("errors"):
            out += ["", "Errors: " + "; ".join(f"{k}: {len(v)}" for k, v in ov["errors"].items())]
        out.append("")
        out += ["### The same requests timed on the wire (each chunk vs its own kernel loopback timestamp)", ""]
        if ov.get("wire"):
            out += lateness_table(ov["wire"], ov["labels"])
        else:
            out.append(f"Not measured: {ov.get('wire_unavailable')}")
        out.append("")
    for key, title in (("replay", "Intrinsic reader delay (replay, chunked like llama-server)"),
                       ("control", "Control: the same replay with a close-delimited body (no chunked framing)")):
        rp = result.get(key)
        if rp:
            out += [f"## {title}, {rp['rounds']} rounds, {rp['interval_ms']:g} ms between chunks", ""]
            out += lateness_table(rp["per_client"], rp["labels"])
            out.append("")
    lab = result.get("lab")
    if lab and "wall_ms" in lab:
        out += ["## Lab efficiency", "", "| lab wall s | server compute s | wall / compute | target |",
                "|---:|---:|---:|---:|",
                f"| {lab['wall_ms'] / 1000:.2f} | {lab['server_compute_ms'] / 1000:.2f} | {f(lab['wall_over_compute'])} | "
                f"<= {LAB_TARGET} |", ""]
    elif lab:
        out += ["## Lab efficiency", "", f"Failed: {lab.get('error')}", ""]
    cancel = result.get("cancel")
    if cancel and cancel.get("runs"):
        out += ["## Cancellation", "",
                "| run | closed at ms | tokens received | slot idle after ms | token time ms (uncancelled twin) | idle <= token + 5 ms | cancel logged |",
                "|---:|---:|---:|---:|---:|---:|---:|"]
        for r, ok in zip(cancel["runs"], cancel["within_token_plus_slack"]):
            out.append(f"| {r['run']} | {f(r['closed_at_ms'], 1)} | {r['received_tokens']} | {f(r['slot_idle_after_ms'], 2)} | "
                       f"{f(r['predicted_per_token_ms'], 2)} | {f(ok)} | {r['cancel_logged']} |")
        out += [f"| **median** | | | **{f(cancel['slot_idle_after_ms']['median'], 2)}** | "
                f"**{f(cancel['predicted_per_token_ms']['median'], 2)}** | **{f(cancel['ok'])}** | |", ""]
    if cancel and cancel.get("errors"):
        out += ["Cancel runs that failed: " + "; ".join(cancel["errors"]), ""]
    out += ["## Targets", "", "| target | measured | met |", "|---|---|---:|"]
    for t in result["targets"]:
        out.append(f"| {t['target']} | {t['measured']} | {'–' if t['ok'] is None else f(t['ok'])} |")
    out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------------
# Main.
# ---------------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Time voice-llm's SSE reader against a raw socket and the usual clients.")
    p.add_argument("--url", help="a running llama-server (default: start a managed one on a free port, stop it at the end)")
    p.add_argument("--threads", type=int, help="-t for the managed server (default: llama-server's own choice)")
    p.add_argument("--rounds", type=int, default=30, help="round-robin rounds against the real server (default 30)")
    p.add_argument("--replay-rounds", type=int, default=None, help="rounds against the replay server (default: --rounds)")
    p.add_argument("--control-rounds", type=int, default=None,
                   help="rounds of the close-delimited control (default: min(10, --rounds); 0 skips it)")
    p.add_argument("--replay-interval-ms", type=float, default=10.0, help="gap between replayed chunks (default 10)")
    p.add_argument("--skip-replay", action="store_true", help="no replay phase (and no control)")
    p.add_argument("--cancel-runs", type=int, default=5, help="cancellation runs (default 5; 0 skips)")
    p.add_argument("--skip-lab", action="store_true", help="do not run `voice-llm lab`")
    p.add_argument("--no-wire", action="store_true", help="do not time the real server's chunks on loopback (benchmarks/wire.py)")
    p.add_argument("--clients", help="comma-separated subset of: " + ",".join(c.name for c in clients_mod.ALL_CLIENTS))
    p.add_argument("--out", type=Path, default=HERE / "results", help="where bench.json and bench.md go")
    p.add_argument("--quiet", action="store_true", help="no progress lines (the table is still printed)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    only = None
    if args.clients:
        only = {c.strip() for c in args.clients.split(",") if c.strip()} | {"raw"}  # the floor is always measured
    replay_rounds = args.rounds if args.replay_rounds is None else args.replay_rounds
    control_rounds = min(10, args.rounds) if args.control_rounds is None else args.control_rounds
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    load_before = load_avg()
    phase_load: dict[str, list[float]] = {}
    body = sse.chat_body(MESSAGES, MAX_TOKENS, cache_prompt=True)
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="voice-llm-bench-") as tmp:
        work = Path(tmp)
        port = None
        server_log: Path | None = None
        if args.url:
            url = args.url.rstrip("/")
        else:
            url, port, server_log = start_managed_server(work / "state", args.threads, log)
        try:
            api = ServerClient(url, timeout=30)
            props = api.props()
            server_info = {"url": url, "managed": port is not None, "threads": args.threads if port else None, "build_info": props.get("build_info"),
                           "model": props.get("model_path"), "total_slots": props.get("total_slots"),
                           "n_ctx": (props.get("default_generation_settings") or {}).get("n_ctx")}
            made, skipped = clients_mod.make_clients(url, body, only)
            for name, why in skipped.items():
                log(f"skipping {name}: {why}")
            wire_why = "--no-wire" if args.no_wire else wire_unavailable(url)
            capture: WireCapture | None = None
            if wire_why is None:
                try:
                    capture = WireCapture(urllib.parse.urlsplit(url).port or 80)
                except RuntimeError as exc:
                    wire_why = str(exc)
            if wire_why:
                log(f"no wire timing: {wire_why}")
            after = capture.after_request if capture else None
            try:
                log(f"warm-up: one request per client ({', '.join(c.name for c in made)})")
                run_rounds(made, 1, after, log=lambda *_: None)  # KV cache holds the prompt; imports, pools warm
                raw = next(c for c in made if isinstance(c, clients_mod.RawClient))
                recording = work / "recording.json"
                recording.write_text(json.dumps({"events": raw.last_events}))
                log(f"client overhead: {args.rounds} rounds x {len(made)} clients against {url}")
                samples, wire_times, errors = run_rounds(made, args.rounds, after, log=log)
            finally:
                for c in made:
                    c.close()
                if capture is not None:
                    capture.close()
            labels = {row: label for c in made for row, label in c.rows.items()}
            row_client = {row: c.name for c in made for row in c.rows}
            result["overhead"] = {
                "url": url, "rounds": args.rounds, "labels": labels,
                "errors": {k: v for k, v in errors.items() if v},
                "per_client": overhead_stats(samples),
                "wire": lateness_stats(samples, wire_times, row_client) if capture else None,
                "wire_mismatches": {k: [(r, v) for r, v in enumerate(vals) if isinstance(v, dict)]
                                    for k, vals in wire_times.items() if any(isinstance(v, dict) for v in vals)},
                "wire_unavailable": wire_why,
                "chunk_ms": raw_series(samples),
            }
            phase_load["after overhead"] = load_avg()
            if not args.skip_replay and replay_rounds > 0:
                result["replay"] = replay_phase(recording, replay_rounds, args.replay_interval_ms, 20.0, "chunked",
                                                body, only, log)
                if control_rounds > 0:
                    result["control"] = replay_phase(recording, control_rounds, args.replay_interval_ms, 20.0, "close",
                                                     body, only, log)
            phase_load["after replay"] = load_avg()
            if args.cancel_runs > 0:
                log(f"cancellation: {args.cancel_runs} runs")
                result["cancel"] = cancel_phase(url, args.cancel_runs, server_log, work, log)
            phase_load["after cancel"] = load_avg()
            if not args.skip_lab:
                result["lab"] = lab_phase(url, work, log)
                phase_load["after lab"] = load_avg()
        finally:
            if port is not None:
                from voice_llm.core.server import lifecycle as server

                log(server.down(port))
    result["meta"] = {
        "started": started,
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/bench.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine_facts(),
        "load_before": load_before,
        "load_after": load_avg(),
        "load_by_phase": phase_load,
        "server": server_info,
        "request_body": body,
        "libraries": library_versions(),
        "skipped_clients": skipped,
        "clients": {c.name: {"label": c.label, "note": c.note} for c in clients_mod.ALL_CLIENTS},
    }
    result["targets"] = evaluate_targets(result)
    ordered = {k: result[k] for k in ("meta", "targets", "overhead", "replay", "control", "cancel", "lab") if k in result}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(ordered, indent=1) + "\n")
    md = markdown(ordered)
    (args.out / "bench.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
