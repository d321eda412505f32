"""The README's screenshots are of the current code (issue 41 item 22): docs/terminal-summary.png, captioned "from
a real run", showed a 10-check lab with no speak or converse step long after both joined the lab.

docs/screenshots.json (written by `make screenshots`, scripts/screenshots.py) records for each PNG its sha256 and
a fingerprint of the code that draws it and of the lab's plan (its step names). These tests fail, saying "run
make screenshots", when either no longer matches. Only the drawing code and the plan are fingerprinted
(scripts/screenshots.py SOURCES), so an unrelated edit does not make the screenshots stale.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    # scripts/ is not a package: the make target and this test share the one file by path.
    spec = importlib.util.spec_from_file_location("screenshots", ROOT / "scripts" / "screenshots.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shots = _load()


def _stamp() -> dict[str, Any]:
    try:
        return shots.read_stamp()
    except (OSError, ValueError) as exc:
        pytest.fail(f"no usable docs/screenshots.json ({exc}): run make screenshots")


def test_the_screenshots_are_of_the_current_code_and_plan() -> None:
    reasons = shots.stale()
    assert not reasons, "the README's screenshots are stale: run make screenshots\n" + "\n".join(reasons)


def test_the_stamp_covers_every_screenshot_and_the_run_checked_everything() -> None:
    stamp = _stamp()
    assert sorted(stamp["screenshots"]) == sorted(shots.SOURCES)
    assert stamp["plan"] == shots.plan(), "run make screenshots"
    # The run the screenshots show is a whole lab that ended with its result line and every check counted.
    counts = re.fullmatch(r"(\d+) passed, (\d+) findings?, (\d+) not checkable, 0 failed", stamp["result"])
    assert counts, f"the screenshots' run did not pass: {stamp['result']}; run make screenshots"
    assert stamp["checks"] == sum(int(n) for n in counts.groups()) > 10  # the 10-check lab was the stale one


def test_the_readme_caption_states_the_runs_own_result_line() -> None:
    stamp = _stamp()
    readme = (ROOT / "README.md").read_text()
    assert stamp["result"] in readme, f"README's screenshot caption does not say `{stamp['result']}`: run make screenshots"


# --- the staleness check catches what it must, on a copy ------------------------------------------------------------

STEPS = ["health", "speak", "converse", "report"]  # a plan of the copy's own


@pytest.fixture()
def copy(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(root, docs, stamp) copies: the sources the fingerprints read, the PNGs and the stamp."""
    root = tmp_path / "root"
    for entry in {e.partition(":")[0] for entries in shots.SOURCES.values() for e in entries}:
        (root / entry).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / entry, root / entry)
    docs = tmp_path / "docs"
    docs.mkdir()
    screenshots = {}
    for png in shots.SOURCES:
        (docs / png).write_bytes(b"\x89PNG " + png.encode())
        screenshots[png] = {"sha256": hashlib.sha256((docs / png).read_bytes()).hexdigest(),
                            "fingerprint": shots.fingerprint(png, STEPS, root)}
    stamp = docs / "screenshots.json"
    shots.write_stamp({"version": shots.STAMP_VERSION, "plan": STEPS, "checks": 43, "result": "43 passed",
                       "screenshots": screenshots}, stamp)
    return root, docs, stamp


def test_a_current_copy_is_not_stale(copy: tuple[Path, Path, Path]) -> None:
    root, docs, stamp = copy
    assert shots.stale(docs, stamp, root, STEPS) == []


def test_a_new_step_in_the_plan_is_stale(copy: tuple[Path, Path, Path]) -> None:
    root, docs, stamp = copy
    reasons = shots.stale(docs, stamp, root, STEPS[:-1] + ["dial", "report"])
    assert any("lab's steps" in r for r in reasons) and any("plan" in r for r in reasons)


def test_an_edit_of_the_drawing_code_is_stale_and_names_the_screenshot(copy: tuple[Path, Path, Path]) -> None:
    root, docs, stamp = copy
    page = root / "src/voice_llm/core/report/page.py"
    page.write_text(page.read_text() + "\n# a new section\n")
    assert shots.stale(docs, stamp, root, STEPS) == [
        f"report.png: the code that draws it changed ({', '.join(shots.SOURCES['report.png'])}) or the plan did"]


def test_an_edit_outside_the_drawn_functions_is_not_stale(copy: tuple[Path, Path, Path]) -> None:
    # cli/main.py is fingerprinted by the functions that print the summary only: another command's edit is not
    # a reason to run the lab again.
    root, docs, stamp = copy
    main = root / "src/voice_llm/cli/main.py"
    main.write_text(main.read_text() + "\n\ndef an_unrelated_command() -> int:\n    return 0\n")
    assert shots.stale(docs, stamp, root, STEPS) == []
    text = main.read_text()
    main.write_text(text.replace("def _print_checks(", "def _print_checks(  # drawn differently\n        ", 1))
    assert [r.split(":")[0] for r in shots.stale(docs, stamp, root, STEPS)] == ["terminal-summary.png"]


def test_a_png_replaced_by_hand_or_missing_is_stale(copy: tuple[Path, Path, Path]) -> None:
    root, docs, stamp = copy
    (docs / "terminal-summary.png").write_bytes(b"\x89PNG an old screenshot")
    (docs / "report.png").unlink()
    assert shots.stale(docs, stamp, root, STEPS) == [
        "terminal-summary.png: the PNG is not the one the stamp recorded", "report.png: missing"]


def test_a_missing_or_other_version_stamp_is_stale(copy: tuple[Path, Path, Path]) -> None:
    root, docs, stamp = copy
    stamp.write_text(json.dumps({"version": shots.STAMP_VERSION + 1}))
    assert shots.stale(docs, stamp, root, STEPS)[0].startswith("no usable stamp")
    stamp.unlink()
    assert shots.stale(docs, stamp, root, STEPS)[0].startswith("no usable stamp")


def test_the_stamp_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    stamp = tmp_path / "screenshots.json"
    shots.write_stamp({"version": shots.STAMP_VERSION, "plan": []}, stamp)
    with pytest.raises(TypeError):
        shots.write_stamp({"version": shots.STAMP_VERSION, "plan": object()}, stamp)  # not JSON: fails mid-write
    assert shots.read_stamp(stamp) == {"version": shots.STAMP_VERSION, "plan": []}
    assert [p.name for p in tmp_path.iterdir()] == ["screenshots.json"]  # no temporary file left
