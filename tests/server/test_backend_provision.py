"""Provisioning llama-cpp-python: a finished cached wheel is reused, an unfinished one is not, a failed step is
named with its log, and the compile shows progress. (The real build runs once in `make test`.)"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from voice_llm.core.server import provision
from voice_llm.core.server.backends import llama_cpp_python as lcp
from voice_llm.core.errors import ProvisionError, ServerError
from voice_llm.core.util.progress import NullProgress


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VOICE_LLM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_cached_wheel_is_reused_only_when_its_build_finished(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = lcp.wheel_dir() / f"llama_cpp_python-{lcp.VERSION}-cp311-cp311-linux_x86_64.whl"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"PK")
    assert lcp.cached_wheel() is None  # no stamp: that build did not finish
    (lcp.root_dir() / "build-ok.json").write_text(json.dumps({"build_s": 201.5, "compiler_flags": lcp.COMPILER_FLAGS}))
    assert lcp.cached_wheel() == wheel and lcp.build_seconds() == 201.5

    def no_build(progress: object) -> Path:
        raise AssertionError("built again although a wheel is cached")

    monkeypatch.setattr(lcp, "_build_wheel", no_build)
    assert lcp.ensure_wheel() == wheel


def test_a_wheel_built_with_other_compiler_flags_is_built_again(cache: Path) -> None:
    # A stamp from before the flags were recorded is a build with ggml's AMX kernels on x86 (they segfaulted).
    wheel = lcp.wheel_dir() / f"llama_cpp_python-{lcp.VERSION}-py3-none-linux_x86_64.whl"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"PK")
    (lcp.root_dir() / "build-ok.json").write_text(json.dumps({"build_s": 194.6, "compiler_flags": "-O0"}))
    assert lcp.cached_wheel() is None
    (lcp.root_dir() / "build-ok.json").write_text(json.dumps({"build_s": 194.6}))
    assert (lcp.cached_wheel() is None) == bool(lcp.COMPILER_FLAGS)


def test_on_x86_llama_cpp_python_is_built_without_amx() -> None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("AMX is an x86 extension")
    assert lcp.COMPILER_FLAGS == provision.NO_AMX_FLAGS and "-mno-amx-int8" in lcp.COMPILER_FLAGS


def test_the_installed_package_is_known_by_its_libraries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import zipfile
    wheel = tmp_path / f"llama_cpp_python-{lcp.VERSION}-py3-none-linux_x86_64.whl"
    record = "llama_cpp/lib/libggml-cpu.so,sha256=NEW,10\nllama_cpp/llama.py,sha256=PY,5\n"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"llama_cpp_python-{lcp.VERSION}.dist-info/RECORD", record)

    class Installed:
        def __init__(self, text: str) -> None:
            self.text = text

        def read_text(self, name: str) -> str:
            return self.text

    monkeypatch.setattr(lcp.importlib.metadata, "distribution", lambda name: Installed(record))
    assert lcp._installed_from(wheel)
    monkeypatch.setattr(lcp.importlib.metadata, "distribution",
                        lambda name: Installed(record.replace("sha256=NEW", "sha256=OLD")))
    assert not lcp._installed_from(wheel)


def test_a_failed_step_names_the_package_the_step_and_the_log(tmp_path: Path) -> None:
    argv = ["sh", "-c", "echo 'CMake Error: no compiler'; exit 3"]
    with pytest.raises(ProvisionError, match=r"llama-cpp-python failed at step 'build' \(exit 3\); full log: .*"
                                             r"build\.log\nlast lines:\n(.*\n)*CMake Error: no compiler"):
        lcp.run_step("build", argv, tmp_path / "build.log", NullProgress(), env={"PATH": "/bin:/usr/bin"})


def test_ninja_and_cmake_lines_are_progress() -> None:
    line = b"  [70/140] /usr/bin/g++ -O3 -c /tmp/x/vendor/llama.cpp/src/llama-model.cpp -o src/llama-model.o\n"
    assert provision.build_progress(line) == (50.0, "llama-model.cpp")
    assert provision.build_progress(b"[ 42%] Building CXX object src/llama.cpp.o\n") == (42.0, "llama.cpp.o")
    assert provision.build_progress(b"Collecting llama-cpp-python==0.3.36\n") is None


def test_the_server_command_line(tmp_path: Path) -> None:
    spec = lcp.ServerSpec(model=tmp_path / "m.gguf", port=8123, alias="smol", threads=2)
    argv = spec.argv()
    assert argv[:3] == [sys.executable, "-m", "llama_cpp.server"]
    assert argv[argv.index("--port") + 1] == "8123" and argv[argv.index("--n_ctx") + 1] == "4096"
    assert argv[argv.index("--model_alias") + 1] == "smol" and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert spec.url == "http://127.0.0.1:8123"


def test_a_server_that_dies_at_start_is_reported_and_reaped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = lcp.ServerSpec(model=tmp_path / "missing.gguf", port=1)
    monkeypatch.setattr(lcp.ServerSpec, "argv", lambda self: [sys.executable, "-c", "import sys; print('no model'); sys.exit(4)"])
    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def recording_popen(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        return proc

    monkeypatch.setattr(lcp.subprocess, "Popen", recording_popen)
    with pytest.raises(ServerError, match="exited with 4 before it was ready") as info:
        with lcp.running(spec, tmp_path / "server.log"):
            pass
    assert "no model" in str(info.value)
    assert started and started[0].returncode == 4
