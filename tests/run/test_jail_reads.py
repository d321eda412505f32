"""OUT is a jail for reads (issue 20): `check` and `report` read a run folder only inside it. A path in an artifact
(run.json's manifest, audio.json's raw/path, load.json's samples_csv) that names a file elsewhere is a FAIL naming
it, never certified; a device, a FIFO or a /proc file in place of an artifact is refused at once (no hang, no
MemoryError), and a file over the size cap is refused without being read."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fakeserver import FakeServer, Reply, at, llama_events

from voice_llm.core.util import artifacts
from voice_llm.core.errors import ArtifactError

from clihelpers import assert_clean_failure, cli, cli_env

ANSWER = ["Fast", " for", " 8", " hours.", " Drink", " only", " water.", " Arrive", " early."]
CHECK_S = 60  # a check that hangs on a FIFO or /dev/zero would run into this; a working one ends in seconds


@pytest.fixture(scope="module")
def spoken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real-looking run folder with run.json, audio.json, WAVs and raw streams: `speak` against the fake."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    out = tmp_path_factory.mktemp("spoken") / "out"
    env = cli_env(tmp_path_factory.mktemp("state"))
    with FakeServer(Reply.stream(at(0.0, llama_events(ANSWER)))) as fake:
        result = cli("speak", "--url", fake.url, "--out", str(out), "-q", "--tts", "espeak", "--repeat", "1", env=env)
    assert result.returncode == 0, result.stderr
    return out


def tampered(spoken: Path, tmp_path: Path, change: Callable[[Path], None]) -> Path:
    out = tmp_path / "out"
    shutil.copytree(spoken, out, symlinks=True)
    change(out)
    return out


def check_lines(out: Path, env: dict[str, str]) -> dict[str, str]:
    result = cli("check", str(out), env=env, timeout=CHECK_S)
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    assert "MemoryError" not in result.stdout + result.stderr
    lines = {}
    for line in result.stdout.splitlines():
        status, _, rest = line.partition(" ")
        name, _, detail = rest.strip().partition(": ")
        if name == "audio":
            sub, _, detail = detail.partition(": ")
            name = f"audio: {sub}"
        lines[name] = f"{status} {detail}"
    return lines


def edit_json(path: Path, change: Callable[[Any], None]) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=2))


ONE_RUN = "one run"


def outside_file(tmp_path: Path) -> Path:
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"machine secret\n")
    return outside


# --- run.json's manifest ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["relative", "absolute"])
@pytest.mark.slow
def test_a_manifest_naming_a_file_outside_out_is_a_fail_naming_it(how: str, spoken: Path, tmp_path: Path,
                                                                 env: dict[str, str]) -> None:
    outside = outside_file(tmp_path)
    name = "../outside.txt" if how == "relative" else str(outside)
    digest = hashlib.sha256(outside.read_bytes()).hexdigest()  # the true hash: without the jail it is certified
    out = tampered(spoken, tmp_path, lambda o: edit_json(o / "run.json", lambda d: d["artifacts"].update({name: digest})))
    line = check_lines(out, env)[ONE_RUN]
    assert line.startswith("FAIL") and name in line, line


@pytest.mark.parametrize("planted", ["fifo", "pagemap-link"])
@pytest.mark.slow
def test_a_fifo_or_proc_file_in_place_of_an_artifact_is_refused_at_once(planted: str, spoken: Path, tmp_path: Path,
                                                                       env: dict[str, str]) -> None:
    name = "audio/whole-heard.wav"  # an artifact of the run, in the manifest and named by audio.json

    def change(out: Path) -> None:
        (out / name).unlink()
        if planted == "fifo":
            os.mkfifo(out / name)  # nobody writes to it: opening it to read would wait forever
        else:
            (out / name).symlink_to("/proc/self/pagemap")  # "regular", size 0, gigabytes when read

    lines = check_lines(tampered(spoken, tmp_path, change), env)
    assert lines[ONE_RUN].startswith("FAIL") and name in lines[ONE_RUN], lines[ONE_RUN]
    wavs = lines["audio: WAVs decode and last as stated"]
    assert wavs.startswith("FAIL") and name in wavs, wavs


@pytest.mark.slow
def test_a_raw_stream_named_as_dev_zero_is_a_fail_not_a_memory_error(spoken: Path, tmp_path: Path,
                                                                     env: dict[str, str]) -> None:
    def change(out: Path) -> None:
        doc = json.loads((out / "audio.json").read_text())
        doc["strategies"]["whole"]["runs"][0]["raw"] = "/dev/zero"
        (out / "audio.json").write_text(json.dumps(doc, indent=2))

    line = check_lines(tampered(spoken, tmp_path, change), env)["audio: segments follow from the raw stream"]
    assert line.startswith("FAIL") and "/dev/zero" in line, line


@pytest.mark.parametrize("command", ["report", "compare"])
def test_report_and_compare_refuse_a_manifest_naming_a_file_elsewhere(command: str, tmp_path: Path,
                                                                      env: dict[str, str]) -> None:
    outside = outside_file(tmp_path)
    digest = hashlib.sha256(outside.read_bytes()).hexdigest()
    out = tmp_path / "out"
    shutil.copytree(Path(__file__).parents[1] / "fixtures" / "sample_run", out)
    edit_json(out / "run.json", lambda d: d["artifacts"].update({"../outside.txt": digest}))
    args = ["report", "--out", str(out), "-q"] if command == "report" else \
        ["compare", str(out), str(out)]
    result = cli(*args, env=env, timeout=CHECK_S)
    assert_clean_failure(result, "run.json names '../outside.txt'", "not inside the output folder")


# --- audio.json's raw and path ----------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["raw", "path"])
@pytest.mark.slow
def test_an_audio_path_field_naming_a_file_elsewhere_is_a_fail(field: str, spoken: Path, tmp_path: Path,
                                                              env: dict[str, str]) -> None:
    def change(out: Path) -> None:
        doc = json.loads((out / "audio.json").read_text())
        run = doc["strategies"]["whole"]["runs"][0]
        wav = doc["strategies"]["whole"]["wavs"]["heard"]
        source = out / (run["raw"] if field == "raw" else wav["path"])
        copy = tmp_path / f"copy-{source.name}"  # the very same bytes, outside OUT
        shutil.copyfile(source, copy)
        source.unlink()
        if field == "raw":
            run["raw"] = f"../{copy.name}"
        else:
            wav["path"] = str(copy)
        (out / "audio.json").write_text(json.dumps(doc, indent=2))
        edit_json(out / "run.json", lambda d: d["artifacts"].update(
            {"audio.json": hashlib.sha256((out / "audio.json").read_bytes()).hexdigest()}))
        for name in list(json.loads((out / "run.json").read_text())["artifacts"]):
            if not (out / name).exists():
                edit_json(out / "run.json", lambda d: d["artifacts"].pop(name))

    lines = check_lines(tampered(spoken, tmp_path, change), env)
    name = "audio: segments follow from the raw stream" if field == "raw" else "audio: WAVs decode and last as stated"
    assert lines[name].startswith("FAIL") and "copy-" in lines[name] and "not inside" in lines[name], lines[name]


# --- load.json's samples_csv and the CSV itself -----------------------------------------------------------------


def test_samples_csv_naming_a_file_elsewhere_is_a_fail(tmp_path: Path, env: dict[str, str]) -> None:
    from builders import fake_load_run as _fake_run

    (tmp_path / "out").mkdir()
    out = _fake_run(tmp_path / "out")
    (out / "load_samples.csv").rename(tmp_path / "elsewhere.csv")
    edit_json(out / "load.json", lambda d: d.update(samples_csv="../elsewhere.csv"))
    lines = check_lines(out, env)
    failing = [line for name, line in lines.items() if name.startswith("load") and line.startswith("FAIL")]
    assert failing and all("../elsewhere.csv" in line for line in failing), lines


def test_a_csv_field_over_the_csv_limit_is_one_fail_line(tmp_path: Path, env: dict[str, str]) -> None:
    from builders import fake_load_run as _fake_run

    (tmp_path / "out").mkdir()
    out = _fake_run(tmp_path / "out")
    text = (out / "load_samples.csv").read_text().replace(",w1,", ",w" + "1" * 140_000 + ",", 1)
    (out / "load_samples.csv").write_text(text)
    lines = check_lines(out, env)
    failing = [line for name, line in lines.items() if name.startswith("load") and line.startswith("FAIL")]
    assert failing and all("load_samples.csv is not a readable CSV file" in line for line in failing), lines


# --- the reader itself --------------------------------------------------------------------------------------------


def test_inside_refuses_absolute_dotdot_and_links_on_the_way(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "raw").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (out / "audio").symlink_to(tmp_path / "elsewhere")
    assert artifacts.inside(out, "raw/x.sse") == out / "raw" / "x.sse"
    for bad in ("/etc/hostname", "../x", "raw/../../x", "audio/whole-heard.wav", "", None, 3):
        with pytest.raises(ArtifactError):
            artifacts.inside(out, bad)  # type: ignore[arg-type]


def test_the_reader_refuses_devices_fifos_proc_links_and_huge_files(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link.json").symlink_to(tmp_path / "fifo")
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(artifacts.MAX_ARTIFACT_BYTES + 1)  # sparse: no disk used
    cases = {Path("/dev/zero"): "not a regular file", tmp_path / "fifo": "not a regular file",
             Path("/proc/self/pagemap"): "not a regular file", tmp_path / "link.json": "symbolic link",
             big: "more than the"}
    for path, reason in cases.items():
        with pytest.raises(ArtifactError, match=reason):
            artifacts.read_artifact_bytes(path)
        with pytest.raises(ArtifactError):
            artifacts.read_json(path)
