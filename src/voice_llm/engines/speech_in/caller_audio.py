"""The caller's side of the call: each line as 16 kHz mono int16 speech, and where its speech truly is.

Two sources. By default the clinic call's caller lines are synthesized once per run with Piper (the capability
that speaks them does it) and resampled here from Piper's 22.05 kHz to the 16 kHz that Silero and Whisper take
(voice_llm.engines.audio's resampler, PyAV's libswresample). ``--caller-audio DIR`` takes the user's own recordings instead
(:func:`load_folder`): one WAV per turn in name order, any format PyAV decodes (a file that is not 16-bit mono 16 kHz
PCM is converted and the artifact says from what), with the user's own transcripts and barge-in plan beside them
(``script.txt`` or a ``.txt`` per WAV; ``barge-in.txt``). Without transcripts the word error rate is not checkable:
the loader never scores the user's audio against the bundled script.

Every file is opened without blocking and refused unless it is a regular file (a FIFO or a link to /dev/zero named
``.wav`` would hang or never end), and decoded incrementally: decoding stops as soon as the input passes
MAX_UTTERANCE_S, so memory is bounded by one decoded frame plus 30 s of 16 kHz output whatever the file's header
says (a 2 MB FLAC can hold hours of silence).

The true start and end of an utterance come from its samples alone: the first and the last sample whose magnitude
is above the noise floor (:func:`noise_floor`). Everything downstream (VAD, endpoint) is timed against them.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from voice_llm.engines.audio.resampling import Resampler, to_rate
from voice_llm.core.errors import ConfigError

SAMPLE_RATE = 16000  # Silero and Whisper both take 16 kHz mono
FRAME_SAMPLES = 512  # Silero's frame: 32 ms at 16 kHz
LEAD_MS = 300  # silence before each utterance: the VAD sees silence first, as on a line that was quiet
CALLER_LENGTH_SCALE = 1.1  # Piper's phoneme length factor for the caller: 10 % slower than the assistant (1.0)
# Piper's two noise terms off for the caller: the same line gives the same samples every run (its default noise
# varies the pauses: "Okay. Do you take..." paused 7-10 frames, so the 300 ms endpoint split it in some runs only).
# At 1.1 the longest pause inside lines 1-4 is 9 frames (288 ms), under the default endpoint (10 frames).
CALLER_NOISE_SCALE = 0.0
CALLER_NOISE_W_SCALE = 0.0
# The noise floor: a sample is speech-level when its magnitude is above this. 100 of 32768 is -50.3 dBFS: Piper's
# silence is digital zero and its quietest speech sounds are above -45 dBFS. For a recording with louder background
# noise the floor is raised to NOISE_FACTOR x the loudest sample of its quietest 32 ms frame, but never above
# FLOOR_MAX (-30.3 dBFS): a recording with no quiet frame at all has no background to measure (see noise_floor).
FLOOR_MIN = 100
FLOOR_MAX = 1000
NOISE_FACTOR = 2.0
MAX_UTTERANCE_S = 30.0  # Whisper's window: a longer turn would be cut by the recognizer
MAX_FILE_BYTES = 64 * 1024 * 1024
# Sample rates a recording can honestly have: 4 kHz (2 kHz of bandwidth, below telephony's 8 kHz) to 384 kHz (the
# highest rate audio interfaces record). A header outside it is refused before any resampler is built: libswresample
# allocates filter tables by the rate ratio (2147483647 Hz raised av.error.MemoryError).
MIN_RATE = 4000
MAX_RATE = 384000
MAX_TURNS = 50  # a call of 50 turns of at most 30 s each: at most 48 MB of 16 kHz int16 held for the call
MAX_TEXT_BYTES = 64 * 1024  # script.txt, a transcript, barge-in.txt: text, not data
SCRIPT_FILE = "script.txt"  # one line per turn, in turn order (the WAVs' name order)
BARGE_IN_FILE = "barge-in.txt"  # the turns the caller cuts into: "3", "2 4", "2, 4", or "none"


class CallerAudioError(ConfigError):
    """The caller's audio cannot be used: a DIR without WAVs, a file that is not audio, a turn with no speech."""


@dataclass(frozen=True)
class Utterance:
    """One turn's caller audio as it is fed: LEAD_MS of silence, then the speech (16 kHz mono int16)."""

    index: int  # 1-based turn number
    script: str | None  # what the caller says (the WER reference); None: the user gave no transcript
    samples: np.ndarray  # int16, lead silence included
    source: str  # "synthesized" or the file it came from
    converted_from: str | None  # the file's own format when it was not 16-bit mono 16 kHz PCM; else None
    floor: int  # the noise floor used for this utterance (|sample| > floor is speech-level)
    start: int  # first sample above the floor (index into samples)
    end: int  # one past the last sample above the floor

    @property
    def speech_start_ms(self) -> float:
        return self.start * 1000.0 / SAMPLE_RATE

    @property
    def speech_end_ms(self) -> float:
        """The end of the last sample above the floor, from the start of ``samples``."""
        return self.end * 1000.0 / SAMPLE_RATE

    @property
    def duration_ms(self) -> float:
        return len(self.samples) * 1000.0 / SAMPLE_RATE

    def speech(self) -> np.ndarray:
        return self.samples[self.start:self.end]


def noise_floor(samples: np.ndarray, carried: Sequence[tuple[int, int]] | None = None) -> int:
    """FLOOR_MIN, or NOISE_FACTOR x the peak of the quietest whole FRAME_SAMPLES frame when that is louder (a noisy
    recording: its background would otherwise count as speech to the very end), at most FLOOR_MAX. ``carried``:
    the [start, end) spans of ``samples`` that carried audio (the frames are taken inside them only): the digital
    silence put around the audio (a lead-in, an idle playout buffer's padding) is no background, and would hold
    the floor at FLOOR_MIN whatever the audio's own noise (issue 41 item 3)."""
    spans = [(0, len(samples))] if carried is None else carried
    quietest: int | None = None
    for start, end in spans:
        start, end = max(0, start), min(len(samples), end)
        whole = max(0, end - start) // FRAME_SAMPLES
        if whole:
            part = np.abs(samples[start:start + whole * FRAME_SAMPLES].astype(np.int32))
            peak = int(part.reshape(whole, FRAME_SAMPLES).max(axis=1).min())
            quietest = peak if quietest is None else min(quietest, peak)
    if quietest is None:
        return FLOOR_MIN
    return min(FLOOR_MAX, max(FLOOR_MIN, int(NOISE_FACTOR * quietest)))


def lead_samples(rate: int) -> int:
    """The LEAD_MS of digital silence before each caller line's own audio, at ``rate``."""
    return LEAD_MS * rate // 1000


def sound_mask(samples: np.ndarray, floor: int, min_samples: int = 1) -> np.ndarray:
    """Per sample: is it sound. A sample above ``floor`` is sound when it belongs to a run of such samples lasting
    at least ``min_samples`` (samples above the floor less than ``min_samples`` apart are one run; the run lasts
    from its first to its last): a click, or a spike of noise shorter than a frame, is no sound."""
    loud = np.abs(samples.astype(np.int32)) > floor
    if min_samples <= 1:
        return loud
    at = np.flatnonzero(loud)
    if at.size == 0:
        return loud
    breaks = np.flatnonzero(np.diff(at) >= min_samples)
    firsts = np.concatenate([[0], breaks + 1])
    lasts = np.concatenate([breaks, [at.size - 1]])
    short = at[lasts] - at[firsts] + 1 < min_samples  # per run: shorter than min_samples
    loud[at[np.repeat(short, lasts - firsts + 1)]] = False
    return loud


def audible_span(samples: np.ndarray, floor: int, min_samples: int = 1) -> tuple[int, int] | None:
    """(first sample that is sound, one past the last) by :func:`sound_mask`, or None when no sample is."""
    loud = np.flatnonzero(sound_mask(samples, floor, min_samples))
    if loud.size == 0:
        return None
    return int(loud[0]), int(loud[-1]) + 1


def _check_rate(rate: int, what: str) -> None:
    if not MIN_RATE <= rate <= MAX_RATE:
        raise CallerAudioError(f"{what} says its sample rate is {rate} Hz; a recording has {MIN_RATE}-{MAX_RATE} Hz")


# Full scale of each sample format PyAV hands out (planar or packed): to float in [-1, 1] before the mix-down.
_SCALE = {"u8": 128.0, "s16": 32768.0, "s32": 2147483648.0, "s64": 9223372036854775808.0, "flt": 1.0, "dbl": 1.0}


def mix_down(samples: np.ndarray, channels: int, fmt: str = "s16", planar: bool = False) -> np.ndarray:
    """Interleaved (or, ``planar``, channel-major) ``samples`` of any channel count -> mono float32 in [-1, 1], the
    mean of the channels (libswresample has no default layout for 3 or more unnamed channels: we mix ourselves)."""
    base = fmt[:-1] if fmt.endswith("p") and fmt[:-1] in _SCALE else fmt
    if base not in _SCALE:
        raise CallerAudioError(f"sample format {fmt!r} is not one of {', '.join(_SCALE)}")
    data = np.asarray(samples).astype(np.float32).reshape(-1)
    if base == "u8":
        data = data - 128.0
    data = data / np.float32(_SCALE[base])
    if channels == 1:
        return data
    whole = len(data) // channels * channels
    shaped = data[:whole].reshape(channels, -1).T if planar else data[:whole].reshape(-1, channels)
    return shaped.mean(axis=1, dtype=np.float32)


def resample(samples: np.ndarray, rate: int, channels: int = 1, fmt: str = "s16") -> np.ndarray:
    """Interleaved ``samples`` (``fmt``: s16, s32, flt, u8, ...) at ``rate``, any channel count -> 16 kHz mono int16
    (channels averaged, then voice_llm.engines.audio's resampler). ``rate`` outside MIN_RATE-MAX_RATE is refused."""
    if channels < 1:
        raise CallerAudioError(f"audio with {channels} channels")
    _check_rate(rate, "the audio")
    return to_rate(mix_down(samples, channels, fmt), rate, SAMPLE_RATE)


def utterance(index: int, script: str | None, speech: np.ndarray, source: str, converted_from: str | None,
               what: str) -> Utterance:
    samples = np.concatenate([np.zeros(LEAD_MS * SAMPLE_RATE // 1000, np.int16), speech.astype(np.int16)])
    if len(speech) > MAX_UTTERANCE_S * SAMPLE_RATE:
        raise CallerAudioError(f"turn {index} ({what}) is {len(speech) / SAMPLE_RATE:.1f} s long; a turn may be at "
                               f"most {MAX_UTTERANCE_S:.0f} s (Whisper's window)")
    floor = noise_floor(speech)
    span = audible_span(samples, floor)
    if span is None:
        raise CallerAudioError(f"no speech detected in turn {index} ({what}: no sample above the noise floor "
                               f"of {floor} = {20 * np.log10(floor / 32768):.1f} dBFS)")
    return Utterance(index, script, samples, source, converted_from, floor, span[0], span[1])




# ---------------------------------------------------------------------------------------------------------------
# The user's own recordings


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _not_regular(path: Path, mode: int) -> str:
    """'caller-01.wav is a link to /dev/zero (a character device)', 'caller-01.wav is a FIFO'."""
    if path.is_symlink():
        return f"{path.name} is a link to {os.path.realpath(path)} ({_kind(mode)}), not a regular file"
    return f"{path.name} is {_kind(mode)}, not a regular file"


def _open_regular(path: Path, what: str) -> tuple[BinaryIO, int]:
    """``path`` opened for reading without blocking (a FIFO with no writer would block ``open`` itself), and its
    size; refused unless it is a regular file (checked on the open descriptor: no window between check and use)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise CallerAudioError(f"cannot read {what}: {exc.strerror or exc}") from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise CallerAudioError(f"{what}: {_not_regular(path, info.st_mode)}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb"), info.st_size


def read_text(path: Path, what: str) -> str:
    """A small UTF-8 text file (a transcript, the script, the barge-in plan), refused in one line otherwise."""
    handle, size = _open_regular(path, what)
    with handle:
        if size > MAX_TEXT_BYTES:
            raise CallerAudioError(f"{what} is {size} bytes; a text file here is at most {MAX_TEXT_BYTES} bytes")
        data = handle.read(MAX_TEXT_BYTES + 1)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CallerAudioError(f"{what} is not UTF-8 text (byte {exc.start})") from exc


def caller_files(folder: Path) -> list[Path]:
    """The WAVs in ``folder`` in name order (one per turn); an entry named .wav that is not a regular file (a FIFO,
    a link to /dev/zero, a folder) is refused by name, never skipped (skipping it would shift every later turn)."""
    if not folder.is_dir():
        raise CallerAudioError(f"--caller-audio {folder} is not a folder")
    try:
        entries = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".wav")
    except OSError as exc:
        raise CallerAudioError(f"cannot list --caller-audio {folder}: {exc.strerror or exc}") from exc
    for path in entries:
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            raise CallerAudioError(f"--caller-audio {folder}: cannot read {path.name}: {exc.strerror or exc}") from exc
        if not stat.S_ISREG(mode):
            raise CallerAudioError(f"--caller-audio {folder}: {_not_regular(path, mode)}; each turn's WAV must be one")
    if not entries:
        raise CallerAudioError(f"--caller-audio {folder} holds no .wav file (one per turn, in name order)")
    if len(entries) > MAX_TURNS:
        raise CallerAudioError(f"--caller-audio {folder} holds {len(entries)} WAVs; a call has at most {MAX_TURNS} "
                               "turns")
    return entries


def _header_seconds(container: Any, stream: Any) -> float | None:
    """The duration the container's header states (FLAC's STREAMINFO, WAV's data size), or None when it states none."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000  # AV_TIME_BASE
    return None


def _decode(handle: BinaryIO, what: str) -> tuple[np.ndarray, str | None]:
    """Any audio PyAV decodes, frame by frame, as 16 kHz mono int16 and its own format (None: it was already 16-bit
    mono 16 kHz PCM, taken sample for sample). Stops with one line as soon as the input passes MAX_UTTERANCE_S."""
    import av

    try:
        with av.open(handle, mode="r") as container:
            if not container.streams.audio:
                raise CallerAudioError(f"{what} holds no audio stream")
            stream = container.streams.audio[0]
            codec, rate, channels = stream.codec_context.name, int(stream.rate or 0), int(stream.channels or 0)
            _check_rate(rate, what)
            if channels < 1:
                raise CallerAudioError(f"{what} says it has {channels} channels")
            described = f"{codec}, {channels} channel(s), {rate} Hz"
            stated = _header_seconds(container, stream)
            if stated is not None and stated > MAX_UTTERANCE_S:
                raise CallerAudioError(f"{what} is {stated:.1f} s long (its header says); a turn may be at most "
                                       f"{MAX_UTTERANCE_S:.0f} s (Whisper's window)")
            as_is = (codec, rate, channels) == ("pcm_s16le", SAMPLE_RATE, 1)
            limit = int(MAX_UTTERANCE_S * rate)  # input samples: decoding stops past it, whatever the header said
            resampler = None if as_is else Resampler(rate, SAMPLE_RATE)
            out: list[np.ndarray] = []
            taken = 0
            for frame in container.decode(stream):
                if frame.sample_rate != rate or len(frame.layout.channels) != channels:
                    raise CallerAudioError(f"{what} changes from {rate} Hz, {channels} channel(s) to "
                                           f"{frame.sample_rate} Hz, {len(frame.layout.channels)} channel(s) mid-file")
                taken += frame.samples
                if taken > limit:
                    raise CallerAudioError(f"{what} is longer than {MAX_UTTERANCE_S:.0f} s (decoding stopped there); a "
                                           f"turn may be at most {MAX_UTTERANCE_S:.0f} s (Whisper's window)")
                data = frame.to_ndarray()
                if resampler is None:
                    out.append(data.reshape(-1).astype(np.int16))
                else:
                    fmt = frame.format.name
                    out.append(resampler.push(mix_down(data, channels, fmt, frame.format.is_planar)))
            if resampler is not None:
                out.append(resampler.flush())
    except CallerAudioError:
        raise
    except Exception as exc:  # av.error.* (InvalidDataError, ...) derive from Exception only
        raise CallerAudioError(f"{what} is not a WAV or audio file PyAV can read: {str(exc)[:160]}") from exc
    speech = np.concatenate(out) if out else np.zeros(0, np.int16)
    return speech, (None if as_is else described)


def load_file(path: Path, index: int, script: str | None) -> Utterance:
    """One user recording as turn ``index``: 16-bit mono 16 kHz PCM taken as is, anything else converted;
    ``script`` is its transcript (None: the user gave none, the WER is not checkable)."""
    what = str(path)
    handle, size = _open_regular(path, what)
    with handle:
        if size > MAX_FILE_BYTES:
            raise CallerAudioError(f"{what} is {size // (1024 * 1024)} MB; at most "
                                   f"{MAX_FILE_BYTES // (1024 * 1024)} MB")
        speech, converted = _decode(handle, what)
    return utterance(index, script, speech, what, converted, what)


# ---------------------------------------------------------------------------------------------------------------
# A folder of the user's turns: the WAVs, their transcripts, the barge-in plan


@dataclass(frozen=True)
class CallerAudio:
    """What ``--caller-audio DIR`` holds, loaded and checked before the call.

    ``utterances``: every WAV in name order (turn 1, 2, ...); each ``script`` is the user's transcript, or None for
    all of them when the folder has none (then :attr:`wer_checkable` is False: never score against another script).
    ``scripts_from``: ``"script.txt"``, ``"a .txt beside each WAV"``, or None. ``barge_in_turns``: the turns the
    user's ``barge-in.txt`` names (``()``: it says "none"), or None when the folder has no such file (the caller of
    this module applies its default then, see :func:`select_turns`)."""

    folder: str
    utterances: tuple[Utterance, ...]
    scripts_from: str | None
    barge_in_turns: tuple[int, ...] | None

    @property
    def wer_checkable(self) -> bool:
        return self.scripts_from is not None

    @property
    def wer_unknown(self) -> str | None:
        """Why the WER cannot be checked (for the artifact's ``unknown``), or None when it can."""
        if self.scripts_from is not None:
            return None
        return (f"not checkable: {self.folder} has no transcripts ({SCRIPT_FILE}, one line per WAV, or a .txt "
                "beside each WAV with the same name)")

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.folder, "files": [u.source for u in self.utterances],
                "converted_from": [u.converted_from for u in self.utterances], "script": self.scripts_from,
                "barge_in_from": BARGE_IN_FILE if self.barge_in_turns is not None else None}


def _scripts(folder: Path, files: Sequence[Path]) -> tuple[list[str | None], str | None]:
    """The user's transcripts, one per WAV: script.txt (one non-blank line per WAV, in the WAVs' name order) or a
    ``<name>.txt`` beside every ``<name>.wav``; never both, never some WAVs only."""
    script_file = folder / SCRIPT_FILE
    beside = [path.with_suffix(".txt") for path in files]
    have = [p for p in beside if os.path.lexists(p) and p.name != SCRIPT_FILE]
    if os.path.lexists(script_file):
        if have:
            raise CallerAudioError(f"--caller-audio {folder} holds both {SCRIPT_FILE} and {have[0].name}: give the "
                                   f"transcripts one way ({SCRIPT_FILE}, or a .txt beside each WAV)")
        lines = [line.strip() for line in read_text(script_file, str(script_file)).splitlines() if line.strip()]
        if len(lines) != len(files):
            raise CallerAudioError(f"{script_file} has {len(lines)} line(s) but {folder} holds {len(files)} WAV(s): "
                                   "one line per WAV, in the WAVs' name order")
        return list(lines), SCRIPT_FILE
    if not have:
        return [None] * len(files), None
    scripts: list[str | None] = []
    for wav, txt in zip(files, beside):
        if not os.path.lexists(txt):
            raise CallerAudioError(f"--caller-audio {folder}: {wav.name} has no {txt.name} beside it, but "
                                   f"{have[0].name} is there (a transcript beside each WAV, or none)")
        text = " ".join(read_text(txt, str(txt)).split())
        if not text:
            raise CallerAudioError(f"{txt} is empty (the transcript of {wav.name})")
        scripts.append(text)
    return scripts, "a .txt beside each WAV"


def parse_barge_in(text: str, what: str) -> tuple[int, ...]:
    """'3', '2 4', '2, 4' -> (2, 4); 'none' or nothing -> (). Turn numbers are 1-based; each names the turn whose
    reply the caller cuts into (with the next turn's line)."""
    words = [w for w in re.split(r"[\s,]+", text.strip()) if w]
    if not words or [w.lower() for w in words] == ["none"]:
        return ()
    turns = []
    for word in words:
        if not word.isdigit() or int(word) < 1:
            raise CallerAudioError(f"{what}: {word!r} is not a turn number (write e.g. '3' or '2 4', or 'none')")
        turns.append(int(word))
    return tuple(sorted(set(turns)))


def load_folder(folder: Path) -> CallerAudio:
    """The user's call: every WAV in ``folder`` (name order; see :func:`caller_files`), converted to 16 kHz mono,
    with the user's transcripts (:data:`SCRIPT_FILE` or a .txt per WAV; none: scripts are None) and barge-in plan
    (:data:`BARGE_IN_FILE`; none: None). Any bad file is one CallerAudioError naming it."""
    files = caller_files(folder)
    scripts, scripts_from = _scripts(folder, files)
    plan_file = folder / BARGE_IN_FILE
    barge_in = None
    if os.path.lexists(plan_file):
        barge_in = parse_barge_in(read_text(plan_file, str(plan_file)), str(plan_file))
        for turn in barge_in:
            if turn + 1 > len(files):
                raise CallerAudioError(f"{plan_file} names turn {turn}, but the caller cuts in with the next turn's "
                                       f"line and {folder} holds {len(files)} WAV(s)")
    utterances = tuple(load_file(path, i, scripts[i - 1]) for i, path in enumerate(files, start=1))
    return CallerAudio(str(folder), utterances, scripts_from, barge_in)


@dataclass(frozen=True)
class CallerTurns:
    """The turns a call with the user's audio will have: ``notes`` are one line each for stderr and the artifact
    (nothing about the user's folder is changed silently)."""

    utterances: tuple[Utterance, ...]
    barge_in_turns: tuple[int, ...]
    notes: tuple[str, ...]


def select_turns(audio: CallerAudio, turns: int | None, barge_in_turns: Sequence[int] | None, *,
                 default_turns: int, default_barge_in: Sequence[int]) -> CallerTurns:
    """Which of ``audio``'s turns the call has and where the caller cuts in.

    ``turns``: the user's ``--turns`` (None: not given, every WAV); more than the folder holds is refused.
    ``barge_in_turns``: the user's flag (None: not given); else the folder's barge-in.txt; else ``default_barge_in``,
    keeping only the turns the call can have (a barge-in into turn k needs turn k+1's line): the rest are named in a
    note. Fewer WAVs than ``default_turns`` is a note too."""
    have = len(audio.utterances)
    notes: list[str] = []
    if turns is None:
        count = have
        if have < default_turns:
            notes.append(f"--caller-audio {audio.folder} holds {have} WAV(s): a {have}-turn call (the default call "
                         f"has {default_turns} turns)")
    elif turns > have:
        raise CallerAudioError(f"--turns {turns}, but --caller-audio {audio.folder} holds {have} WAV(s) (one per "
                               "turn)")
    else:
        count = turns
        if turns < have:
            notes.append(f"--turns {turns}: the call uses the first {turns} of the {have} WAVs in "
                         f"{audio.folder}")
    if barge_in_turns is not None or audio.barge_in_turns is not None:
        source = "--barge-in-turns" if barge_in_turns is not None else str(Path(audio.folder) / BARGE_IN_FILE)
        chosen = tuple(sorted(set(barge_in_turns if barge_in_turns is not None else audio.barge_in_turns or ())))
        for turn in chosen:
            if turn < 1 or turn + 1 > count:
                raise CallerAudioError(f"{source} names turn {turn}, but a {count}-turn call has no turn "
                                       f"{turn + 1} to cut in with")
    else:
        chosen = tuple(t for t in sorted(set(default_barge_in)) if t + 1 <= count)
        dropped = [t for t in sorted(set(default_barge_in)) if t + 1 > count]
        if dropped:
            notes.append(f"no barge-in into turn {', '.join(map(str, dropped))}: it needs "
                         f"{dropped[0] + 1} turns, the call has {count} (name the turns in "
                         f"{Path(audio.folder) / BARGE_IN_FILE})")
    return CallerTurns(audio.utterances[:count], chosen, tuple(notes))
