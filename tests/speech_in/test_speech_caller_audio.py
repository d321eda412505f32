"""Issue 31's caller-audio items against the loader the dialer uses (voice_llm.engines.speech_in.caller_audio): each hostile input
from the issue, refused (or taken) with one line and no traceback; memory bounded whatever a file's header says; the
user's own transcripts and barge-in plan, and WER "not checkable" without them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from speech_builders import flac_bomb, tone, wav_claiming_rate, write_wav

import voice_llm
from voice_llm.core.errors import VoiceLLMError
from voice_llm.engines.speech_in import caller_audio as c


def one_line(info: pytest.ExceptionInfo[BaseException]) -> str:
    """The message the CLI prints: a VoiceLLMError (so no traceback), one line."""
    assert isinstance(info.value, VoiceLLMError) and isinstance(info.value, c.CallerAudioError)
    text = str(info.value)
    assert text and "\n" not in text and "Traceback" not in text
    return text


def folder_of(tmp_path: Path, count: int, name: str = "caller-{:02d}.wav") -> Path:
    folder = tmp_path / "calls"
    folder.mkdir(exist_ok=True)
    for i in range(1, count + 1):
        write_wav(folder / name.format(i), tone(16000, 0.5), 16000)
    return folder


# --- item 1: any channel count --------------------------------------------------------------------------------


@pytest.mark.parametrize("channels", [3, 4, 8])
def test_more_than_two_channels_are_mixed_down(tmp_path: Path, channels: int) -> None:
    # the input: a 16-bit WAV with 3, 4 or 8 channels (av.AudioLayout(int) raised TypeError)
    mono = np.concatenate([np.zeros(1600, np.int16), tone(16000), np.zeros(1600, np.int16)])
    frames = np.zeros((len(mono), channels), np.int16)
    frames[:, 0] = mono  # speech on the first channel only: the mix is the mean of the channels
    u = c.load_file(write_wav(tmp_path / "multi.wav", frames.reshape(-1), 16000, channels), 1, None)
    assert u.converted_from == f"pcm_s16le, {channels} channel(s), 16000 Hz"
    speech = u.samples[c.LEAD_MS * 16:]
    assert len(speech) == len(mono)
    assert np.max(np.abs(speech.astype(int) - mono.astype(int) / channels)) <= 1  # the mean, to the rounding


def test_resample_takes_any_channel_count() -> None:
    mono = tone(22050)
    out = c.resample(np.repeat(mono, 6), 22050, channels=6)
    assert out.dtype == np.int16 and abs(len(out) - 16000) <= 64


# --- item 2: absurd sample rates ------------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [2147483647, 3999, 384001, 1])
def test_an_absurd_sample_rate_is_one_line(tmp_path: Path, rate: int) -> None:
    path = wav_claiming_rate(tmp_path / "fast.wav", rate)
    with pytest.raises(c.CallerAudioError) as info:
        c.load_file(path, 1, None)
    assert one_line(info) == f"{path} says its sample rate is {rate} Hz; a recording has 4000-384000 Hz"
    with pytest.raises(c.CallerAudioError, match=f"sample rate is {rate} Hz"):
        c.resample(tone(16000), rate)


def test_the_rate_bounds_themselves_load(tmp_path: Path) -> None:
    for rate in (c.MIN_RATE, 8000, 48000):
        u = c.load_file(write_wav(tmp_path / f"{rate}.wav", tone(rate), rate), 1, None)
        assert abs(len(u.speech()) - 16000) <= 64 + 2 * 16  # a second, give or take the filter and the sine's zeros


# --- item 3: memory bounded whatever the file says ------------------------------------------------------------

# Peak RSS bound: loading any single file adds at most this much to a process that has already loaded one small
# file (numpy, PyAV and its codecs mapped). The output is at most 30 s of 16 kHz int16 (0.96 MB); decoding holds one
# frame at a time. Measured here: +0.0 MB for the 3 h FLAC refused by its header, +0.8 MB when the header states no
# length and decoding stops at 30 s (child peak ~50 MB in all). The issue measured 2.45 GB before the fix.
RSS_BOUND_MB = 16
CHILD = """
import json, resource, sys
from pathlib import Path
from voice_llm.engines.speech_in import caller_audio as c
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a regression fails here, not on the shared machine
c.load_file(Path(sys.argv[1]), 1, None)
out = {"warm_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "files": []}
for name in sys.argv[2:]:
    try:
        c.load_file(Path(name), 1, None)
        error = None
    except c.CallerAudioError as exc:
        error = str(exc)
    out["files"].append({"error": error, "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss})
print(json.dumps(out))
"""


@pytest.mark.slow  # a child Python (numpy, PyAV): about 2 s on a loaded machine
def test_a_three_hour_flac_named_wav_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    # the input: a 2.1 MB FLAC named .wav, one line (here a 1 s tone) then 3 h of silence; once with its
    # true length in STREAMINFO (refused from the header), once with the length left "unknown" (0), so only
    # decoding can find it: decoding must stop at 30 s
    small = flac_bomb(tmp_path / "small.wav", silence_s=1.0)
    stated = flac_bomb(tmp_path / "caller-01.wav")
    hidden = flac_bomb(tmp_path / "caller-02.wav", state_total=False)
    assert 1.9e6 < stated.stat().st_size < 2.3e6
    env = dict(os.environ, PYTHONPATH=str(Path(voice_llm.__file__).parents[1]))
    done = subprocess.run([sys.executable, "-c", CHILD, str(small), str(stated), str(hidden)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    report = json.loads(done.stdout)
    first, second = report["files"]
    assert first["error"] == (f"{stated} is 10801.0 s long (its header says); a turn may be at most 30 s "
                              "(Whisper's window)")
    assert second["error"] == (f"{hidden} is longer than 30 s (decoding stopped there); a turn may be at most 30 s "
                               "(Whisper's window)")
    for row in report["files"]:
        assert (row["peak_kb"] - report["warm_kb"]) / 1024 < RSS_BOUND_MB, report


def test_a_turn_just_under_the_limit_still_loads(tmp_path: Path) -> None:
    u = c.load_file(flac_bomb(tmp_path / "long.wav", silence_s=28.0), 1, None)
    assert u.converted_from == "flac, 1 channel(s), 16000 Hz"
    assert 28.9 < len(u.speech()) / 16000 + (len(u.samples) - u.end) / 16000 < 29.2


# --- item 7: non-regular files named .wav ---------------------------------------------------------------------


def test_a_fifo_named_wav_is_refused_by_name(tmp_path: Path) -> None:
    # the input: a FIFO named caller-01.wav beside a real caller-02.wav (caller-02 became turn 1)
    folder = tmp_path / "calls"
    folder.mkdir()
    os.mkfifo(folder / "caller-01.wav")
    write_wav(folder / "caller-02.wav", tone(16000), 16000)
    with pytest.raises(c.CallerAudioError) as info:
        c.load_folder(folder)
    assert one_line(info) == (f"--caller-audio {folder}: caller-01.wav is a FIFO, not a regular file; each turn's "
                              "WAV must be one")
    # opened directly it is refused too, without blocking (no writer ever comes)
    with pytest.raises(c.CallerAudioError) as info:
        c.load_file(folder / "caller-01.wav", 1, None)
    assert one_line(info) == f"{folder / 'caller-01.wav'}: caller-01.wav is a FIFO, not a regular file"


def test_a_link_to_dev_zero_named_wav_is_refused_by_name(tmp_path: Path) -> None:
    folder = tmp_path / "calls"
    folder.mkdir()
    (folder / "caller-01.wav").symlink_to("/dev/zero")
    write_wav(folder / "caller-02.wav", tone(16000), 16000)
    with pytest.raises(c.CallerAudioError) as info:
        c.load_folder(folder)
    assert one_line(info) == (f"--caller-audio {folder}: caller-01.wav is a link to /dev/zero (a character device), "
                              "not a regular file; each turn's WAV must be one")


def test_only_a_fifo_is_not_no_wav_file(tmp_path: Path) -> None:
    folder = tmp_path / "calls"
    folder.mkdir()
    os.mkfifo(folder / "only.wav")
    with pytest.raises(c.CallerAudioError) as info:
        c.load_folder(folder)
    assert "no .wav file" not in one_line(info) and "only.wav is a FIFO" in str(info.value)


def test_a_folder_named_wav_and_a_broken_link_are_refused_by_name(tmp_path: Path) -> None:
    folder = folder_of(tmp_path, 1)
    (folder / "caller-00.wav").mkdir()
    with pytest.raises(c.CallerAudioError, match="caller-00.wav is a folder, not a regular file"):
        c.load_folder(folder)
    (folder / "caller-00.wav").rmdir()
    (folder / "caller-00.wav").symlink_to(folder / "gone.wav")
    with pytest.raises(c.CallerAudioError) as info:
        c.load_folder(folder)
    assert one_line(info) == f"--caller-audio {folder}: cannot read caller-00.wav: No such file or directory"


def test_a_fifo_named_script_txt_is_refused_not_waited_on(tmp_path: Path) -> None:
    folder = folder_of(tmp_path, 2)
    os.mkfifo(folder / "script.txt")
    with pytest.raises(c.CallerAudioError) as info:
        c.load_folder(folder)
    assert one_line(info) == f"{folder / 'script.txt'}: script.txt is a FIFO, not a regular file"


# --- item 13: ffmpeg's names, no repetition -------------------------------------------------------------------


def test_8_bit_input_is_named_pcm_u8(tmp_path: Path) -> None:
    u = c.load_file(write_wav(tmp_path / "u8.wav", tone(16000), 16000, width=1), 1, None)
    assert u.converted_from == "pcm_u8, 1 channel(s), 16000 Hz"


def test_a_silent_turn_names_its_file_once(tmp_path: Path) -> None:
    folder = folder_of(tmp_path, 1)
    write_wav(folder / "caller-02.wav", np.zeros(16000, np.int16), 16000)
    with pytest.raises(c.CallerAudioError) as info:
        c.load_folder(folder)
    text = one_line(info)
    assert text == (f"no speech detected in turn 2 ({folder / 'caller-02.wav'}: no sample above the noise floor of "
                    "100 = -50.3 dBFS)")
    assert text.count("turn 2") == 1 and "'s file" not in text


def test_a_long_turn_names_its_file_once(tmp_path: Path) -> None:
    path = write_wav(tmp_path / "long.wav", tone(16000, 31.0), 16000)
    with pytest.raises(c.CallerAudioError) as info:
        c.load_file(path, 1, None)
    assert one_line(info) == f"{path} is 31.0 s long (its header says); a turn may be at most 30 s (Whisper's window)"


# --- item 15: the user's own transcripts and barge-in plan ----------------------------------------------------


def test_without_transcripts_the_wer_is_not_checkable(tmp_path: Path) -> None:
    # the issue: the user's "Do you accept blue cross insurance?" was scored against the clinic's line 2
    folder = folder_of(tmp_path, 4)
    audio = c.load_folder(folder)
    assert [u.script for u in audio.utterances] == [None] * 4
    assert audio.scripts_from is None and not audio.wer_checkable
    assert audio.wer_unknown == (f"not checkable: {folder} has no transcripts (script.txt, one line per WAV, or a "
                                 ".txt beside each WAV with the same name)")
    assert audio.barge_in_turns is None


def test_script_txt_gives_one_line_per_wav(tmp_path: Path) -> None:
    folder = folder_of(tmp_path, 2)
    (folder / "script.txt").write_text("Hi, I'd like to book.\n\n  Do you accept blue cross insurance?  \n")
    audio = c.load_folder(folder)
    assert [u.script for u in audio.utterances] == ["Hi, I'd like to book.", "Do you accept blue cross insurance?"]
    assert audio.scripts_from == "script.txt" and audio.wer_checkable and audio.wer_unknown is None


def test_a_txt_beside_each_wav_is_its_transcript(tmp_path: Path) -> None:
    folder = folder_of(tmp_path, 2)
    (folder / "caller-01.txt").write_text("Hello there.\n")
    (folder / "caller-02.txt").write_text("Do you accept\nblue cross insurance?")
    audio = c.load_folder(folder)
    assert [u.script for u in audio.utterances] == ["Hello there.", "Do you accept blue cross insurance?"]
    assert audio.scripts_from == "a .txt beside each WAV"


@pytest.mark.parametrize("files,expected", [
    ({"script.txt": "one\n"}, "{d}/script.txt has 1 line(s) but {d} holds 2 WAV(s): one line per WAV, in the WAVs' "
                              "name order"),
    ({"caller-01.txt": "one"}, "--caller-audio {d}: caller-02.wav has no caller-02.txt beside it, but caller-01.txt "
                               "is there (a transcript beside each WAV, or none)"),
    ({"script.txt": "a\nb\n", "caller-02.txt": "b"}, "--caller-audio {d} holds both script.txt and caller-02.txt: "
                                                     "give the transcripts one way (script.txt, or a .txt beside each "
                                                     "WAV)"),
    ({"caller-01.txt": "a", "caller-02.txt": "  \n"}, "{d}/caller-02.txt is empty (the transcript of caller-02.wav)"),
    ({"barge-in.txt": "2"}, "{d}/barge-in.txt names turn 2, but the caller cuts in with the next turn's line and {d} "
                            "holds 2 WAV(s)"),
    ({"barge-in.txt": "one"}, "{d}/barge-in.txt: 'one' is not a turn number (write e.g. '3' or '2 4', or 'none')"),
])
def test_bad_transcripts_and_plans_are_one_line(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    folder = folder_of(tmp_path, 2)
    for name, text in files.items():
        (folder / name).write_text(text)
    with pytest.raises(c.CallerAudioError) as info:
        c.load_folder(folder)
    assert one_line(info) == expected.format(d=folder)


def test_not_utf8_script_is_one_line(tmp_path: Path) -> None:
    folder = folder_of(tmp_path, 1)
    (folder / "script.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(c.CallerAudioError) as info:
        c.load_folder(folder)
    assert one_line(info) == f"{folder / 'script.txt'} is not UTF-8 text (byte 3)"


@pytest.mark.parametrize("text,turns", [("3", (3,)), ("2 4", (2, 4)), ("4, 2\n", (2, 4)), ("none\n", ()), ("", ())])
def test_the_barge_in_plan_is_read(tmp_path: Path, text: str, turns: tuple[int, ...]) -> None:
    folder = folder_of(tmp_path, 5)
    (folder / "barge-in.txt").write_text(text)
    assert c.load_folder(folder).barge_in_turns == turns


def test_two_wavs_say_the_call_is_shorter_and_has_no_barge_in(tmp_path: Path) -> None:
    # the issue: two WAVs silently made a 2-turn call with no barge-in (barge-in fixed on turn 3)
    folder = folder_of(tmp_path, 2)
    picked = c.select_turns(c.load_folder(folder), None, None, default_turns=4, default_barge_in=(3,))
    assert len(picked.utterances) == 2 and picked.barge_in_turns == ()
    assert picked.notes == (f"--caller-audio {folder} holds 2 WAV(s): a 2-turn call (the default call has 4 turns)",
                            f"no barge-in into turn 3: it needs 4 turns, the call has 2 (name the turns in "
                            f"{folder / 'barge-in.txt'})")


def test_turns_beyond_the_wavs_is_one_line(tmp_path: Path) -> None:
    # the issue: --turns 9 silently stopped at 6
    folder = folder_of(tmp_path, 6)
    audio = c.load_folder(folder)
    with pytest.raises(c.CallerAudioError) as info:
        c.select_turns(audio, 9, None, default_turns=4, default_barge_in=(3,))
    assert one_line(info) == f"--turns 9, but --caller-audio {folder} holds 6 WAV(s) (one per turn)"
    picked = c.select_turns(audio, None, None, default_turns=4, default_barge_in=(3,))
    assert len(picked.utterances) == 6 and picked.barge_in_turns == (3,) and picked.notes == ()
    picked = c.select_turns(audio, 2, None, default_turns=4, default_barge_in=(3,))
    assert [u.index for u in picked.utterances] == [1, 2] and picked.barge_in_turns == ()
    assert picked.notes[0] == f"--turns 2: the call uses the first 2 of the 6 WAVs in {folder}"


def test_the_users_plan_wins_and_is_checked_against_the_turns_taken(tmp_path: Path) -> None:
    folder = folder_of(tmp_path, 5)
    (folder / "barge-in.txt").write_text("1 4")
    audio = c.load_folder(folder)
    assert c.select_turns(audio, None, None, default_turns=4, default_barge_in=(3,)).barge_in_turns == (1, 4)
    assert c.select_turns(audio, None, (2,), default_turns=4, default_barge_in=(3,)).barge_in_turns == (2,)
    with pytest.raises(c.CallerAudioError) as info:
        c.select_turns(audio, 3, None, default_turns=4, default_barge_in=(3,))
    assert one_line(info) == f"{folder / 'barge-in.txt'} names turn 4, but a 3-turn call has no turn 5 to cut in with"


@pytest.mark.slow  # Silero
def test_noise_without_a_voice_is_refused_by_the_vad(tmp_path: Path) -> None:
    from voice_llm.engines.speech_in.vad import SileroVAD, require_speech

    folder = tmp_path / "calls"
    folder.mkdir()
    noise = (np.random.default_rng(1).standard_normal(16000) * 300).astype(np.int16)
    write_wav(folder / "caller-02.wav", noise, 16000)
    (folder / "caller-01.wav").symlink_to(folder / "caller-02.wav")  # a link to a regular file is a file
    audio = c.load_folder(folder)  # above the sample floor: the loader takes it
    with pytest.raises(c.CallerAudioError) as info:
        require_speech(audio.utterances, SileroVAD())
    assert one_line(info) == (f"no speech detected in turn 1 ({folder / 'caller-01.wav'}: the VAD found no frame at "
                              "or above 0.5)")
