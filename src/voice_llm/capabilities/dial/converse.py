"""The lab's converse step: dial against voice-llm's own agent on loopback.

``run(ctx)`` writes the agent's settings (AgentSettings: the lab's and converse's flags for it, then this call's
own: listen on 127.0.0.1:0, the lab's server and model, the ready file, our OTLP receiver) as JSON, starts
``python -m voice_llm agent --settings FILE`` as a subprocess in its own process group, waits for its ready line
(the agent has loaded and warmed its engines), dials the URL the ready line names (Twilio Media Streams by default),
writes dial.json with the agent's identity from the ready line and its own per-turn numbers from its spans, and
stops the agent: SIGTERM to the group, a grace period, then SIGKILL. The agent's log (stdout and stderr) is kept as
dial/agent.log, also when the call failed.

The agent is a separate process on purpose: the caller measures it on the other side of the line, as it would a
foreign agent, and the agent's CPU is not the dialer's (its tick keeps real time while the agent computes). Its
settings cross to it whole, as data, never as argv built by hand: a setting added to AgentSettings reaches it with
no change here. The contract with the agent (its settings, ready line) is docs/line.md's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from voice_llm.capabilities.agent import AgentSettings
from voice_llm.capabilities.dial.call import DialError
from voice_llm.capabilities.dial.step import (DIAL_DIR, NAME, DialOptions, Tracing, dial_step, options_of, prepare_call)
from voice_llm.core.run import flags
from voice_llm.core.run.context import LabContext, StepOptions
from voice_llm.engines.line import wire
from voice_llm.engines.speech_in.stt import check_installed
from voice_llm.core.util.artifacts import loads_json

READY_TIMEOUT_S = 600.0  # loading Whisper and Piper, warming them and priming the LLM, on a loaded 2-core machine
STOP_GRACE_S = 10.0  # SIGTERM -> exit: the agent closes its calls and flushes its spans
AGENT_LOG = f"{DIAL_DIR}/agent.log"


def prepare(options: StepOptions) -> None:
    """What the call needs, asked before the lab (or `voice-llm converse`) asks a server anything or writes a file
    (voice_llm.core.lab.pipeline.prepare_steps; issue 31 item 14): the STT the agent transcribes the caller's lines
    with, and the caller's for the heard replies, installed with their weights; without them the step would fail
    only after every earlier step of the lab. (The Piper voice is the speak step's prepare's.)"""
    dial = options.plugin(NAME, DialOptions())
    check_installed((dial.agent or AgentSettings()).stt)  # the agent's
    check_installed(dial.stt)  # the caller's, for the heard replies


def agent_settings(ctx: LabContext, options: DialOptions, ready_file: Path, otlp_endpoint: str | None) -> AgentSettings:
    """The agent's settings for this call: the lab's and converse's flags for it (options.agent), and what this
    call decides: where it listens (any free port), one call at a time, the lab's server, model and documents, the
    caller's line and dialogue, the ready file, our OTLP receiver."""
    model = ctx.capabilities.model if ctx.capabilities is not None else None
    line = options.line_format()
    asked = options.agent or AgentSettings()
    return replace(asked, host="127.0.0.1", port=0, url=ctx.client.base_url,
                   protocol=line.protocol, rate=line.rate if line.protocol == wire.PCM else asked.rate,
                   max_calls=1, ready_file=ready_file, kb_dir=ctx.kb_dir, dialogue=options.dialogue,
                   model=model or None, otlp=otlp_endpoint,
                   # what every request of this run asks of this server, the agent's too
                   include_usage=bool(ctx.capabilities is not None
                                      and ctx.capabilities.request_options().get("include_usage")))


def agent_command(settings_file: Path) -> list[str]:
    """The agent's command line: its settings, whole, in ``settings_file`` (docs/line.md's agent)."""
    return [sys.executable, "-m", "voice_llm", "agent", "--settings", str(settings_file)]


class Agent:
    """voice-llm's agent as a subprocess for one call; a context manager that always stops it."""

    def __init__(self, command: list[str], ready_file: Path, log_path: Path, grace_s: float = STOP_GRACE_S) -> None:
        self.command = command
        self.grace_s = grace_s
        self.ready_file = ready_file
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.ready: dict[str, Any] | None = None

    def __enter__(self) -> Agent:
        log = open(self.log_path, "wb")
        try:
            self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
        """The ready line, once the agent wrote it; a DialError naming the agent's last words if it exits first."""
        assert self.process is not None
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.ready_file.is_file():
                text = self.ready_file.read_text(encoding="utf-8").strip()
                if text:
                    ready = loads_json(text, f"the agent's ready line {self.ready_file}")
                    if not isinstance(ready, dict) or not isinstance(ready.get("listen"), str):
                        raise DialError(f"the agent's ready line has no listen URL: {text[:120]!r}")
                    self.ready = ready
                    return ready
            status = self.process.poll()
            if status is not None:
                raise DialError(f"the agent exited with status {status} before it was ready: {self.last_words()}")
            time.sleep(0.1)
        raise DialError(f"the agent was not ready within {timeout_s:g} s: {self.last_words()}")

    def last_words(self) -> str:
        try:
            lines = [line for line in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
                     if line.strip()]
        except OSError:
            return "(no log)"
        return lines[-1][:300] if lines else "(nothing in its log)"

    def stop(self) -> int | None:
        """SIGTERM to its process group, ``grace_s`` to exit, then SIGKILL; its exit status."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                process.wait(self.grace_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait(STOP_GRACE_S)
        return process.returncode


def identity_of(ready: dict[str, Any]) -> dict[str, Any]:
    """dial.json's agent.identity from the ready line."""
    keep = ("engine", "engines", "versions", "protocol", "rate", "codec", "max_calls", "pid", "listen")
    return {key: ready.get(key) for key in keep if key in ready}


def run(ctx: LabContext) -> list[Path]:
    options = options_of(ctx)
    # Before the agent starts: the caller's lines (Piper) and the STT; a failure here starts nothing.
    prepared = prepare_call(ctx, options)
    folder = ctx.path(DIAL_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="voice-llm-agent-") as tmp:
        ready_file = Path(tmp) / "ready.json"
        log_path = Path(tmp) / "agent.log"
        settings_file = Path(tmp) / "settings.json"
        tracing = Tracing("127.0.0.1:0")
        try:
            settings = agent_settings(ctx, options, ready_file, tracing.endpoint)
            flags.write_settings(settings, settings_file)
            with Agent(agent_command(settings_file), ready_file, log_path) as agent:
                ctx.progress.update("converse: starting voice-llm's agent (loading and warming its engines)")
                try:
                    ready = agent.wait_ready()
                    written = dial_step(ctx, options, ready["listen"], identity=identity_of(ready),
                                        prepared=prepared, tracing=tracing,
                                        more_files={"agent_log": AGENT_LOG})
                finally:
                    status = agent.stop()
                    if log_path.is_file():
                        ctx.write_bytes(AGENT_LOG, log_path.read_bytes() + f"[exit status {status}]\n".encode())
        finally:
            tracing.stop()
    return [*written, ctx.path(AGENT_LOG)]
