"""The README's screenshots (docs/*.png) and the stamp that says what they were made from (docs/screenshots.json).

    python scripts/screenshots.py make [--port 8093] [--out /tmp/shots-lab] [--repeat 1]   (`make screenshots`)
    python scripts/screenshots.py render [--out /tmp/shots-lab]                            (the PNGs again)
    python scripts/screenshots.py check                                                     (exit 1 when stale)

``make`` runs a real lab in tmux (tmux + rich + headless Chromium, scripts/terminal_screenshot.py), keeps a frame
of the live progress while the call on the line runs and the whole screen at the end, screenshots the run's
report.html, stops the server it started, and writes the stamp: for each PNG its sha256 and the fingerprint of
what drew it. tests/docs/test_screenshots.py imports this file by path and fails when a fingerprint or a PNG's
hash no longer matches, so a change to the drawing code or the lab's steps asks for new screenshots.

The fingerprint covers only what decides what a screenshot shows (issue 41 item 22): the source of the code that
draws it (whole files, or single functions of a large file such as the CLI, so an unrelated edit there does not
make the screenshots stale) and the lab's plan (its step names, in order). Source is hashed with its line endings
normalised, so a checkout on another OS gives the same fingerprint.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
STAMP = DOCS / "screenshots.json"
STAMP_VERSION = 1
REMEDY = "run `make screenshots`"

PROGRESS_PNG, SUMMARY_PNG, REPORT_PNG = "terminal-progress.png", "terminal-summary.png", "report.png"

# What draws each screenshot: "path" (the whole file) or "path:function" (one top-level function of it).
_TERMINAL = ("src/voice_llm/core/util/progress.py",)
SOURCES: dict[str, tuple[str, ...]] = {
    PROGRESS_PNG: _TERMINAL + ("src/voice_llm/capabilities/dial/step.py:LiveLines",),  # the call's turns above the live bar
    SUMMARY_PNG: _TERMINAL + (
        "src/voice_llm/cli/main.py:cmd_lab", "src/voice_llm/cli/main.py:_print_findings",
        "src/voice_llm/cli/main.py:_caller_sentence", "src/voice_llm/cli/main.py:_print_checks",
        "src/voice_llm/cli/main.py:_print_noise",
        "src/voice_llm/core/lab/report.py",  # the summary table's rows and their meanings
        "src/voice_llm/core/analysis/keynumbers.py",  # the caller's sentence above the table, the key numbers' labels
        "src/voice_llm/core/checks/core.py:counts",  # the result line
    ),
    REPORT_PNG: ("src/voice_llm/core/report/page.py", "src/voice_llm/core/report/charts.py", "src/voice_llm/core/report/style.py",
                 "src/voice_llm/core/report/capability_table.py", "src/voice_llm/core/report/spread.py"),
}


def _source_text(root: Path, entry: str) -> str:
    path, _, name = entry.partition(":")
    text = (root / path).read_text(encoding="utf-8").replace("\r\n", "\n")
    if not name:
        return text
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return ast.get_source_segment(text, node) or ""
    raise LookupError(f"{entry}: no top-level {name} in {path} (update SOURCES in scripts/screenshots.py)")


def plan() -> list[str]:
    """The lab's steps, in its order, from the step registry of the code at ``ROOT``."""
    from voice_llm.core.lab.steps import lab_steps

    return list(lab_steps())


def fingerprint(png: str, steps: Sequence[str], root: Path = ROOT) -> str:
    """sha256 over the sources that draw ``png`` and the lab's plan ``steps``."""
    digest = hashlib.sha256()
    for entry in SOURCES[png]:
        digest.update(f"{entry}\0{_source_text(root, entry)}\0".encode())
    digest.update(("plan\0" + "\0".join(steps)).encode())
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_stamp(path: Path = STAMP) -> dict[str, Any]:
    stamp = json.loads(path.read_text(encoding="utf-8"))
    if stamp.get("version") != STAMP_VERSION:
        raise ValueError(f"{path}: stamp version {stamp.get('version')!r}, expected {STAMP_VERSION}")
    return stamp


def write_stamp(stamp: dict[str, Any], path: Path = STAMP) -> None:
    # Atomic: a stamp half written (an interrupted make) must not pass for a current one.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.fchmod(fd, 0o644)  # mkstemp's 0600 would reach the repository as a file only its writer reads
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def stale(docs: Path = DOCS, stamp_path: Path = STAMP, root: Path = ROOT,
          steps: Sequence[str] | None = None) -> list[str]:
    """Why the screenshots are stale, one reason a line (empty: current)."""
    try:
        stamp = read_stamp(stamp_path)
    except (OSError, ValueError) as exc:
        return [f"no usable stamp: {exc}"]
    steps = list(plan() if steps is None else steps)
    reasons = []
    if stamp.get("plan") != steps:
        reasons.append(f"the lab's steps are {steps}, the screenshots show {stamp.get('plan')}")
    for png in SOURCES:
        shot = stamp.get("screenshots", {}).get(png)
        if not shot:
            reasons.append(f"{png}: not in the stamp")
            continue
        if shot.get("fingerprint") != fingerprint(png, steps, root):
            reasons.append(f"{png}: the code that draws it changed ({', '.join(SOURCES[png])}) or the plan did")
        if not (docs / png).is_file():
            reasons.append(f"{png}: missing")
        elif sha256_file(docs / png) != shot.get("sha256"):
            reasons.append(f"{png}: the PNG is not the one the stamp recorded")
    return reasons


# --- making them -------------------------------------------------------------------------------------------------

def _terminal_screenshot() -> ModuleType:
    spec = importlib.util.spec_from_file_location("terminal_screenshot", ROOT / "scripts" / "terminal_screenshot.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
# The live bar while the call on the line runs: a spinner, then the step's title (a finished step's line has a ✓).
LIVE_CALL = re.compile(r"^(?!✓)\S*\s*converse: ", re.M)
TMUX_SOCKET = f"voice-llm-shots-{os.getpid()}"
SCREENS = "screenshots"  # the folder in the lab's OUT that keeps the captured screens
RESULT = re.compile(r"^(\d+) passed, .*$", re.M)


def _tmux(*args: str) -> str:
    # A socket of its own: a tmux server someone else runs is neither used (its environment would be the
    # command's) nor touched.
    return subprocess.run(["tmux", "-L", TMUX_SOCKET, *args], capture_output=True, text=True, check=True).stdout


def _lab_screens(command: list[str], width: int, height: int, every_s: float,
                 limit_s: float) -> tuple[str, str]:
    """(a frame of the live progress while the call runs, the whole output at the end) of ``command`` in tmux."""
    session = f"shots{os.getpid()}"
    # The pane stays after the command ends so its output can be read; `wait-for` would end it early.
    # PYTHONPATH is passed on by hand: the pane's shell gets the tmux server's environment, and the code to run
    # may be a worktree's (PYTHONPATH=<worktree>/src) rather than the venv's own install.
    env = shlex.join(["env", f"PYTHONPATH={os.environ['PYTHONPATH']}"]) + " " if os.environ.get("PYTHONPATH") else ""
    _tmux("new-session", "-d", "-s", session, "-x", str(width), "-y", str(height),
          f"{env}{shlex.join(command)}; echo '[exit '$?']'; sleep 3600")
    _tmux("set-option", "-t", session, "history-limit", "5000")
    live, deadline = "", time.monotonic() + limit_s
    try:
        while time.monotonic() < deadline:
            time.sleep(every_s)
            screen = _tmux("capture-pane", "-p", "-e", "-t", session)
            if LIVE_CALL.search(ANSI.sub("", screen)):
                live = screen  # the latest: the most of the call's turns shown above the bar
            if "[exit " in screen:
                break
        else:
            raise TimeoutError(f"{shlex.join(command)} did not end in {limit_s:.0f} s")
        # The whole run, scrollback included ("-S -"): the summary and every check are taller than the pane.
        whole = _tmux("capture-pane", "-p", "-e", "-J", "-S", "-", "-t", session)
    finally:
        subprocess.run(["tmux", "-L", TMUX_SOCKET, "kill-server"], capture_output=True)
    if not live:
        raise RuntimeError("no frame showed the converse step live: the progress screenshot has nothing to show")
    return live, whole


def _from_first_step(ansi: str) -> str:
    """The run's output from its first finished step on (the server's start lines above it show paths only)."""
    lines = ansi.rstrip("\n").split("\n")
    first = next((i for i, line in enumerate(lines) if ANSI.sub("", line).startswith("✓ health")), 0)
    return "\n".join(lines[first:])


CHROMIUM = ["/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", "--hide-scrollbars", "--force-device-scale-factor=1",
            "--virtual-time-budget=2000"]  # as tests/report/test_report_browser.py: offline, quiet, a CSS px a PNG px
REPORT_WIDTH = 1400


def _chromium(*args: str) -> str:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([*CHROMIUM, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                              timeout=120, check=True).stdout


def _report_png(html: Path, png: Path) -> None:
    """The page down to its last chart: the page's own probe writes each chart's box (data-box) into the DOM, so
    the window is made as tall as the charts reach (a fixed height cut the speak and call charts off)."""
    url = html.resolve().as_uri()
    dom = _chromium(f"--window-size={REPORT_WIDTH},4000", "--dump-dom", url)
    bottoms = [int(top) + int(height) for top, height in re.findall(r'data-box="-?\d+,(-?\d+),\d+,(\d+)"', dom)]
    if not bottoms:
        raise RuntimeError(f"{html}: no chart was drawn (no data-box in the DOM)")
    _chromium(f"--window-size={REPORT_WIDTH},{max(bottoms) + 60}", f"--screenshot={png}", url)


def render(out: Path) -> dict[str, Any]:
    """The three PNGs and the stamp from a lab run in ``out`` whose screens ``make`` kept there."""
    shot = _terminal_screenshot()
    pane = json.loads((out / SCREENS / "pane.json").read_text(encoding="utf-8"))
    width, command = int(pane["width"]), str(pane["command"])
    live = (out / SCREENS / "live.ansi").read_text(encoding="utf-8")
    whole = (out / SCREENS / "whole.ansi").read_text(encoding="utf-8")
    plain = ANSI.sub("", whole)
    result = RESULT.search(plain)
    if result is None or "[exit 0]" not in plain:
        raise RuntimeError(f"the lab did not end with its result line and exit 0:\n{plain[-3000:]}")
    shot.to_png(live, DOCS / PROGRESS_PNG, width, command)
    shot.to_png(_from_first_step(whole), DOCS / SUMMARY_PNG, width, command)
    _report_png(out / "report.html", DOCS / REPORT_PNG)
    steps = plan()
    counted = re.findall(r"(\d+) (?:passed|findings?|not checkable|failed)", result.group(0))
    stamp = {
        "version": STAMP_VERSION,
        "made_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "machine": f"{os.cpu_count()} cores",
        "plan": steps,
        "checks": sum(int(n) for n in counted),
        "result": result.group(0).strip(),
        "screenshots": {png: {"sha256": sha256_file(DOCS / png), "fingerprint": fingerprint(png, steps)}
                        for png in SOURCES},
    }
    write_stamp(stamp)
    return stamp


def make(port: int, out: Path, repeat: int, width: int, height: int) -> dict[str, Any]:
    lab = [sys.executable, "-m", "voice_llm", "lab", "--port", str(port), "--out", str(out), "--repeat", str(repeat)]
    try:
        live, whole = _lab_screens(lab, width, height, every_s=2.0, limit_s=1800)
    finally:  # the lab leaves its server running for the next run; these screenshots want none left behind
        subprocess.run([sys.executable, "-m", "voice_llm", "down", "--port", str(port)], capture_output=True)
    # Kept beside the run, so `render` can redraw the PNGs (a change to the PNG code alone) without another lab.
    (out / SCREENS).mkdir(exist_ok=True)
    (out / SCREENS / "live.ansi").write_text(live, encoding="utf-8")
    (out / SCREENS / "whole.ansi").write_text(whole, encoding="utf-8")
    pane = {"width": width, "command": f"voice-llm lab --port {port} --out {out} --repeat {repeat}"}
    (out / SCREENS / "pane.json").write_text(json.dumps(pane), encoding="utf-8")
    return render(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    made = sub.add_parser("make", help="run a real lab and regenerate docs/*.png and docs/screenshots.json")
    made.add_argument("--port", type=int, default=8093)  # not 8080: `make lab`'s server may be running there
    made.add_argument("--out", type=Path, default=Path("/tmp/shots-lab"))
    made.add_argument("--repeat", type=int, default=1)
    made.add_argument("--width", type=int, default=110)
    made.add_argument("--height", type=int, default=36)
    redraw = sub.add_parser("render", help="redraw the PNGs and the stamp from the screens a `make` kept in --out")
    redraw.add_argument("--out", type=Path, default=Path("/tmp/shots-lab"))
    sub.add_parser("check", help="exit 1 when the screenshots are stale")
    args = parser.parse_args(argv)
    if args.command in ("make", "render"):
        stamp = (make(args.port, args.out, args.repeat, args.width, args.height) if args.command == "make" else
                 render(args.out))
        print(f"screenshots written ({stamp['result']}); stamp {STAMP}")
        return 0
    reasons = stale()
    for reason in reasons:
        print(reason)
    if reasons:
        print(f"the screenshots are stale: {REMEDY}")
    return 1 if reasons else 0


if __name__ == "__main__":
    raise SystemExit(main())
