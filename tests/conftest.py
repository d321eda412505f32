"""Shared fixtures. Real-server tests start llama-server (the cached build, the default model) on a free port
with their own state folder, and stop it afterwards, like llama.cpp's own server tests do."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from voice_llm.server import lifecycle as server, provision
from voice_llm.server.config import ServerSettings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def server_binary() -> Path:
    # Builds once (~5 min) if `make test` has not provisioned it already; then cached.
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


class RunningServer:
    def __init__(self, settings: ServerSettings, record: server.ServerRecord) -> None:
        self.settings = settings
        self.record = record

    @property
    def url(self) -> str:
        return self.settings.url

    @property
    def log(self) -> Path:
        return server.log_path(self.settings.port)


@pytest.fixture
def running_server(state_dir: Path, port: int, server_binary: Path, model_path: Path) -> Iterator[RunningServer]:
    settings = ServerSettings(port=port)
    record, _ = server.up(settings, server_binary, model_path)
    try:
        yield RunningServer(settings, record)
    finally:
        server.down(port)


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory, server_binary: Path, model_path: Path) -> Iterator[RunningServer]:
    """One server shared by a module's tests (each start costs ~1 s, but a shared one keeps the KV cache warm
    between tests, which only tests that do not measure the cache may rely on)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("VOICE_LLM_STATE", str(tmp_path_factory.mktemp("state")))
    settings = ServerSettings(port=free_port())
    record, _ = server.up(settings, server_binary, model_path)
    try:
        yield RunningServer(settings, record)
    finally:
        server.down(settings.port)
        mp.undo()


@pytest.fixture(scope="session")
def lab_run(tmp_path_factory: pytest.TempPathFactory, server_binary: Path, model_path: Path) -> Iterator[tuple[Path, subprocess.CompletedProcess[str]]]:
    """The whole lab run once per session the way `make lab` runs it (managed server, default model), its
    output folder and the finished process. Tests read the artifacts; none may modify them (copy first)."""
    state = tmp_path_factory.mktemp("lab-state")
    out = tmp_path_factory.mktemp("lab-out")
    port = free_port()
    env = {**os.environ, "VOICE_LLM_STATE": str(state)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "voice_llm", "lab", "--port", str(port), "--out", str(out)],
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
    from voice_llm.server.backends import llama_cpp_python as lcp

    lcp.ensure_installed()
    # As many threads as llama-server uses by default (one per core); llama-cpp-python's own default is half.
    spec = lcp.ServerSpec(model=model_path, port=free_port(), alias=LLAMA_CPP_PYTHON_ALIAS, threads=os.cpu_count())
    log = tmp_path_factory.mktemp("llama-cpp-python") / "server.log"
    with lcp.running(spec, log) as proc:
        yield LlamaCppPythonServer(spec.url, log, proc)
    assert proc.returncode is not None, "the llama-cpp-python server outlived its fixture"
