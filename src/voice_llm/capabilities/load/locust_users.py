"""The voice caller as a Locust user: one phone call after another, each a growing conversation.

Imported only by `voice-llm load`'s master subprocess and by its Locust workers (``python -m locust -f
locust_users.py --worker ...``): importing locust monkey-patches the whole process with gevent, so it comes
first here and never enters the voice-llm process. Under the patch ``http.client`` and ``socket`` are
cooperative, so the project's own reader (:func:`voice_llm.core.sse.run_stream`, the one measured at the raw-socket
floor) reads each stream unchanged: no FastHttpUser (it buffers 1024 bytes before a line is seen).

A worker tags each turn with the sweep phase the master announced when the turn *started* (message
``voice_phase``), keeps the raw samples and sends them with its regular report to the master
(``report_to_master`` -> ``worker_report``), together with its own CPU time over each measured window.

:class:`DialCaller` (``load --dial URL``) is the other user: each call a `voice-llm dial` subprocess against the
agent (voice_llm.capabilities.load.dialing says why), its turns tagged afterwards with the phase at each turn's start.
"""

from __future__ import annotations

import locust  # noqa: I001  first: gevent's monkey-patching must precede every other import
import locust.runners
from locust import User, events, task
from locust.runners import WorkerRunner

import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

import gevent

from voice_llm.core import sse
from voice_llm.core.scenario.dialogue import TurnTiming, time_turn, words
from voice_llm.capabilities.dial import DialOptions
from voice_llm.capabilities.load import dialing
from voice_llm.capabilities.load.plan import REFUSED_PAUSE_S, CallerConfig, api_key
from voice_llm.core.run import flags

# Report every second instead of every 3 s: the master waits for a step's last turns before it judges the step.
locust.runners.WORKER_REPORT_INTERVAL = 1.0
PHASE_MESSAGE = "voice_phase"
CONFIG_OPTION = "voice_llm_caller"  # the master's parsed_options attribute that carries CallerConfig as JSON
DIAL_OPTION = "voice_llm_dial"  # ... and the call's DialOptions as JSON, for dialing callers
CALL_STOP_S = 10.0  # a dial subprocess still running when its user is stopped: SIGTERM, then this long to exit
ERROR_PAUSE_S = 1.0  # after a failed turn the call ends; wait this long before the next call


@dataclass
class WorkerState:
    """This worker's view of the sweep and what it has not yet sent to the master."""

    step: int = -1
    phase: str = "idle"
    callers: int = 0
    samples: list[dict[str, Any]] = field(default_factory=list)
    cpu: list[dict[str, Any]] = field(default_factory=list)
    inflight: dict[int, int] = field(default_factory=dict)  # measured turns still running, per step
    cpu_mark: tuple[float, float] | None = None  # (process CPU s, wall s) when the measured window began
    callers_started: int = 0
    config: CallerConfig | None = None
    dial: DialOptions | None = None  # the call every dialing caller makes (the plan's)
    clock: dialing.PhaseClock = field(default_factory=dialing.PhaseClock)
    calls: dict[tuple[int, int], tuple[float, Path]] = field(default_factory=dict)  # dialing calls: placed, folder
    lines: Path | None = None  # the caller-audio folder the first call made (voice_llm.capabilities.load.dialing)
    tmp: Path | None = None


STATE = WorkerState()


def _on_phase(environment: Any, msg: Any, **_: Any) -> None:
    data = msg.data
    now = (time.process_time(), time.monotonic())
    if STATE.phase == "measure" and STATE.cpu_mark is not None:
        cpu_s, wall_s = now[0] - STATE.cpu_mark[0], now[1] - STATE.cpu_mark[1]
        STATE.cpu.append({"step": STATE.step, "cpu_s": cpu_s, "wall_s": wall_s})
        STATE.cpu_mark = None
    STATE.step, STATE.phase, STATE.callers = int(data["step"]), str(data["phase"]), int(data["callers"])
    if STATE.phase == "measure":
        STATE.cpu_mark = now
    STATE.clock.add(dialing.Phase(time.time(), STATE.step, STATE.phase, STATE.callers))


@events.init.add_listener
def _on_init(environment: Any, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner):
        environment.runner.register_message(PHASE_MESSAGE, _on_phase)


@events.report_to_master.add_listener
def _on_report(client_id: str, data: dict[str, Any], **_: Any) -> None:
    data["voice_samples"], STATE.samples = STATE.samples, []
    data["voice_cpu"], STATE.cpu = STATE.cpu, []
    inflight = {str(k): v for k, v in STATE.inflight.items() if v}
    for placed, out in list(STATE.calls.values()):  # a dialing call may have turns in every measured step it overlaps
        for step in STATE.clock.measured_steps(dialing.turns_since(placed, out, time.time())):
            inflight[str(step)] = inflight.get(str(step), 0) + 1
    data["voice_inflight"] = inflight
    data["voice_phase"] = [STATE.step, STATE.phase]
    data["voice_clock"] = time.time()  # lets the master put the samples' start times on its own clock


def caller_config(environment: Any) -> CallerConfig:
    if STATE.config is None:
        text = getattr(environment.parsed_options, CONFIG_OPTION, None)
        if not text:
            raise RuntimeError(f"the master sent no {CONFIG_OPTION}: start this worker under `voice-llm load`")
        STATE.config = CallerConfig.from_json(text)
    return STATE.config


def speaking_s(text: str, words_per_s: float) -> float:
    return words(text) / words_per_s if words_per_s > 0 else 0.0


class VoiceCaller(User):
    """One caller: a whole scripted call per task run, thinking between turns like a person on the phone."""

    def on_start(self) -> None:
        self.config = caller_config(self.environment)
        STATE.callers_started += 1
        runner = self.environment.runner
        self.name = f"{getattr(runner, 'client_id', 'local')}/{STATE.callers_started}"
        self.rng = random.Random(f"{self.config.seed}:{self.name}")
        self.calls = 0

    def _cut_after(self) -> int | None:
        """Barge-in: the caller talks over the answer after a random number of chunks, or None."""
        if self.rng.random() >= self.config.barge_in_share:
            return None
        return self.rng.randint(1, max(1, self.config.barge_in_max_tokens))

    def _sample(self, turn: int, step: int, phase: str, callers: int, start: float, timing: TurnTiming | None,
                error: str | None) -> dict[str, Any]:
        sample: dict[str, Any] = {
            "step": step, "callers": callers, "phase": phase, "worker": getattr(self.environment.runner, "client_id", "local"),
            "caller": self.name, "call": self.calls, "turn": turn, "start": start, "error": error,
        }
        if timing is None:
            sample.update({"ttft_ms": None, "first_sentence_ms": None, "e2e_ms": None, "tokens": 0,
                           "itl_p50_ms": None, "itl_p99_ms": None, "prompt_n": None, "cache_n": None, "prompt_ms": None,
                           "cancelled": False})
        else:
            data = timing.as_dict()
            data["e2e_ms"] = data.pop("total_ms")
            sample.update(data)
        return sample

    def _turn(self, messages: list[dict[str, str]], turn: int) -> tuple[dict[str, Any], TurnTiming | None]:
        cfg = self.config
        step, phase, callers = STATE.step, STATE.phase, STATE.callers
        counted = phase == "measure"
        if counted:
            STATE.inflight[step] = STATE.inflight.get(step, 0) + 1
        cut = self._cut_after()
        start = time.time()
        timing: TurnTiming | None = None
        error: str | None = None
        try:
            result = sse.run_stream(
                messages, cfg.max_tokens, cfg.cache_prompt, base_url=cfg.url, api_key=api_key(),
                timeout=cfg.timeout_s, model=cfg.model,
                should_stop=None if cut is None else _stop_after(cut),
            )
            timing = time_turn(result)
        except sse.StreamError as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            if counted:
                STATE.inflight[step] -= 1
        sample = self._sample(turn, step, phase, callers, start, timing, error)
        STATE.samples.append(sample)
        _report(self.environment, "SSE", sample["e2e_ms"], timing.tokens if timing else 0, error)
        return sample, timing

    @task
    def call(self) -> None:
        cfg = self.config
        self.calls += 1
        messages = [{"role": "system", "content": cfg.system}]
        # Callers do not start in lockstep: the first one speaks while another is still dialling.
        gevent.sleep(self.rng.uniform(0.0, speaking_s(cfg.turns[0], cfg.caller_words_per_s)) * cfg.think_scale)
        for number, line in enumerate(cfg.turns, start=1):
            gevent.sleep(speaking_s(line, cfg.caller_words_per_s) * cfg.think_scale)  # the caller says the line
            request = messages + [{"role": "user", "content": line}] if cfg.history else \
                [messages[0], {"role": "user", "content": line}]
            sample, timing = self._turn(request, number)
            if timing is None:
                gevent.sleep(ERROR_PAUSE_S)
                return  # the line went dead: this call is over
            if cfg.history:
                messages = request + [{"role": "assistant", "content": timing.text}]
            if not timing.cancelled:  # the caller listens to the whole answer (a barge-in cut it short)
                gevent.sleep(speaking_s(timing.text, cfg.answer_words_per_s) * cfg.think_scale)


def _report(environment: Any, request_type: str, ms: float | None, length: int, error: str | None) -> None:
    """One turn as Locust's request event. A failed turn is a failure with no time (``response_time`` None, which
    Locust counts apart from the timed requests): as 0.0 ms it pulled Locust's averages and percentiles down by
    a turn that never answered. A turn measured with no time (no heard gap) is likewise untimed, not 0 ms."""
    environment.events.request.fire(
        request_type=request_type, name="turn", response_time=None if error else ms, response_length=length,
        exception=RuntimeError(error) if error else None, context={})


def _stop_after(count: int) -> Callable[[sse.Chunk], bool]:
    """A should_stop for run_stream that closes the connection after ``count`` content chunks."""
    seen = 0

    def should_stop(chunk: sse.Chunk) -> bool:
        nonlocal seen
        seen += 1
        return seen >= count

    return should_stop


# --- dialing callers (load --dial URL) ---------------------------------------------------------------------------


def dial_config(environment: Any) -> DialOptions:
    if STATE.dial is None:
        text = getattr(environment.parsed_options, DIAL_OPTION, None)
        if not text:
            raise RuntimeError(f"the master sent no {DIAL_OPTION}: start this worker under `voice-llm load --dial`")
        STATE.dial = flags.build(DialOptions, flags.parse_settings(DialOptions, text, f"the master's {DIAL_OPTION}"))
        STATE.tmp = Path(tempfile.mkdtemp(prefix="voice-llm-dial-"))
    return STATE.dial


@events.quitting.add_listener
def _on_quit(environment: Any, **_: Any) -> None:
    if STATE.tmp is not None:
        shutil.rmtree(STATE.tmp, ignore_errors=True)


def _stop_call(proc: subprocess.Popen[bytes]) -> None:
    """The call's dialer, when its user is stopped mid-call (the sweep ended): SIGTERM (dial hangs up and keeps
    what it had), then SIGKILL; never left behind."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(CALL_STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class DialCaller(User):
    """One caller on the line: a real `voice-llm dial` call per task run (real-time audio, the playout ear, the
    heard gaps measured by the dialer), then the next call. A refused or failed call is one error sample; the
    caller waits REFUSED_PAUSE_S before dialling again (a caller who cannot get through tries again later)."""

    def on_start(self) -> None:
        self.config = dial_config(self.environment)
        STATE.callers_started += 1
        self.worker = getattr(self.environment.runner, "client_id", "local")
        self.name = f"{self.worker}/{STATE.callers_started}"
        self.rng = random.Random(f"dial:{self.name}")
        self.calls = 0
        # Callers do not dial in lockstep: the first call of each starts within a second or two of the others'.
        gevent.sleep(self.rng.uniform(0.0, 2.0))

    @task
    def call(self) -> None:
        cfg = self.config
        assert STATE.tmp is not None
        self.calls += 1
        key = (id(self), self.calls)
        out = Path(tempfile.mkdtemp(prefix="call-", dir=STATE.tmp))
        lines = STATE.lines if STATE.lines is not None and STATE.lines.is_dir() else None
        command = dialing.dial_command(cfg, out, lines)  # writes the call's settings file: before it is placed
        placed = time.time()
        STATE.calls[key] = (placed, out)
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _, err = proc.communicate()  # cooperative under gevent's patch: the other callers go on meanwhile
            call = dialing.CallId(self.worker, self.name, self.calls, placed)
            samples = dialing.call_samples(out, proc.returncode, err.decode("utf-8", "replace"), call, STATE.clock)
            if lines is None and not any(s["error"] for s in samples):
                target = STATE.tmp / "lines"
                if dialing.keep_lines(out, target) or target.is_dir():
                    STATE.lines = target
        finally:
            _stop_call(proc)
            STATE.calls.pop(key, None)
            shutil.rmtree(out, ignore_errors=True)
            dialing.settings_file(out).unlink(missing_ok=True)
        STATE.samples.extend(samples)
        for sample in samples:
            _report(self.environment, "DIAL", sample["heard_gap_ms"], 0, sample["error"])
        if any(s["error"] for s in samples):
            gevent.sleep(REFUSED_PAUSE_S)
