"""llama-cpp-python's OpenAI-compatible server: build it once into a cached wheel, install it, run it.

The registry has only a source distribution of ``llama-cpp-python`` (it vendors llama.cpp and compiles it), so
``pip install`` would build it on every clean machine (~3 min on 2 cores). Here it is built once with ``pip wheel``
into ``~/.cache/voice-llm/llama-cpp-python/<version>/wheels`` and installed from that wheel into the current
Python; the ``[server]`` extra's dependencies (fastapi, uvicorn, sse-starlette, ...) come from the registry.

``python -m voice_llm.core.server.backends.llama_cpp_python`` provisions it (the Makefile's ``test`` target does).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from voice_llm.core.server import provision
from voice_llm.core.sse import parse_json
from voice_llm.core.util.children import stop_child
from voice_llm.core.server.config import cache_dir
from voice_llm.core.errors import EXIT_FAILURE, EXIT_OK, ProvisionError, ServerError
from voice_llm.core.util.progress import NullProgress, Progress, make_progress

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
# The same switches as the llama-server build: nothing built that is not needed, nothing fetched at build time.
CMAKE_ARGS = "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAVA_BUILD=OFF -DLLAMA_OPENSSL=OFF"
# No AMX kernels (decision 0002; provision.NO_AMX_FLAGS: its ggml_backend_amx_mul_mat segfaulted on the first decode). Given
# as CFLAGS/CXXFLAGS, which CMake takes as CMAKE_C(XX)_FLAGS on a first configure: no quoting inside CMAKE_ARGS,
# whose splitting is the build backend's.
COMPILER_FLAGS = provision.NO_AMX_FLAGS
# Imported by `python -m llama_cpp.server`; all must be present for the server to start.
SERVER_MODULES = ("llama_cpp", "fastapi", "uvicorn", "sse_starlette", "pydantic_settings", "starlette_context")
READY_TIMEOUT_S = 120.0


def root_dir() -> Path:
    return cache_dir() / PACKAGE / VERSION


def wheel_dir() -> Path:
    return root_dir() / "wheels"


def _stamp() -> Path:
    # Written last, after a successful build: a wheel without it is from a build that did not finish.
    return root_dir() / "build-ok.json"


def _stamp_matches() -> bool:
    """A finished build with today's compiler flags (a stamp without them is from a build with AMX kernels)."""
    try:
        stamp = parse_json(_stamp().read_bytes())
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(stamp, dict) and stamp.get("compiler_flags", "") == COMPILER_FLAGS


def cached_wheel() -> Path | None:
    wheels = sorted(wheel_dir().glob("llama_cpp_python-*.whl"))
    return wheels[0] if wheels and _stamp_matches() else None


def build_seconds() -> float | None:
    """How long the cached wheel took to build, from its stamp."""
    try:
        return float(parse_json(_stamp().read_bytes())["build_s"])
    except (OSError, ValueError, UnicodeDecodeError, KeyError, TypeError):
        return None


def run_step(step: str, argv: Sequence[str], log: Path, progress: Progress, env: dict[str, str] | None = None) -> None:
    """One provisioning step, its output appended to ``log`` and its compile progress reported."""
    provision.run_logged(step, argv, log, progress, env=env, what=PACKAGE)


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"]


def ensure_wheel(progress: Progress | None = None) -> Path:
    """The cached wheel, building it (about 3 minutes on 2 cores) only when none is cached."""
    found = cached_wheel()
    if found is not None:
        return found
    # Two `make` targets or test workers on one cache build it once: the second waits, then finds the wheel.
    with provision.cache_lock(PACKAGE):
        found = cached_wheel()  # another process may have built it while we waited
        return found if found is not None else _build_wheel(progress or NullProgress())


def _build_wheel(progress: Progress) -> Path:
    root = root_dir()
    root.mkdir(parents=True, exist_ok=True)
    log = root / "build.log"
    log.write_text(f"voice-llm: building a wheel of {PACKAGE}=={VERSION} (CMAKE_ARGS={CMAKE_ARGS}, "
                   f"CFLAGS/CXXFLAGS={COMPILER_FLAGS})\n")
    progress.start(f"Building {PACKAGE} {VERSION} (once, ~3 min on 2 cores)", total=100)
    t0 = time.monotonic()
    env = {**os.environ, "CMAKE_ARGS": CMAKE_ARGS}
    if COMPILER_FLAGS:
        env.update(CFLAGS=f"{COMPILER_FLAGS} {os.environ.get('CFLAGS', '')}".strip(),
                   CXXFLAGS=f"{COMPILER_FLAGS} {os.environ.get('CXXFLAGS', '')}".strip())
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        # -v: the compiler lines are what shows progress; --no-deps: the dependencies install as wheels later;
        # --no-cache-dir: pip's own wheel cache is keyed by the sdist, not by the flags, and handed back a wheel
        # built with AMX kernels in 1 s.
        run_step("build", _pip("wheel", "--no-deps", "--no-cache-dir", "--no-binary", PACKAGE, "-v", "-w", tmp,
                               f"{PACKAGE}=={VERSION}"),
                 log, progress, env)
        built = sorted(Path(tmp).glob("llama_cpp_python-*.whl"))
        if not built:
            raise ProvisionError(f"{PACKAGE} build produced no wheel; log: {log}")
        shutil.rmtree(wheel_dir(), ignore_errors=True)
        wheel_dir().mkdir(parents=True)
        target = wheel_dir() / built[0].name
        os.replace(built[0], target)
    elapsed = time.monotonic() - t0
    _stamp().write_text(json.dumps({"version": VERSION, "wheel": target.name, "build_s": round(elapsed, 1),
                                    "compiler_flags": COMPILER_FLAGS}) + "\n")
    progress.finish(f"built {target.name} in {elapsed:.0f} s")
    return target


def installed_version() -> str | None:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def server_importable() -> bool:
    """Whether `python -m llama_cpp.server` can start here (the package and its [server] extra)."""
    return all(importlib.util.find_spec(name) is not None for name in SERVER_MODULES)


def _installed_from(wheel: Path) -> bool:
    """Whether the installed package's files are this wheel's: its RECORD (path, sha256) equals the wheel's."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            name = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
            built = archive.read(name).decode()
        installed = importlib.metadata.distribution(PACKAGE).read_text("RECORD") or ""
    except (OSError, StopIteration, zipfile.BadZipFile, UnicodeDecodeError, importlib.metadata.PackageNotFoundError):
        return False

    def digests(record: str) -> set[tuple[str, str]]:
        # The shared libraries are what the flags change; .py files and the dist-info differ by installer.
        rows = (line.split(",") for line in record.splitlines())
        return {(row[0], row[1]) for row in rows if len(row) >= 2 and row[0].endswith((".so", ".dylib", ".dll"))}

    return digests(built) == digests(installed) != set()


def ensure_installed(progress: Progress | None = None) -> Path | None:
    """Install llama-cpp-python[server] from the cached wheel into this Python, unless that version is there.
    Returns the wheel installed, or None when nothing had to be done."""
    progress = progress or NullProgress()
    wheel = ensure_wheel(progress)
    if installed_version() == VERSION and server_importable() and _installed_from(wheel):
        return None
    log = root_dir() / "install.log"
    log.write_text(f"voice-llm: installing {wheel.name}[server] into {sys.executable}\n")
    progress.start(f"Installing {PACKAGE} {VERSION} from the cached wheel")
    # --force-reinstall --no-deps first: the same version built with other flags is replaced, not kept.
    run_step("install", _pip("install", "--force-reinstall", "--no-deps", str(wheel)), log, progress)
    run_step("install", _pip("install", f"{wheel}[server]"), log, progress)
    importlib.invalidate_caches()
    if not server_importable():
        raise ProvisionError(f"{PACKAGE} installed but `llama_cpp.server` cannot be imported; log: {log}")
    progress.finish(f"{PACKAGE} {VERSION} installed")
    return wheel


# ---------------------------------------------------------------------------------------------------------------
# Running it: start, wait for /v1/models, stop. (It has no /health.)
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerSpec:
    model: Path
    port: int
    host: str = "127.0.0.1"
    ctx: int = 4096
    alias: str | None = None  # the model id /v1/models shows; without it the id is the file path
    threads: int | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model), "--host", self.host,
                "--port", str(self.port), "--n_ctx", str(self.ctx)]
        if self.alias:
            argv += ["--model_alias", self.alias]
        if self.threads:
            argv += ["--n_threads", str(self.threads)]
        return argv


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def running(spec: ServerSpec, log: Path, timeout_s: float = READY_TIMEOUT_S) -> Iterator[subprocess.Popen[bytes]]:
    """Start the server, wait until /v1/models answers, yield the process, and always stop it."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen(spec.argv(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while not _ready(spec.url):
            if proc.poll() is not None:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-8:])
                raise ServerError(f"{PACKAGE} server exited with {proc.returncode} before it was ready; log {log}:\n{tail}")
            if time.monotonic() > deadline:
                raise ServerError(f"{PACKAGE} server on {spec.url} not ready after {timeout_s:g} s; log: {log}")
            time.sleep(0.1)
        yield proc
    finally:
        stop_child(proc)


def main(argv: Sequence[str] | None = None) -> int:
    """Provision: build the wheel once (cached), install it into this Python. Prints the wheel and its build time."""
    parser = argparse.ArgumentParser(description=f"Build {PACKAGE}=={VERSION} once (cached wheel) and install it.")
    parser.add_argument("--quiet", "-q", action="store_true")
    args = parser.parse_args(argv)
    progress = make_progress(args.quiet)
    t0 = time.monotonic()
    try:
        ensure_installed(progress)
    except ProvisionError as exc:
        print(f"voice-llm: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    wheel = cached_wheel()
    built = build_seconds()
    print(f"{PACKAGE} {installed_version()}: {wheel or 'installed'}"
          + (f" (built once in {built:.0f} s)" if built is not None else "")
          + f"; this run {time.monotonic() - t0:.1f} s")
    print(f"serve it with: {serve_line()}")
    return EXIT_OK


SERVE_PORT = 8000  # llama_cpp.server's own default port


def serve_line(model: Path | None = None, port: int = SERVE_PORT) -> str:
    """The command that serves a model with it (the default model's cached file unless given), as a shell line:
    then `voice-llm lab --url http://127.0.0.1:PORT` measures it."""
    spec = ServerSpec(model=model or provision.model_cache_path(), port=port)
    return " ".join(shlex.quote(part) for part in spec.argv()) + \
        f"   (then: voice-llm lab --url {spec.url})"


if __name__ == "__main__":
    raise SystemExit(main())
