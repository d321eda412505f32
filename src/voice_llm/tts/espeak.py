"""espeak-ng (formant synthesis, Debian package): the light alternative, run as a subprocess without a shell.

The text goes to the program's stdin (never on its command line, so no text is read as an option) and the
WAV comes from ``--stdout``; audio is yielded as the program writes it.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import time
from collections.abc import Iterator

from voice_llm.errors import SynthesisError, TTSUnavailableError, VoiceFileError
from voice_llm.tts.engine import SAMPLE_WIDTH, AudioChunk

PROGRAM = "espeak-ng"
DEFAULT_VOICE = "en-us"
WAV_HEADER = 44  # espeak-ng writes the canonical 44-byte PCM header (sizes unknown while streaming)
READ_SIZE = 8192
INSTALL_HINT = "apt-get install espeak-ng (Debian/Ubuntu), or use the default engine: --tts piper"


def _sample_rate(header: bytes) -> int:
    """The rate from a canonical WAV header, checking it is mono 16-bit PCM."""
    if len(header) < WAV_HEADER or header[:4] != b"RIFF" or header[8:12] != b"WAVE" or header[12:16] != b"fmt ":
        raise SynthesisError(f"{PROGRAM} did not write a WAV header: {header[:16]!r}")
    fmt, channels, rate, _, _, bits = struct.unpack("<HHIIHH", header[20:36])
    if fmt != 1 or channels != 1 or bits != 8 * SAMPLE_WIDTH:
        raise SynthesisError(f"{PROGRAM} wrote format {fmt}, {channels} channels, {bits} bits; expected mono 16-bit PCM")
    return rate


class EspeakEngine:
    name = "espeak"

    def __init__(self, voice: str | None = None, program: str = PROGRAM) -> None:
        found = shutil.which(program)
        if found is None:
            raise TTSUnavailableError(f"{program} is not installed: {INSTALL_HINT}")
        self._program = found
        self.voice = voice or DEFAULT_VOICE
        self.sample_rate = 0
        try:
            for _ in self.synthesize("Hello."):  # learns the sample rate, proves the voice exists
                pass
        except SynthesisError as exc:
            raise VoiceFileError(f"{program} cannot use voice {self.voice!r}: {exc}") from exc

    def synthesize(self, text: str) -> Iterator[AudioChunk]:
        proc = subprocess.Popen([self._program, "-v", self.voice, "--stdout"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(text.encode("utf-8"))
            proc.stdin.close()
            header = proc.stdout.read(WAV_HEADER)
            if header:
                self.sample_rate = _sample_rate(header)
            pending = b""
            while data := proc.stdout.read1(READ_SIZE):
                pending += data
                whole = len(pending) - len(pending) % SAMPLE_WIDTH
                if whole:
                    yield AudioChunk(pending[:whole], time.perf_counter())
                    pending = pending[whole:]
            code = proc.wait()
            if code != 0 or not header:
                error = (proc.stderr.read() if proc.stderr else b"").decode("utf-8", "replace").strip()
                raise SynthesisError(f"{PROGRAM} exited with {code} on {text[:60]!r}: {error or 'no output'}")
        finally:
            if proc.poll() is None:  # the consumer stopped early: do not leave the program behind
                proc.kill()
                proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()

    def versions(self) -> dict[str, str]:
        out = subprocess.run([self._program, "--version"], capture_output=True, text=True, check=False).stdout
        # "eSpeak NG text-to-speech: 1.51  Data at: ..."
        version = out.split(":", 1)[1].split()[0] if ":" in out else out.strip()
        return {PROGRAM: version}
