"""The artifact schema version is read back (as pyperf's loaders do): a run folder written by a newer voice-llm is
refused by check, report and compare in one line; an older known version (the saved sample run is version 2) is
read as before; and a run folder is read once (RunFolder)."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkfolders import clean_run, read, write

from voice_llm.core.analysis import compare
from voice_llm.core.checks.base import FAIL
from voice_llm.core.checks.core import run_checks
from voice_llm.cli import main as cli
from voice_llm.core.errors import ArtifactError
from voice_llm.core.report.page import render_report
from voice_llm.core.run import meta as runmeta
from voice_llm.core.run.folder import RunFolder, UnknownSchemaError, schema_of


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    return clean_run(tmp_path / "out")


def _newer(out: Path, name: str) -> None:
    doc = read(out, name)
    newer = runmeta.SCHEMA_VERSION + 1
    if isinstance(doc, list):
        for row in doc:
            row["schema_version"] = newer
    else:
        doc["schema_version"] = newer
    write(out, name, doc)


def test_an_older_known_version_is_read_as_before(lab: Path) -> None:
    assert schema_of(read(lab, "run.json")) == 2 < runmeta.SCHEMA_VERSION
    assert not [r for r in run_checks(lab) if r.status == FAIL]
    assert render_report(lab, None).is_file()


@pytest.mark.parametrize("name", ["run.json", "ttft.json", "prefill.json"])
def test_a_newer_version_is_refused_in_one_line(lab: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    _newer(lab, name)
    newer = f"{name} was written by a newer voice-llm (artifact schema {runmeta.SCHEMA_VERSION + 1}"
    with pytest.raises(UnknownSchemaError, match=r"upgrade voice-llm") as caught:
        run_checks(lab)
    assert str(caught.value).startswith(newer) and "\n" not in str(caught.value)
    with pytest.raises(UnknownSchemaError, match=newer.replace("(", r"\(")):
        render_report(lab, None)
    with pytest.raises(UnknownSchemaError):
        compare.compare_runs(lab, lab)
    assert cli.main(["check", "--out", str(lab)]) == cli.EXIT_FAILURE
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and newer in err, err


@pytest.mark.parametrize("version", ["3", 0, True, 2.5])
def test_a_version_that_is_no_version_is_refused(lab: Path, version: object) -> None:
    doc = read(lab, "ttft.json")
    doc["schema_version"] = version
    write(lab, "ttft.json", doc)
    with pytest.raises(UnknownSchemaError, match="not a version voice-llm knows"):
        run_checks(lab)


def test_each_file_is_read_once(lab: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from voice_llm.core.run import folder as folder_module

    reads: list[str] = []
    real = folder_module.read_artifact_bytes

    def counted(path: Path, *args: object, **kwargs: object) -> bytes:
        reads.append(path.relative_to(lab).as_posix())
        return real(path, *args, **kwargs)

    monkeypatch.setattr(folder_module, "read_artifact_bytes", counted)
    folder = RunFolder(lab)
    render_report(folder, run_checks(folder))
    assert reads and len(reads) == len(set(reads)), sorted(r for r in reads if reads.count(r) > 1)
    assert "run.json" in reads and "ttft.json" in reads


def test_a_broken_file_says_the_same_to_every_reader(lab: Path) -> None:
    (lab / "ttft.json").write_text("{")
    folder = RunFolder(lab)
    with pytest.raises(ArtifactError) as first:
        folder.json("ttft.json")
    with pytest.raises(ArtifactError) as second:
        folder.json("ttft.json")
    assert str(first.value) == str(second.value) and "ttft.json is not valid JSON" in str(first.value)
