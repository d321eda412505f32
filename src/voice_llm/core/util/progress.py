"""Progress for everything slow: a live line on a terminal, plain lines elsewhere, nothing with --quiet.

Library code only calls the :class:`Progress` methods; which kind is used is decided once, by the CLI.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Protocol

from rich.console import Console
from rich.progress import BarColumn, Progress as RichBar, SpinnerColumn, TextColumn, TimeElapsedColumn


class Progress(Protocol):
    def start(self, title: str, total: float | None = None) -> None: ...
    def update(self, detail: str, completed: float | None = None) -> None: ...
    def finish(self, summary: str) -> None: ...
    # a line that stays (a turn of a call as it ends): printed above a live bar, or as a line of its own
    def note(self, line: str) -> None: ...


class NullProgress:
    """--quiet: say nothing."""

    def start(self, title: str, total: float | None = None) -> None:
        pass

    def update(self, detail: str, completed: float | None = None) -> None:
        pass

    def finish(self, summary: str) -> None:
        pass

    def note(self, line: str) -> None:
        pass


class PlainProgress:
    """Not a terminal (CI, a pipe): one line at the start, a line at most every ``every_s`` seconds, one at
    the end, so a log shows that a 5-minute build is alive without a line per compiled file."""

    def __init__(self, stream: IO[str] | None = None, every_s: float = 10.0) -> None:
        self._stream = stream or sys.stderr
        self._every_s = every_s
        self._title = ""
        self._t0 = self._last = 0.0

    def _print(self, text: str) -> None:
        print(text, file=self._stream, flush=True)

    def start(self, title: str, total: float | None = None) -> None:
        self._title, self._t0 = title, time.monotonic()
        self._last = self._t0
        self._print(f"{title} ...")

    def update(self, detail: str, completed: float | None = None) -> None:
        now = time.monotonic()
        if now - self._last >= self._every_s:
            self._last = now
            pct = f" {completed:.0f}%" if completed is not None else ""
            self._print(f"  {self._title}:{pct} {detail} ({now - self._t0:.0f} s)")

    def finish(self, summary: str) -> None:
        self._print(f"{self._title}: {summary} ({time.monotonic() - self._t0:.1f} s)")

    def note(self, line: str) -> None:
        self._print(f"  {line}")


class LiveProgress:
    """A terminal: a spinner, the step, a bar when the total is known, the detail and the elapsed time."""

    def __init__(self, console: Console | None = None) -> None:
        self._console = console or Console(stderr=True)
        self._bar: RichBar | None = None
        self._task = None
        self._title = ""
        self._t0 = 0.0

    def start(self, title: str, total: float | None = None) -> None:
        self.finish_if_open()
        self._title, self._t0 = title, time.monotonic()
        self._bar = RichBar(
            SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(bar_width=24),
            TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
            console=self._console, transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task(title, total=total, detail="")

    def update(self, detail: str, completed: float | None = None) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, detail=detail, completed=completed)

    def finish(self, summary: str) -> None:
        self.finish_if_open()
        self._console.print(f"[green]✓[/] {self._title}: {summary} [dim]({time.monotonic() - self._t0:.1f} s)[/]")

    def note(self, line: str) -> None:
        # through the bar's console: rich prints it above the live bar, which stays
        self._console.print(line, markup=False, highlight=False)

    def finish_if_open(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def make_progress(quiet: bool = False, stream: IO[str] | None = None) -> Progress:
    stream = stream or sys.stderr
    if quiet:
        return NullProgress()
    if stream.isatty():
        return LiveProgress(Console(file=stream))
    return PlainProgress(stream)
