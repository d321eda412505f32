"""espeak-ng (formant synthesis, Debian package): the light alternative, run as a subprocess without a shell.

The text goes to the program's stdin (never on its command line, so no text is read as an option) and the
WAV comes from ``--stdout``; audio is yielded as the program writes it.

Every run of the program is bounded by the engine's ``deadline_s`` (the lab's ``--deadline``) on the wall clock:
its output is read with ``select``, never with a blocking read, and a program that has not finished by then is
stopped with its whole process group (:func:`voice_llm.core.util.children.running`), as it is when the consumer stops early
or an interrupt (Ctrl-C, SIGTERM) arrives.
"""

from __future__ import annotations

import math
import os
import selectors
import shutil
import struct
import subprocess
import time
from collections.abc import Iterator
from typing import IO

from voice_llm.core.util.children import running
from voice_llm.core.errors import SynthesisError, SynthesisTimeoutError, TTSUnavailableError, VoiceFileError
from voice_llm.engines.audio.wav import SAMPLE_WIDTH
from voice_llm.engines.speech_out.engine import AudioChunk

PROGRAM = "espeak-ng"
DEFAULT_VOICE = "en-us"
WAV_HEADER = 44  # espeak-ng writes the canonical 44-byte PCM header (sizes unknown while streaming)
READ_SIZE = 8192
STDERR_KEPT = 4096  # bytes of the program's stderr kept for the error message
STOP_TIMEOUT_S = 1.0  # espeak-ng quits at once on SIGTERM; SIGKILL after this
INSTALL_HINT = "apt-get install espeak-ng (Debian/Ubuntu), or use the default engine: --tts piper"


def _sample_rate(header: bytes) -> int:
    """The rate from a canonical WAV header, checking it is mono 16-bit PCM."""
    if len(header) < WAV_HEADER or header[:4] != b"RIFF" or header[8:12] != b"WAVE" or header[12:16] != b"fmt ":
        raise SynthesisError(f"{PROGRAM} did not write a WAV header: {header[:16]!r}")
    fmt, channels, rate, _, _, bits = struct.unpack("<HHIIHH", header[20:36])
    if fmt != 1 or channels != 1 or bits != 8 * SAMPLE_WIDTH:
        raise SynthesisError(f"{PROGRAM} wrote format {fmt}, {channels} channels, {bits} bits; expected mono 16-bit PCM")
    return rate


class _Output:
    """A running program's stdout, read as it comes and never past ``deadline`` (a ``perf_counter`` time); its
    stderr is drained alongside (a full stderr pipe would stall the program) and its start kept."""

    def __init__(self, proc: subprocess.Popen[bytes], deadline: float, what: str) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self._proc, self._deadline, self._what = proc, deadline, what
        self._stdout: IO[bytes] = proc.stdout
        self._selector = selectors.DefaultSelector()
        self._selector.register(proc.stdout, selectors.EVENT_READ)
        self._selector.register(proc.stderr, selectors.EVENT_READ)
        self._stdout_open = True
        self.stderr = b""

    def close(self) -> None:
        self._selector.close()

    def _wait_s(self) -> float:
        remaining = self._deadline - time.perf_counter()
        if remaining <= 0:
            raise SynthesisTimeoutError(f"{PROGRAM} did not finish {self._what}; it was stopped")
        return min(remaining, 3600.0)

    def _take(self) -> bytes:
        """One select round: stdout's bytes read in it (b"" when only stderr had some, or an end was seen)."""
        got = b""
        for key, _ in self._selector.select(self._wait_s()):
            data = os.read(key.fd, READ_SIZE)
            if not data:
                self._selector.unregister(key.fileobj)
                if key.fileobj is self._stdout:
                    self._stdout_open = False
            elif key.fileobj is self._stdout:
                got += data
            else:
                self.stderr = (self.stderr + data)[:STDERR_KEPT]
        return got

    def read(self) -> bytes:
        """The next bytes of stdout; b"" at its end."""
        while self._stdout_open:
            if data := self._take():
                return data
        return b""

    def read_header(self) -> bytes:
        header = b""
        while len(header) < WAV_HEADER and (data := self.read()):
            header += data
        return header

    def finish(self) -> int:
        """Read both pipes to their end and wait for the program to exit, within the deadline: its exit status."""
        while self._selector.get_map():
            self._take()
        while True:
            try:
                return self._proc.wait(min(self._wait_s(), 0.1))
            except subprocess.TimeoutExpired:
                continue


class EspeakEngine:
    name = "espeak"

    def __init__(self, voice: str | None = None, program: str = PROGRAM, deadline_s: float | None = None) -> None:
        """``deadline_s``: the longest one run of the program may take (None: no limit)."""
        found = shutil.which(program)
        if found is None:
            raise TTSUnavailableError(f"{program} is not installed: {INSTALL_HINT}")
        self._program = found
        self.voice = voice or DEFAULT_VOICE
        self.deadline_s = deadline_s
        self.sample_rate = 0
        try:
            for _ in self.synthesize("Hello."):  # learns the sample rate, proves the voice exists
                pass
        except SynthesisTimeoutError:
            raise  # a hung program, not a bad voice
        except SynthesisError as exc:
            raise VoiceFileError(f"{program} cannot use voice {self.voice!r}: {exc}") from exc

    def _deadline(self) -> float:
        return time.perf_counter() + (math.inf if self.deadline_s is None else self.deadline_s)

    def _what(self, text: str) -> str:
        """How the timeout message names one run."""
        return f"{text[:60]!r}" + ("" if self.deadline_s is None else f" within the deadline of {self.deadline_s:g} s")

    def synthesize(self, text: str) -> Iterator[AudioChunk]:
        deadline = self._deadline()
        with running([self._program, "-v", self.voice, "--stdout"], STOP_TIMEOUT_S, stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
            output = _Output(proc, deadline, self._what(text))
            try:
                assert proc.stdin is not None
                try:
                    proc.stdin.write(text.encode("utf-8"))  # a segment is a sentence: far below a pipe's buffer
                    proc.stdin.close()
                except BrokenPipeError:
                    pass  # the program ended at once: its exit status and stderr say why, below
                header = output.read_header()
                if header:
                    self.sample_rate = _sample_rate(header)
                pending = header[WAV_HEADER:]
                while True:
                    whole = len(pending) - len(pending) % SAMPLE_WIDTH
                    if whole:
                        yield AudioChunk(pending[:whole], time.perf_counter())
                        pending = pending[whole:]
                    data = output.read()
                    if not data:
                        break
                    pending += data
                code = output.finish()
                if code != 0 or not header:
                    error = output.stderr.decode("utf-8", "replace").strip()
                    raise SynthesisError(f"{PROGRAM} exited with {code} on {text[:60]!r}: {error or 'no output'}")
            finally:
                output.close()
                for stream in (proc.stdout, proc.stderr):
                    if stream is not None:
                        stream.close()

    def versions(self) -> dict[str, str]:
        with running([self._program, "--version"], STOP_TIMEOUT_S, stdin=subprocess.DEVNULL,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
            output = _Output(proc, self._deadline(), self._what("--version"))
            try:
                raw = b""
                while data := output.read():
                    raw += data
                output.finish()
            finally:
                output.close()
                for stream in (proc.stdout, proc.stderr):
                    if stream is not None:
                        stream.close()
        out = raw.decode("utf-8", "replace")
        # "eSpeak NG text-to-speech: 1.51  Data at: ..."
        version = out.split(":", 1)[1].split()[0] if ":" in out else out.strip()
        return {PROGRAM: version}
