"""Run the steps in order, timing each against the server's own compute, then report and check."""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from pathlib import Path

from voice_llm.artifacts import RUN, SERVER_LOG, write_bytes_atomic, write_json
from voice_llm.lab.context import LabContext

# name -> (what it does, the module whose run(ctx) does it). The lab runs them in this order; each is also a
# subcommand. Modules are imported when a step runs, so the CLI starts fast.
STEPS: dict[str, tuple[str, str]] = {
    "health": ("/health and /props", "health"),
    "sse": ("one answer read line by line", "stream_once"),
    "ttft": ("first token x5, cache off", "ttft"),
    "prefill": ("0 / 4 / 12 documents, cache off", "prefill"),
    "cache": ("KV cache: first, second, changed suffix, changed prefix", "cache"),
    "sentence": ("first sentence of a three-sentence answer", "sentence"),
    "cancel": ("close the connection after 0.5 s", "cancel"),
    "report": ("report.json from the files", "report"),
}


@dataclass(frozen=True)
class StepTiming:
    step: str
    wall_ms: float
    server_compute_ms: float


def run_step(name: str, ctx: LabContext) -> tuple[list[Path], StepTiming]:
    title, module = STEPS[name]
    step = importlib.import_module(f"voice_llm.lab.{module}").run
    ctx.progress.start(f"{name}: {title}")
    before = ctx.ledger.total_ms
    t0 = time.perf_counter()
    written = step(ctx)
    wall = (time.perf_counter() - t0) * 1000.0
    ctx.progress.finish(", ".join(path.name for path in written))
    return written, StepTiming(name, wall, ctx.ledger.total_ms - before)


def save_server_log(ctx: LabContext) -> Path | None:
    if ctx.server_log is None or not ctx.server_log.is_file():
        return None
    return write_bytes_atomic(ctx.path(SERVER_LOG), ctx.server_log.read_bytes())


def run_lab(ctx: LabContext) -> dict[str, object]:
    """All steps in order; writes run.json with the wall time against the server's compute — also when a step
    fails or the run is interrupted, then with the steps that finished and the one that did not."""
    timings: list[StepTiming] = []
    failed: str | None = None
    t0 = time.perf_counter()
    try:
        for name in STEPS:
            failed = name
            timings.append(run_step(name, ctx)[1])
        failed = None
    finally:
        wall = (time.perf_counter() - t0) * 1000.0
        compute = ctx.ledger.total_ms
        summary = {
            "wall_ms": wall,
            "server_compute_ms": compute,
            "wall_over_compute": wall / compute if compute else None,
            "requests": ctx.ledger.requests,
            "steps": [{"step": t.step, "wall_ms": t.wall_ms, "server_compute_ms": t.server_compute_ms} for t in timings],
            "failed_step": failed,
        }
        write_json(ctx.path(RUN), summary)
        save_server_log(ctx)
    return summary
