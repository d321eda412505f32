"""dial.json as one type (voice_llm.capabilities.dial.doc.DialDoc, issue 42 item 1): the dialer writes it through the type, the
tests' folder builder builds it through the same type, the checks read its fields. Parsed once per folder; a field
of the wrong type is one line naming it; a newer dial schema is refused; the file round-trips key for key; and a
field renamed in the type is caught by the type checker in every reader and writer, not by a FAIL row at run time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from dialfolder import build, doc_of, load, save, save_doc
from dialhelpers import context, tones
from fakeagent import FakeAgent, Reply

from voice_llm.capabilities.dial.doc import DIAL_SCHEMA_VERSION, DialDoc, DialPartialDoc, Line
from voice_llm.capabilities.dial.step import DialOptions, dial_step
from voice_llm.core.errors import ArtifactError
from voice_llm.core.run.folder import RunFolder, UnknownSchemaError
from voice_llm.core.util.artifacts import DIAL

ROOT = Path(__file__).resolve().parents[2]
# The readers and writers of dial.json held to the type: the dialer's writer, the checks, the type itself, and the
# tests' builder with the checks' tests.
TYPED = ("src/voice_llm/core/run/blocks.py", "src/voice_llm/capabilities/dial/doc.py", "src/voice_llm/capabilities/dial/checks.py",
         "src/voice_llm/capabilities/dial/step.py", "src/voice_llm/capabilities/dial/report.py", "src/voice_llm/capabilities/dial/numbers.py",
         "src/voice_llm/capabilities/load/doc.py", "src/voice_llm/capabilities/load/document.py", "src/voice_llm/capabilities/load/dialing.py",
         "tests/dial/dialfolder.py", "tests/dial/test_dial_checks.py")


@pytest.fixture()
def call(tmp_path: Path) -> Path:
    return build(tmp_path / "run")


def test_a_built_call_round_trips_key_for_key(call: Path) -> None:
    raw = load(call)
    doc = DialDoc.parse(raw)
    assert doc.as_dict() == raw
    assert json.dumps(doc.as_dict()) == json.dumps(raw)  # in the file's key order too
    assert doc.turns[2].barge_in is not None and doc.turns[2].barge_in.onset_ms == doc.turns[3].caller.speech_start_ms
    assert doc.heard_gaps() == [t.heard.gap_ms for t in doc.turns if t.heard is not None]


def test_keys_the_type_does_not_know_are_kept(call: Path) -> None:
    """A block another capability adds (a WebRTC line's) and a key of a later version survive a read and a write."""
    raw = load(call)
    raw["line"]["webrtc"] = {"ice": "host", "dtls": True}
    raw["turns"][0]["heard"]["newer"] = [1, 2]
    raw["something_new"] = {"a": 1}
    doc = DialDoc.parse(raw)
    assert doc.line.extra == {"webrtc": {"ice": "host", "dtls": True}}
    assert doc.as_dict() == raw
    edited = replace(doc, line=replace(doc.line, jitter_ms=60.0))
    assert edited.as_dict()["line"]["webrtc"] == {"ice": "host", "dtls": True}


def test_the_dialers_own_file_is_the_types(tmp_path: Path) -> None:
    """dial.json as `voice-llm dial` writes it (a real call to the fake agent) parses and writes back unchanged;
    its partial when the call fails too."""
    with FakeAgent([Reply(200, 400), Reply(200, 400)]) as agent:
        dial_step(context(tmp_path), DialOptions(stt="none", barge_in_turns=(), deadline_s=10.0), agent.url,
                  caller=tones(2))
    raw = json.loads((tmp_path / DIAL).read_text())
    doc = RunFolder(tmp_path).artifact(DialDoc)
    assert doc.as_dict() == raw
    assert doc.dial_schema_version == DIAL_SCHEMA_VERSION and len(doc.turns) == 2 and doc.error is None
    assert doc.summary is not None and doc.summary.heard_gap_ms is not None
    assert doc.summary.heard_gap_ms.n == len(doc.heard_gaps()) == 2


def test_the_folder_parses_it_once(call: Path) -> None:
    folder = RunFolder(call)
    first = folder.artifact(DialDoc)
    (call / DIAL).write_text("{")  # read once: a later change of the file is not seen by this folder
    assert folder.artifact(DialDoc) is first
    with pytest.raises(ArtifactError, match="dial.json is not valid JSON"):
        RunFolder(call).artifact(DialDoc)


@pytest.mark.parametrize(("edit", "said"), [
    (lambda d: d["line"].update(rate=8000.5), "dial.json: line.rate is 8000.5, not a whole number"),
    (lambda d: d["turns"][3]["heard"].update(talked_over="no"),
     "dial.json: turns[3].heard.talked_over is 'no', not true or false"),
    (lambda d: d["turns"][2]["barge_in"].update(resumed_ms=[[1.0]]),
     "dial.json: turns[2].barge_in.resumed_ms[0] is [1.0], not [start_ms, end_ms]"),
    (lambda d: d.pop("floor"), "dial.json has no field 'floor'"),
    (lambda d: d["files"].update(caller_wavs="dial/caller-01.wav"),
     "dial.json: files.caller_wavs is 'dial/caller-01.wav', not a list"),
    (lambda d: d.update(turns={}), "dial.json: turns is {}, not a list"),
])
def test_a_malformed_field_is_one_line_naming_it(call: Path, edit: object, said: str) -> None:
    raw = load(call)
    edit(raw)  # type: ignore[operator]
    with pytest.raises(ArtifactError) as caught:
        DialDoc.parse(raw)
    assert str(caught.value) == said


def test_a_newer_dial_schema_or_run_schema_is_refused(call: Path) -> None:
    raw = load(call)
    raw["dial_schema_version"] = DIAL_SCHEMA_VERSION + 1
    newer = r"written by a newer voice-llm \(dial_schema_version 5; this one reads up to 4\)"
    with pytest.raises(ArtifactError, match=newer):
        DialDoc.parse(raw)
    raw = load(call)
    raw["schema_version"] = 99
    with pytest.raises(UnknownSchemaError):
        DialDoc.parse(raw)


def test_a_file_from_before_a_key_reads_as_before(call: Path) -> None:
    """Keys a dial.json of an older version lacks are None (or empty) and stay absent when written back."""
    raw = load(call)
    for turn in raw["turns"]:
        del turn["cut_off"], turn["cut_off_at"], turn["false_barge_in"], turn["false_barge_in_at"]
    del raw["line"]["loss_pct"], raw["dial_schema_version"]
    doc = DialDoc.parse(raw)
    assert doc.version == 1 and doc.line.loss == 0.0 and doc.turns[0].cut_off is None
    assert "cut_off" in doc.turns[0].absent and doc.as_dict() == raw


def test_the_partial_is_the_same_type_under_its_own_name(call: Path) -> None:
    doc = doc_of(call)
    partial = replace(doc, error="the agent hung up")
    (call / "dial-partial.json").write_text(json.dumps(partial.as_dict()))
    found = RunFolder(call).artifact(DialPartialDoc)
    assert found.error == "the agent hung up" and found.NAME == "dial-partial.json"
    save(call, {**load(call), "error": 5})
    with pytest.raises(ArtifactError, match="dial.json: error is 5, not a string"):
        DialDoc.parse(load(call))


def test_a_line_built_by_the_writer_leaves_out_what_it_lacks(call: Path) -> None:
    line = Line(protocol="pcm", codec="pcm16", rate=16000, frame_ms=20.0, jitter_ms=40.0)
    assert line.as_dict()["loss_pct"] is None and line.frame_samples == 320.0
    doc = doc_of(call)
    save_doc(call, replace(doc, line=line))
    assert DialDoc.parse(load(call)).line == line


# --- the type checker, on the readers and writers -----------------------------------------------------------------

def mypy(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--follow-imports=silent", "--ignore-missing-imports",
                           "--no-incremental", "--cache-dir", "/dev/null", *TYPED],
                          cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MYPYPATH": f"{root / 'src'}:{root / 'tests' / 'dial'}"})


def test_the_readers_and_writers_type_check() -> None:
    pytest.importorskip("mypy")
    found = mypy(ROOT)
    assert found.returncode == 0, found.stdout


def test_a_planted_rename_of_a_field_fails_the_type_check(tmp_path: Path) -> None:
    """Heard.gap_ms renamed in the type alone: every writer building it and every reader reading it is an error of
    the type checker (the checks read ``turn.heard.gap_ms`` and the writer passes ``gap_ms=``), before any call."""
    pytest.importorskip("mypy")
    for name in TYPED:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "src" / "voice_llm", tmp_path / "src" / "voice_llm", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dialhelpers.py", "fakeagent.py"):
        shutil.copy(ROOT / "tests" / "dial" / name, tmp_path / "tests" / "dial" / name)
    doc = tmp_path / "src" / "voice_llm" / "capabilities" / "dial" / "doc.py"
    planted = doc.read_text().replace("    gap_ms: float | None = typed(number)\n",
                                      "    gap_after_ms: float | None = typed(number)\n")
    assert planted != doc.read_text()
    doc.write_text(planted)
    found = mypy(tmp_path)
    assert found.returncode == 1
    errors = [line for line in found.stdout.splitlines() if "gap_ms" in line]
    assert any(line.startswith("src/voice_llm/capabilities/dial/checks.py") and "has no attribute \"gap_ms\"" in line
               for line in errors), found.stdout
    assert any(line.startswith("src/voice_llm/capabilities/dial/step.py") and "Unexpected keyword argument \"gap_ms\"" in line
               for line in errors), found.stdout
    assert any(line.startswith("tests/dial/dialfolder.py") for line in errors), found.stdout
