"""What every step gets: where to write, whom to ask, and one way to make a timed request."""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voice_llm import runmeta, sse
from voice_llm.api import ServerClient
from voice_llm.artifacts import RAW_DIR, write_bytes_atomic, write_json
from voice_llm.capabilities import Capabilities
from voice_llm.errors import ConfigError, OutputDirError
from voice_llm.progress import NullProgress, Progress
from voice_llm.tts.segmenting import DEFAULT_CLAUSE_WORDS

PARTIAL_SUFFIX = ".partial"


def _same_url(a: str, b: str) -> bool:
    def key(url: str) -> tuple[str, str, int | None, str]:
        parts = urllib.parse.urlsplit(url.strip())
        return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port, parts.path.rstrip("/")
    try:
        return key(a) == key(b)
    except ValueError:  # a bad port in either URL
        return False


def managed_log_for(url: str) -> Path | None:
    """The log of the server answering at ``url`` when voice-llm started it and it still runs; else None.

    A log in the state folder of the URL's port belongs to the server answering there only if that port's record
    names a process that is still the one ``up`` started (pid and start time) and the record's URL is ``url``:
    otherwise it is an earlier server's log, or no log at all, and reading it would say "no cancel logged" about a
    server that never wrote to it.
    """
    from voice_llm import server  # the lifecycle module; imported here so measuring does not depend on it

    try:
        port = urllib.parse.urlsplit(url).port
    except ValueError:
        return None
    record = server.read_record(port) if port is not None else None
    if record is None or not server._is_ours(record) or not _same_url(record.url, url):
        return None
    log = server.log_path(port)
    return log if log.is_file() else None


def server_compute_ms(timings: dict[str, Any] | None) -> float:
    """The server's own time for one request: prompt processing plus generation, from its timings."""
    if not timings:
        return 0.0
    return float(timings.get("prompt_ms") or 0.0) + float(timings.get("predicted_ms") or 0.0)


@dataclass
class ComputeLedger:
    """Adds up the server's compute over a run, so the lab can show how much of its wall time was the server."""

    total_ms: float = 0.0
    requests: int = 0

    def add(self, timings: dict[str, Any] | None) -> None:
        self.total_ms += server_compute_ms(timings)
        self.requests += 1

    def add_busy(self, busy_ms: float) -> None:
        """A request that sent no timings (cancelled): count the time the server was busy with it."""
        self.total_ms += busy_ms


@dataclass(frozen=True)
class StepOptions:
    """Settings a step may read beyond where to write and whom to ask. One frozen value for every step, so the
    lab and a step run alone are configured the same way; a step ignores the fields it does not use."""

    repeat: int = 3  # prefill, cache, sentence, cancel (and speak) repeat their measurement; ttft keeps 5 runs
    timeout: float = 120.0  # seconds a request may go without content (pings and comments do not count)
    deadline_s: float | None = sse.DEFAULT_DEADLINE_S  # seconds one whole request may take
    tts_engine: str = "piper"  # speak: voice_llm.tts engine ("piper", "espeak")
    tts_voice: str | None = None  # speak: a Piper .onnx file or an espeak-ng voice name; None: the default voice
    clause_words: int = DEFAULT_CLAUSE_WORDS  # speak, strategy clauses: words before the first clause may end

    def __post_init__(self) -> None:
        if self.repeat < 1:
            raise ConfigError(f"--repeat must be at least 1, not {self.repeat}")
        if not self.timeout > 0:
            raise ConfigError(f"--timeout must be more than 0 seconds, not {self.timeout:g}")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ConfigError(f"--deadline must be more than 0 seconds, not {self.deadline_s:g}")
        if self.clause_words < 1:
            raise ConfigError(f"--clause-words must be at least 1, not {self.clause_words}")


@dataclass(frozen=True)
class LabContext:
    out: Path
    client: ServerClient
    kb_dir: Path
    progress: Progress = field(default_factory=NullProgress)
    server_log: Path | None = None  # the managed server's log; None for a server given by --url
    ledger: ComputeLedger = field(default_factory=ComputeLedger)
    options: StepOptions = field(default_factory=StepOptions)
    run: runmeta.RunRecord | None = None  # the run the files join; None only in unit tests of a step
    # What the server exposes (probed once before the steps); None: assume llama-server, send nothing extra.
    capabilities: Capabilities | None = None

    @property
    def run_id(self) -> str | None:
        return self.run.run_id if self.run is not None else None

    def path(self, name: str) -> Path:
        return self.out / name

    def write_json(self, name: str, value: Any) -> Path:
        """Write an artifact with the run's id beside its fields, atomically, and put it in the run's manifest."""
        doc = runmeta.stamp(value, self.run_id) if self.run_id else value
        path = write_json(self.path(name), doc)
        self.record(path)
        return path

    def write_bytes(self, name: str, data: bytes) -> Path:
        path = write_bytes_atomic(self.path(name), data)
        self.record(path, data)
        return path

    def record(self, path: Path, data: bytes | None = None) -> None:
        """A file this step wrote some other way (a renamed raw stream, a WAV): into the manifest."""
        if self.run is not None:
            self.run.record_file(path, data)

    def request(self, name: str, messages: list[dict[str, str]], max_tokens: int = 64, cache_prompt: bool = True,
                raw_path: Path | None = None, on_chunk: Callable[[sse.Chunk], None] | None = None,
                **options: Any) -> sse.StreamResult:
        """One timed streaming request, its raw bytes saved as evidence.

        The bytes go to ``raw/<name>.sse.partial`` as they arrive and are renamed to ``raw/<name>.sse`` (or
        ``raw_path``) only when the stream completed, so a failure keeps what arrived without replacing an
        earlier complete file. ``on_chunk`` also sees every content chunk as it arrives (the speak step's TTS).
        """
        final = raw_path or self.out / RAW_DIR / f"{name}.sse"
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputDirError(
                f"cannot create the folder for raw streams {final.parent}: {exc.strerror or exc}"
            ) from exc
        partial = final.with_name(final.name + PARTIAL_SUFFIX)
        tokens = 0

        def count_chunk(chunk: sse.Chunk) -> None:
            nonlocal tokens
            if on_chunk is not None:  # first: the caller's reaction to a chunk is part of what is timed
                on_chunk(chunk)
            tokens += 1
            self.progress.update(f"{name}: {tokens} tokens, {chunk.t_ms / 1000:.1f} s")

        self.progress.update(f"{name}: waiting for the first token")
        if self.capabilities is not None:  # the model name, and the usage request where timings are missing
            for key, value in self.capabilities.request_options().items():
                options.setdefault(key, value)
        try:
            result = self.client.chat(messages, max_tokens, cache_prompt, raw_out=partial, on_chunk=count_chunk, **options)
        except sse.StreamError as exc:
            size = _drop_if_empty(partial)
            if size:
                exc.add_note(f"the {size} bytes received are in {partial}")
            raise
        except OSError as exc:  # writing the evidence failed (a full disk): name the file, not just the errno
            _drop_if_empty(partial)
            if exc.filename is None:
                raise OSError(exc.errno, exc.strerror or str(exc), str(partial)) from exc
            raise
        except BaseException:  # Ctrl-C, SIGTERM: keep what arrived, never an empty evidence file
            _drop_if_empty(partial)
            raise
        os.replace(partial, final)
        self.record(final)
        self.ledger.add(result.timings)
        return result


def _drop_if_empty(partial: Path) -> int:
    """Remove ``partial`` if nothing was written to it; return its size (0 when removed or absent)."""
    try:
        size = partial.stat().st_size
    except OSError:
        return 0
    if not size:
        partial.unlink(missing_ok=True)
    return size
