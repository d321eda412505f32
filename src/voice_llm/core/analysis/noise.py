"""Was the machine quiet enough to trust the numbers? From the saved files alone (run.json and the artifacts).

Two signs of noise, as pyperf warns about an unstable system:

- the load average during the run exceeded half the cores. The 1-minute load includes the lab's own
  llama-server while it computes, which on a 2-core machine alone passes that limit; so the lab's own share is
  estimated (the server's threads x the fraction of the run's wall time the server spent computing, from the
  steps' timings) and taken off. What remains is what other processes added.
- a metric's spread over its repeats, (max - min) / median, exceeded 20 %. Spreads smaller than a few ms in
  absolute terms are left out: they are timer and scheduler jitter (a 3 ms cache hit that once takes 4 ms is not
  a noisy machine), far below anything a listener or a comparison cares about.

The load samples are the start of the run and the end of each measuring step (not the report step and not the
end of the run), so report.json, written by the report step, and a later ``check``/``report`` agree.

`voice-llm load` runs for minutes, so it samples during its run (:class:`LoadSampler`, every few seconds from
the CLI process) and measures its own share instead of estimating it: the CPU the measured server (its pid, when
it runs on this machine) and the load generator (the Locust master and workers, children of the CLI) used over
the minute before each sample, in cores, as the 1-minute load average counts them. Those samples are the load
step's ``load_samples`` in run.json.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from voice_llm.core.analysis import metrics
from voice_llm.core.run.folder import RunFolder
from voice_llm.core.util import procfs

LOAD_PER_CORE_LIMIT = 0.5
SPREAD_LIMIT = 0.20
SPREAD_FLOOR_MS = 5.0
_NOT_MEASURING = {"report"}
SAMPLE_EVERY_S = 5.0
OWN_WINDOW_S = 60.0  # the 1-minute load average's horizon


def _load1(value: Any) -> float | None:
    if isinstance(value, list) and value and isinstance(value[0], (int, float)):
        return float(value[0])
    return None


def load_samples(run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``[{at, load, own}]``: the 1-minute load at the run's start and after each measuring step, with the lab's
    own estimated share (0 at the start); a step that sampled during its run (``load_samples``: `load`) gives
    its samples, with its own share measured."""
    metadata = run.get("metadata") or {}
    cores = (metadata.get("machine") or {}).get("cores") or os.cpu_count() or 1
    threads = min((metadata.get("server") or {}).get("threads") or cores, cores)
    samples = []
    start = _load1(run.get("load_average_start"))
    if start is not None:
        samples.append({"at": "start", "load": start, "own": 0.0})
    wall = compute = 0.0
    for step in run.get("steps") or []:
        if step.get("step") in _NOT_MEASURING:
            continue
        during = step.get("load_samples")
        if isinstance(during, list):
            samples += [{"at": f"{step.get('step')} +{float(s['at']):.0f} s", "load": float(s["load"]),
                         "own": float(s.get("own") or 0.0), "step": step.get("step")} for s in during
                        if isinstance(s, dict) and isinstance(s.get("load"), (int, float))
                        and isinstance(s.get("at"), (int, float))]
            continue  # its own share is measured; its wall time holds no server compute the lab's estimate knows
        wall += float(step.get("wall_ms") or 0.0)
        compute += float(step.get("server_compute_ms") or 0.0)
        load = _load1(step.get("load_average"))
        if load is not None:
            samples.append({"at": step.get("step"), "load": load, "own": round(threads * min(1.0, compute / wall) if wall else 0.0, 2)})
    if len(samples) <= 1:  # a run.json from before per-step samples: its end is the only sample during the run
        end = _load1(run.get("load_average_end"))
        if end is not None:
            fraction = min(1.0, float(run.get("server_compute_ms") or 0) / float(run.get("wall_ms") or 1))
            samples.append({"at": "end", "load": end, "own": round(threads * fraction, 2)})
    return samples


class LoadSampler:
    """Samples the 1-minute load average every ``every_s`` seconds on a thread of its own, with the share of it
    that is the run's own: the CPU that ``own_pids()`` (the measured server) and this process's descendants (the
    load generator) used over the last minute, in cores. ``with LoadSampler(...) as sampler:``; then
    ``sampler.samples``: ``[{at (s since the start), load, own}]``, the last taken when the block ends."""

    def __init__(self, own_pids: Callable[[], Iterable[int]] = tuple, every_s: float = SAMPLE_EVERY_S) -> None:
        self.own_pids = own_pids
        self.every_s = every_s
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic()
        self._cpu: dict[int, float] = {}
        self._used: deque[tuple[float, float]] = deque()  # (monotonic time, own CPU s used since the last sample)

    def _own_cpu_delta(self) -> float:
        pids = {*self.own_pids(), *procfs.descendants(os.getpid())}
        now: dict[int, float] = {}
        for pid in pids:
            cpu = procfs.cpu_seconds(pid)
            if cpu is not None:
                now[pid] = cpu
        # Only what each process used since it was last seen (a process that ended takes its CPU with it).
        delta = sum(cpu - self._cpu.get(pid, cpu) for pid, cpu in now.items())
        self._cpu = now
        return max(0.0, delta)

    def sample(self) -> None:
        t = time.monotonic()
        try:
            load = os.getloadavg()[0]
        except OSError:
            return
        self._used.append((t, self._own_cpu_delta()))
        while self._used and self._used[0][0] < t - OWN_WINDOW_S:
            self._used.popleft()
        span = min(OWN_WINDOW_S, t - self._t0)
        own = sum(used for _, used in self._used) / span if span > 0 else 0.0
        self.samples.append({"at": round(t - self._t0, 1), "load": round(load, 2), "own": round(own, 2)})

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def __enter__(self) -> LoadSampler:
        self._own_cpu_delta()  # the baseline of every process already running
        self._thread = threading.Thread(target=self._loop, name="load-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.every_s + 5.0)
        self.sample()


def _spread_noise(found: Mapping[str, metrics.Measured]) -> dict[str, float]:
    noisy = {}
    for key, measured in found.items():
        ratio = measured.spread
        if not measured.metric.repeats or ratio is None or ratio <= SPREAD_LIMIT:
            continue
        if measured.metric.unit == "ms" and max(measured.samples) - min(measured.samples) < SPREAD_FLOOR_MS:
            continue
        noisy[key] = round(ratio, 3)
    return noisy


def assess(out: RunFolder | Path, run: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The noise verdict for the run in ``out`` (``run``: run.json's content when it is not saved yet)."""
    folder = RunFolder.of(out)
    if run is None:
        record = folder.record
        run = record.doc if record else {}
    cores = ((run.get("metadata") or {}).get("machine") or {}).get("cores") or os.cpu_count() or 1
    limit = LOAD_PER_CORE_LIMIT * cores
    samples = load_samples(run)
    others = max((s["load"] - s["own"] for s in samples), default=None)
    found = metrics.measure_all(folder)
    spreads = _spread_noise(found)
    reasons = []
    affected: list[str] = []
    loaded = others is not None and others > limit
    if loaded:
        peak = max(samples, key=lambda s: s["load"] - s["own"])
        reasons.append(f"load average {peak['load']:.2f} after {peak['at']} on {cores} cores, about "
                       f"{peak['load'] - peak['own']:.2f} of it from other processes (limit {limit:.2f})")
        # A sample taken during a command that sampled its own run (`load`) speaks for that command's numbers,
        # not for the lab's, measured at another time; the lab's samples (start, after each step) for the lab's.
        over = [s for s in samples if s["load"] - s["own"] > limit]
        if any("step" not in s for s in over):
            affected = [key for key, m in found.items() if m.metric.unit == "ms"]
        affected += sorted({f"{s['step']}.json (measured while the machine was loaded)" for s in over if "step" in s})
    for key, ratio in spreads.items():
        measured = found[key]
        reasons.append(f"{measured.metric.label}: spread {ratio:.0%} over {len(measured.samples)} samples "
                       f"({min(measured.samples):.0f}..{max(measured.samples):.0f} ms, limit {SPREAD_LIMIT:.0%})")
        if key not in affected:
            affected.append(key)
    return {
        "noisy": bool(reasons),
        "reasons": reasons,
        "affected": affected,
        "load_limit": limit,
        "others_load_max": None if others is None else round(others, 2),
        "load_samples": samples,
        "spread": {key: round(m.spread, 3) for key, m in found.items() if m.spread is not None},
    }


def summary_lines(noise: Mapping[str, Any]) -> list[str]:
    """What the CLI prints: nothing for a quiet machine."""
    if not noise.get("noisy"):
        return []
    labels = [metrics.label_of(k) for k in noise.get("affected") or []]
    return ["warning: the machine was noisy during this run; these numbers are less trustworthy: "
            + ("; ".join(labels) or "none named"),
            *(f"  - {reason}" for reason in noise.get("reasons") or [])]
