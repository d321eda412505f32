"""What every step gets: where to write, whom to ask, and one way to make a timed request."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from voice_llm.core import sse
from voice_llm.core.run import meta as runmeta
from voice_llm.core.client.api import ServerClient
from voice_llm.core.util.artifacts import RAW_DIR, create_exclusive, open_folder, refuse_link, write_bytes_atomic, write_json
from voice_llm.core.client.capabilities import Capabilities
from voice_llm.core.errors import ConfigError, OutputDirError
from voice_llm.core.util.progress import NullProgress, Progress

PARTIAL_SUFFIX = ".partial"


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
    lab and a step run alone are configured the same way; a step ignores the fields it does not use.

    The core's options are fields; a capability's are one frozen value of its own in ``plugins[name]``, built
    from the command's flags by its ``options=`` function (voice_llm.core.registry); a step of a capability whose
    value is missing (a library call that did not give one) uses that capability's defaults."""

    repeat: int = 3  # prefill, cache, sentence, cancel (and speak) repeat their measurement; ttft keeps 5 runs
    timeout: float = 120.0  # seconds a request may go without content (pings and comments do not count)
    deadline_s: float | None = sse.DEFAULT_DEADLINE_S  # seconds one whole request may take
    plugins: Mapping[str, Any] = field(default_factory=dict)  # capability name -> its frozen options value

    def __post_init__(self) -> None:
        if self.repeat < 1:
            raise ConfigError(f"--repeat must be at least 1, not {self.repeat}")
        if not self.timeout > 0:
            raise ConfigError(f"--timeout must be more than 0 seconds, not {self.timeout:g}")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ConfigError(f"--deadline must be more than 0 seconds, not {self.deadline_s:g}")

    def plugin(self, name: str, default: Any) -> Any:
        """Capability ``name``'s options value, or ``default`` when none was given."""
        value = self.plugins.get(name)
        return default if value is None else value


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
    # Complete streams of the step being run, still under their .partial name: (partial, final). They take their
    # final names only once the step's artifact is written (commit_streams), so a step that fails later leaves
    # the earlier artifact and every raw file it rests on as they were.
    staged: list[tuple[Path, Path]] = field(default_factory=list)

    @property
    def run_id(self) -> str | None:
        return self.run.run_id if self.run is not None else None

    def path(self, name: str) -> Path:
        return self.out / name

    def write_json(self, name: str, value: Any) -> Path:
        """Write an artifact with the run's id beside its fields, atomically, and put it in the run's manifest;
        then the step's complete streams take their final names (:meth:`commit_streams`)."""
        doc = runmeta.stamp(value, self.run_id) if self.run_id else value
        path = write_json(self.path(name), doc, self.out)
        self.record(path)
        self.commit_streams()
        return path

    def write_bytes(self, name: str, data: bytes) -> Path:
        path = write_bytes_atomic(self.path(name), data, self.out)
        self.record(path, data)
        return path

    def stream_path(self, name: str) -> Path:
        """Where the complete stream of request ``name`` is now: its .partial name until the step commits it."""
        final = self.out / RAW_DIR / f"{name}.sse"
        for partial, staged_final in self.staged:
            if staged_final == final:
                return partial
        return final

    def commit_streams(self) -> list[Path]:
        """Rename the step's complete streams to their final names and put them in the manifest. Called when the
        step's artifact is written and again when the step returns (the lab's run_step); a no-op when nothing
        is staged. Until then an earlier run's raw/<name>.sse, which its artifact's evidence is, stays."""
        done = []
        while self.staged:
            partial, final = self.staged.pop(0)
            _rename_in_place(partial, final)
            self.record(final)
            done.append(final)
        return done

    def record(self, path: Path, data: bytes | None = None) -> None:
        """A file this step wrote some other way (a renamed raw stream, a WAV): into the manifest."""
        if self.run is not None:
            self.run.record_file(path, data)

    def request(self, name: str, messages: list[dict[str, str]], max_tokens: int = 64, cache_prompt: bool = True,
                raw_path: Path | None = None, on_chunk: Callable[[sse.Chunk], None] | None = None,
                **options: Any) -> sse.StreamResult:
        """One timed streaming request, its raw bytes saved as evidence.

        The bytes go to ``raw/<name>.sse.partial`` as they arrive, a new file created without following any link
        (a link planted there, or a raw/ that is a link, is refused). A complete stream is renamed to
        ``raw/<name>.sse`` (or ``raw_path``): at once without a run, else when the step's artifact is written
        (:meth:`commit_streams`), so a failure keeps what arrived without replacing an earlier complete file.
        ``on_chunk`` also sees every content chunk as it arrives (the speak step's TTS).
        """
        final = raw_path or self.out / RAW_DIR / f"{name}.sse"
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputDirError(
                f"cannot create the folder for raw streams {final.parent}: {exc.strerror or exc}"
            ) from exc
        partial = final.with_name(final.name + PARTIAL_SUFFIX)
        self.staged[:] = [entry for entry in self.staged if entry[1] != final]  # a repeat of the name: this one
        raw_file = _create_partial(partial, final)
        tokens = 0

        def count_chunk(chunk: sse.Chunk) -> None:
            nonlocal tokens
            if on_chunk is not None:  # first: the caller's reaction to a chunk is part of what is timed
                on_chunk(chunk)
            tokens += 1
            self.progress.update(f"{name}: {tokens} token{'' if tokens == 1 else 's'}, {chunk.t_ms / 1000:.1f} s")

        self.progress.update(f"{name}: waiting for the first token")
        if self.capabilities is not None:  # the model name, and the usage request where timings are missing
            for key, value in self.capabilities.request_options().items():
                options.setdefault(key, value)
        try:
            with raw_file:
                result = self.client.chat(messages, max_tokens, cache_prompt, raw_out=raw_file, on_chunk=count_chunk,
                                          **options)
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
        self.staged.append((partial, final))
        if self.run is None:  # a step called on its own (unit tests): no artifact to wait for
            self.commit_streams()
        self.ledger.add(result.timings)
        return result


def _create_partial(partial: Path, final: Path) -> BinaryIO:
    """``partial`` as a new binary file for the stream: never through a link (raw/ or the file itself), a stale
    .partial of an earlier attempt removed first; a link at the final name is refused before any request."""
    try:
        dir_fd = open_folder(partial.parent)
    except OSError as exc:
        raise OutputDirError(f"cannot open the folder for raw streams {partial.parent}: {exc.strerror or exc}") from exc
    try:
        refuse_link(dir_fd, final.name, final)
        try:
            fd = create_exclusive(dir_fd, partial.name, partial)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror or str(exc), str(partial)) from exc
    finally:
        os.close(dir_fd)
    return os.fdopen(fd, "wb")


def _rename_in_place(partial: Path, final: Path) -> None:
    """partial -> final in their folder, by its descriptor; a link put at the final name meanwhile is refused."""
    dir_fd = open_folder(final.parent)
    try:
        refuse_link(dir_fd, final.name, final)
        os.replace(partial.name, final.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def _drop_if_empty(partial: Path) -> int:
    """Remove ``partial`` if nothing was written to it; return its size (0 when removed or absent)."""
    try:
        size = os.lstat(partial).st_size
    except OSError:
        return 0
    if not size:
        partial.unlink(missing_ok=True)
    return size
