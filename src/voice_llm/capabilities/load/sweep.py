"""The Locust master that drives a stepped sweep of callers, run as its own process:

    python -m voice_llm.capabilities.load.sweep PLAN.json RESULT.json

`voice-llm load` starts it (importing locust would monkey-patch the voice-llm process with gevent). It creates
a master runner from Python (Environment + create_master_runner), starts ``--workers N`` local Locust worker
processes or waits for remote ones, and per step: ``runner.start(callers)`` (only upward: Locust stops running
users on ramp-down, cutting their streams), a warm-up window whose turns are dropped, a measured window, then a
drain until every turn started in the measured window has been reported. After each step it judges the step
from the raw samples (voice_llm.capabilities.load.stats) and stops when the budget or the error limit is broken.
RESULT.json holds every raw sample and each step's windows, worker CPU and host load; the `load` command
turns it into load.json. It is written again after every step, and when the sweep is interrupted (SIGINT,
SIGTERM) or fails (a worker died), with ``interrupted`` saying why: what was measured is never lost.
"""

from __future__ import annotations

import locust  # noqa: I001  first: gevent's monkey-patching must precede every other import
from locust import events
from locust.argument_parser import get_empty_argument_parser, setup_parser_arguments
from locust.env import Environment
from locust.log import setup_logging

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent

from voice_llm.core.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from voice_llm.capabilities.load import proccpu, stats, locust_users
from voice_llm.core.run import flags
from voice_llm.core.util.children import stop_child
from voice_llm.capabilities.load import locust_users_path
from voice_llm.capabilities.load.plan import SweepPlan

POLL_S = 0.1
WORKER_EXIT_S = 10.0


class SweepError(Exception):
    """The sweep could not run (workers did not connect, a worker died); the message says which."""


class SweepInterrupt(SystemExit):
    """SIGTERM or SIGINT reached the master. A SystemExit because gevent's hub, in which a signal handler usually
    runs, passes it on to the main greenlet without printing a traceback (it prints one for KeyboardInterrupt)."""


def _interrupt(signum: int, frame: object) -> None:
    # SIGTERM (from `voice-llm load` when it is stopped) ends the sweep as Ctrl-C would: the steps done are kept.
    raise SweepInterrupt(130)


def write_result(path: Path, result: dict[str, Any]) -> None:
    """RESULT.json, atomically: a reader sees the previous version or this one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result), encoding="utf-8")
    os.replace(tmp, path)


@dataclass
class Collected:
    """Everything the workers reported, as it arrived."""

    samples: list[dict[str, Any]] = field(default_factory=list)
    cpu: list[dict[str, Any]] = field(default_factory=list)
    last_report: dict[str, dict[str, Any]] = field(default_factory=dict)  # worker -> its latest report state

    def on_report(self, client_id: str, data: dict[str, Any], **_: Any) -> None:
        # Start times move to the master's clock (workers on other machines need not agree with it); the
        # report's transit time, well under a millisecond on loopback, is the error this leaves.
        skew = time.time() - float(data.get("voice_clock") or time.time())
        self.samples.extend({**s, "start": s["start"] + skew} for s in data.get("voice_samples") or [])
        for row in data.get("voice_cpu") or []:
            self.cpu.append({**row, "worker": client_id})
        self.last_report[client_id] = {
            "phase": data.get("voice_phase"), "inflight": data.get("voice_inflight") or {}, "at": time.time(),
        }


QUIET = False


def log(message: str) -> None:
    if not QUIET:
        print(f"load: {message}", file=sys.stderr, flush=True)


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def host_cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies of the whole machine from /proc/stat; None where there is no /proc."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    if before is None or after is None or after[1] == before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def start_local_workers(count: int, host: str, port: int) -> list[subprocess.Popen[bytes]]:
    command = [sys.executable, "-m", "locust", "-f", locust_users_path(), "--worker",
               "--master-host", host, "--master-port", str(port), "--loglevel", "WARNING"]
    return [subprocess.Popen(command, stdin=subprocess.DEVNULL) for _ in range(count)]


def stop_workers(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + WORKER_EXIT_S
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:  # seen once: a worker that did not act on "quit"
            stop_child(proc)


class Sweep:
    def __init__(self, plan: SweepPlan) -> None:
        self.plan = plan
        self.collected = Collected()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.tracked: list[proccpu.Tracked] = []  # dialing callers: whose CPU each step records (load.proccpu)
        self.parent = os.getppid()
        parser = get_empty_argument_parser()
        setup_parser_arguments(parser)
        options = parser.parse_args(args=["--headless"])
        # Custom options reach every worker with each spawn message: the callers' settings, for remote workers too.
        setattr(options, locust_users.CONFIG_OPTION, plan.caller.to_json())
        # Dialing callers (load --dial): the same sweep, each user a real call on the line (locust_users.DialCaller)
        user = locust_users.VoiceCaller if plan.dial is None else locust_users.DialCaller
        if plan.dial is not None:
            setattr(options, locust_users.DIAL_OPTION, flags.settings_text(plan.dial))  # the call, as dial reads it
        self.env = Environment(user_classes=[user], events=events,
                               host=plan.caller.url if plan.dial is None else plan.dial.url,
                               stop_timeout=0, parsed_options=options)
        port = plan.master_port or free_port(plan.bind_host)
        self.port = port
        try:
            self.runner = self.env.create_master_runner(plan.bind_host, port)
        except Exception as exc:  # locust's RPCError (zmq): the port is taken or the address is not this machine's
            raise SweepError(f"the master cannot listen for workers on {plan.bind_host}:{port}: {exc}") from exc
        events.worker_report.add_listener(self.collected.on_report)

    def check_workers(self) -> None:
        if os.getppid() != self.parent:
            # `voice-llm load` was killed outright (SIGKILL: no chance to stop us): a master left alone would run
            # its workers on for minutes with nobody to read the result.
            raise SweepError("the voice-llm load process that started this master is gone")
        for proc in self.procs:
            if proc.poll() is not None:
                raise SweepError(f"a Locust worker exited with status {proc.returncode} (its output is above)")

    def wait_for_workers(self) -> list[str]:
        want = self.plan.expect_workers
        deadline = time.monotonic() + self.plan.connect_timeout_s
        while len(self.runner.clients.ready) < want:
            self.check_workers()
            if time.monotonic() > deadline:
                raise SweepError(f"{len(self.runner.clients.ready)} of {want} Locust workers connected to "
                                 f"{self.plan.bind_host}:{self.port} within {self.plan.connect_timeout_s:g} s")
            gevent.sleep(POLL_S)
        return sorted(w.id for w in self.runner.clients.ready)

    def announce(self, step: int, phase: str, callers: int) -> float:
        self.runner.send_message(locust_users.PHASE_MESSAGE, {"step": step, "phase": phase, "callers": callers})
        return time.time()

    def wait(self, seconds: float, enough: Callable[[], bool] = lambda: False) -> None:
        """Sleep ``seconds`` in short slices, noticing a worker or the voice-llm process that is gone; sooner when
        ``enough`` says so."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0 and not enough():
            gevent.sleep(min(remaining, 5 * POLL_S))
            self.check_workers()

    def decided_so_far(self, step: int) -> bool:
        """Do the turns of ``step``'s measured window reported so far judge it (stats.window_end)?"""
        return self.window_end(step) is not None

    def window_end(self, step: int) -> str | None:
        plan = self.plan
        return stats.window_end(self.collected.samples, step, plan.slo_ms, plan.metric,
                                plan.enough_judged or stats.MIN_JUDGED_TURNS, plan.decide_early)

    def drain(self, step: int, since: float) -> float:
        """Wait until every worker has reported, after it saw the drain, no measured turn of ``step`` running."""
        t0 = time.monotonic()
        workers = [w.id for w in self.runner.clients.all]  # "ready" lists only idle workers
        while time.monotonic() - t0 < self.plan.drain_timeout_s:
            self.check_workers()
            reports = [self.collected.last_report.get(w) for w in workers]
            if all(r and r["at"] > since and r["phase"] == [step, "drain"] and not r["inflight"].get(str(step))
                   for r in reports):
                break
            gevent.sleep(POLL_S)
        return time.monotonic() - t0

    def step_cpu(self, step: int) -> dict[str, dict[str, float]]:
        rows = [r for r in self.collected.cpu if r["step"] == step]
        return {r["worker"]: {"cpu_s": r["cpu_s"], "wall_s": r["wall_s"],
                              "share": r["cpu_s"] / r["wall_s"] if r["wall_s"] else 0.0} for r in rows}

    def run_step(self, index: int, callers: int) -> dict[str, Any]:
        plan = self.plan
        until = f" (or until {plan.enough_judged} judged turns are in)" if plan.enough_judged else ""
        log(f"step {index + 1}: {stats.callers_text(callers)} — warm-up {plan.warmup_s:g} s, then {plan.step_s:g} s measured{until}")
        self.announce(index, "warmup", callers)
        self.runner.start(callers, spawn_rate=max(callers, 1))
        if plan.dial is None:  # text callers: also until each caller has finished a turn (stats.warm_up)
            try:
                warmup_s = stats.warm_up(self.wait, lambda: self.collected.samples, index, callers, plan.warmup_s,
                                         plan.warmup_cap_s)
            except stats.WarmUpTooLong as exc:
                raise SweepError(f"step {index + 1}: {exc}") from None
            if warmup_s - plan.warmup_s >= 1.0:
                log(f"step {index + 1}: warm-up {warmup_s:.0f} s, until each caller had finished a turn (a cold "
                    "slot prefills the whole system prompt once)")
        else:
            warm_t0 = time.monotonic()
            self.wait(plan.warmup_s)
            warmup_s = time.monotonic() - warm_t0
        self.check_workers()
        cpu_before, master_cpu = host_cpu_ticks(), time.process_time()
        procs_before = proccpu.snapshot(self.tracked)
        start = self.announce(index, "measure", callers)
        # A window that ends once enough judged turns are in (dialing callers: --step-s is then the longest one):
        # when it ends depends on how many turns were reported, never on what they measured, so the step's numbers
        # are those of every turn that started in it (the drain waits for the calls still running).
        needed = plan.enough_judged
        self.wait(plan.step_s, (lambda: self.decided_so_far(index)) if needed else (lambda: False))
        ended = self.window_end(index) if needed else None
        end = self.announce(index, "drain", callers)
        processes = proccpu.step_processes(self.tracked, procs_before, proccpu.snapshot(self.tracked), end - start) \
            if self.tracked else None
        host = {"cpu_busy": busy_share(cpu_before, host_cpu_ticks()), "loadavg_1m": os.getloadavg()[0],
                "master_cpu_s": time.process_time() - master_cpu}
        drain_s = self.drain(index, end)
        measured = [s for s in self.collected.samples if s["step"] == index and s["phase"] == "measure"]
        summary = stats.summarize_step(measured, plan.slo_ms, end - start, plan.metric)
        cpu = self.step_cpu(index)
        # why the window ended: "judged" (enough judged turns), "failed early", or "step_s" (the longest window)
        window = {"start": start, "end": end, "drain_s": drain_s, "warmup_s": warmup_s, "ended": ended or "step_s"}
        step = {"step": index, "callers": callers, "window": window,
                "cpu": cpu, "generator_bound": stats.generator_bound(cpu, summary), "host": host, **summary}
        if processes is not None:
            step["processes"] = processes
        first = step[plan.metric]
        what = "heard gap" if plan.dial is not None else "first sentence"
        extra = (f"refused {summary['refused']}, late frames {summary['late_frames']} of {summary['call_frames']}"
                 + (f", {summary['unjudged']} heard but not timed (a late tick of the dialer)"
                    if summary.get("unjudged") else "")
                 if plan.dial is not None else f"cancelled {summary['cancelled']}")
        log(f"step {index + 1}: {summary['turns']} turns ({summary['judged']} judged) in {end - start:.0f} s "
            f"measured + {drain_s:.0f} s drain, {what} p50 "
            f"{_ms(first['p50'])} p90 {_ms(first['p90'])}, goodput {_pct(summary['goodput'])}, errors "
            f"{summary['errors']}, {extra}, load {host['loadavg_1m']:.2f}")
        short = stats.short_of_turns(summary, plan.step_s, plan.decide_early)
        if short:
            log(f"step {index + 1}: {short}")
        return step

    def result(self, started: float, workers: list[str], steps: list[dict[str, Any]], stopped: str | None,
               interrupted: str | None) -> dict[str, Any]:
        return {"started": started, "ended": time.time(), "master_port": self.port, "workers": workers,
                "steps": list(steps), "stopped": stopped, "samples": list(self.collected.samples),
                "interrupted": interrupted,
                **({"processes_found": proccpu.found_block(self.tracked)} if self.tracked else {})}

    def run(self, save: Callable[[dict[str, Any]], None] = lambda result: None) -> dict[str, Any]:
        """The whole sweep. ``save`` gets the result after every step and once more at the end, also when the
        sweep is interrupted (``interrupted``: "interrupted") or fails (``interrupted``: the reason)."""
        plan = self.plan
        started = time.time()
        steps: list[dict[str, Any]] = []
        stopped: str | None = None
        interrupted: str | None = None
        workers: list[str] = []
        current = "before the first step"
        try:
            if plan.local_workers:
                self.procs = start_local_workers(plan.local_workers, "127.0.0.1", self.port)
            else:
                log(f"master waiting for {plan.expect_workers} workers on {plan.bind_host}:{self.port}")
            workers = self.wait_for_workers()
            log(f"{len(workers)} Locust workers connected")
            if plan.dial is not None:  # the CPU of the agent, its LLM server and the callers, per step
                # (the callers' URL: the agent's, with --dial: load.run.dial_caller)
                self.tracked = proccpu.find(plan.caller.url, [p.pid for p in self.procs], os.getpid())
            for index, callers in enumerate(plan.callers):
                current = f"during the {callers}-caller step"
                step = self.run_step(index, callers)
                steps.append(step)
                stopped = stats.stop_reason(step, plan.slo_ms, plan.metric)
                if stopped and plan.stop_on_budget:
                    log(f"stopped: {stopped}")
                    break
                stopped = None
                # What a SIGKILL of the master would leave: the steps so far, marked as a sweep that did not end.
                save(self.result(started, workers, steps, None, f"the master stopped after the {callers}-caller step"))
        except (KeyboardInterrupt, SweepInterrupt):
            interrupted = f"interrupted (SIGINT or SIGTERM) {current}"
        except SweepError as exc:
            interrupted = f"failed {current}: {exc}"
        finally:
            try:
                self.runner.stop()
                self.runner.quit()  # the workers send their last samples as they quit
                stop_workers(self.procs)
            except (KeyboardInterrupt, SweepInterrupt):  # a second signal: stop at once, the result is still saved
                interrupted = interrupted or f"interrupted (SIGINT or SIGTERM) {current}"
        result = self.result(started, workers, steps, stopped, interrupted)
        save(result)
        return result


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status (voice_llm.core.errors.EXIT_TABLE): EXIT_OK the sweep ran to its end; EXIT_FAILURE it failed;
    EXIT_INTERRUPTED it was interrupted; EXIT_USAGE a wrong command line. RESULT.json is written in every case
    where the master got as far as its runner (the ``interrupted`` field says which)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m voice_llm.capabilities.load.sweep PLAN.json RESULT.json", file=sys.stderr)
        return EXIT_USAGE
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    setup_logging("WARNING")
    plan = SweepPlan.from_json(Path(args[0]).read_text(encoding="utf-8"))
    global QUIET
    QUIET = plan.quiet
    try:
        result = Sweep(plan).run(lambda result: write_result(Path(args[1]), result))
    except SweepError as exc:
        print(f"load: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except (KeyboardInterrupt, SweepInterrupt):
        return EXIT_INTERRUPTED
    if result["interrupted"]:
        print(f"load: {result['interrupted']}", file=sys.stderr)
        return EXIT_INTERRUPTED if result["interrupted"].startswith("interrupted") else EXIT_FAILURE
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
