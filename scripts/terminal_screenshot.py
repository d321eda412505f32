"""Take PNG screenshots of a command's live terminal output (for docs/): run it in tmux, capture the pane with
its colours at chosen moments, render each capture with rich to SVG and the SVG with headless Chromium to PNG.

    python scripts/terminal_screenshot.py --out docs/terminal --every 4 --frames 40 -- voice-llm lab --port 8093

Writes <out>-NN.png for the frames whose text matches --match (default: any frame that changed), plus
<out>-final.png of the last screen. Needs tmux and /usr/bin/chromium.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.text import Text

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def capture(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-e", "-t", session], capture_output=True, text=True,
                          check=True).stdout


def to_png(ansi: str, png: Path, width: int, title: str) -> None:
    console = Console(record=True, width=width, file=open("/dev/null", "w"), force_terminal=True)
    console.print(Text.from_ansi(ansi.rstrip("\n")))
    with tempfile.TemporaryDirectory() as tmp:
        svg = Path(tmp) / "frame.svg"
        svg.write_text(console.export_svg(title=title))
        lines = max(ansi.rstrip("\n").count("\n") + 1, 4)
        size = f"{int(width * 12.3) + 40},{int(lines * 24.5) + 110}"
        subprocess.run(["/usr/bin/chromium", *CHROMIUM_FLAGS, f"--user-data-dir={tmp}/profile",
                        f"--window-size={size}", f"--screenshot={png}", svg.as_uri()],
                       capture_output=True, timeout=60, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="PNG path prefix")
    parser.add_argument("--every", type=float, default=3.0, help="seconds between captures")
    parser.add_argument("--frames", type=int, default=60, help="captures at most")
    parser.add_argument("--match", default="", help="regex a frame must match to be saved")
    parser.add_argument("--width", type=int, default=110)
    parser.add_argument("--height", type=int, default=32)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    session = f"shot{int(time.time())}"
    # The pane keeps the screen after the command ends, so the final summary can be captured too.
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", str(args.width), "-y", str(args.height),
                    f"{shlex.join(command)}; echo '[exit '$?']'; sleep 600"], check=True)
    saved, last = 0, ""
    try:
        for _ in range(args.frames):
            time.sleep(args.every)
            screen = capture(session)
            if screen != last and re.search(args.match, screen):
                saved += 1
                to_png(screen, Path(f"{args.out}-{saved:02d}.png"), args.width, " ".join(command))
            last = screen
            if "[exit " in screen:
                break
        to_png(capture(session), Path(f"{args.out}-final.png"), args.width, " ".join(command))
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    print(f"{saved} frames + final written to {args.out}-*.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
