"""The plugin seam: which capabilities this voice-llm has, and what each one contributes to the core.

The core (the run folder, checks, analysis, report, the lab pipeline) imports no capability statically. It asks
this module for the registered capabilities and resolves what they contribute by name ("module:function"), when
it is used: so removing a package's name from :data:`CAPABILITIES` removes its steps, checks, report sections,
metrics, key numbers, CLI flags and commands, and nothing else breaks (tests/registry/ shows it).

This module is plain data and a loader: it imports nothing of voice_llm at import time. Each capability package
exposes one value, ``CAPABILITY = Capability(...)``, in its ``__init__`` (which stays cheap to import: no
third-party heavy module, no module of the core). Adding a capability is adding a package and one line below.

One shape for a contribution: the core's own checks and report sections are the same :class:`CheckEntry` and
:class:`SectionEntry` a capability registers (the core's steps the same :class:`StepEntry`). A :data:`Reference`
is either the function itself (the core's entries: the core may import its own modules) or its name,
"module:function" (a capability's: a capability's checks and sections import the core's check and report
helpers, so if the core imported them back the layers would form a circle). A name is resolved only when the
core calls it, the way ``voice_llm.core.lab.steps`` always ran a step's module (pipecat keeps vendors out of the
framework the same way, locust's plugins hook in by event, not by import). So a misspelt name cannot wait for a
run to show up as a FAIL row: :func:`unresolved` lists every reference of a capability that does not resolve, and
tests/registry/test_references.py runs it over every registered capability.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

# A function the core calls: the function itself (the core's own entries) or "module:function" (a capability's).
Reference = Callable[..., Any] | str

# The capability packages, in the order their steps, checks and sections come after the core's.
CAPABILITIES: tuple[str, ...] = (
    "voice_llm.capabilities.speak",
    "voice_llm.capabilities.agent",
    "voice_llm.capabilities.dial",
    "voice_llm.capabilities.repeats",
    "voice_llm.capabilities.conversation",
    "voice_llm.capabilities.load",
)

# A comma-separated list of capability names (Capability.name) to leave out, for a run without them (a machine
# with no TTS, a test of the seam). Read each time the registry is asked.
WITHOUT_ENV = "VOICE_LLM_WITHOUT"


@dataclass(frozen=True)
class StepEntry:
    """A step of the lab a capability adds: ``module`` has ``run(ctx) -> list[Path]`` and writes ``artifacts``."""

    name: str
    title: str
    module: str  # full module path, e.g. "voice_llm.capabilities.speak.step"
    artifacts: tuple[str, ...]
    in_lab: bool = True  # run by `voice-llm lab`; False: only when asked (`voice-llm <name>`)
    needs_server: bool = True
    after: str | None = None  # the step it follows in the lab's order (None: at the end, before "report")
    reads_kb: bool = False  # its command takes --kb
    # its command's default --out is ~/voice/<out_dir> (None: the lab's ~/voice/llm): a step whose run is not the
    # lab's (dial: another agent's call) must not land in the lab's folder by default (issue 41 item 8)
    out_dir: str | None = None
    # the file it writes instead of its artifacts when it fails (dial: dial-partial.json, what the call heard until
    # then): `check` says the step failed and names it, once, instead of failing each check of the missing artifact
    partial: str | None = None


@dataclass(frozen=True)
class CheckEntry:
    """A check of ``check`` (the core's, voice_llm.core.checks.core.CHECKS, and a capability's): ``function`` takes the
    run folder and returns the detail line of a PASS, or raises CheckFailed / Finding / NotCheckable
    (voice_llm.core.checks.base). It runs when the run ran ``step`` (None: always; a folder without run.json: when
    ``artifact`` is there)."""

    name: str
    step: str | None
    function: Reference
    artifact: str | None = None

    def run(self, out: Any) -> str:
        """The check on ``out`` (a RunFolder or its path); a name is imported now."""
        return resolve(self.function)(out)


@dataclass(frozen=True)
class SectionEntry:
    """A section of report.html (the core's, voice_llm.core.report.page.CORE_SECTIONS, and a capability's): ``builder``
    takes the parsed ``artifact`` (None: the whole run folder, a voice_llm.core.run.folder.RunFolder) and returns a
    chart (voice_llm.core.report.style.Chart) or an HTML fragment; ``after`` places a capability's after a section
    drawn before it (a core one, or one registered earlier)."""

    name: str
    title: str
    artifact: str | None
    builder: Reference
    after: str | None = None
    optional: bool = False  # another run's leftover of this artifact is not drawn

    def build(self, data: Any) -> Any:
        """The section's chart (or HTML) from ``data``; a name is imported now."""
        return resolve(self.builder)(data)


@dataclass(frozen=True)
class Capability:
    """What one capability contributes. Every reference is a "module:function" (or a module path for steps): the
    core never imports a capability's modules until it uses them."""

    name: str
    summary: str
    steps: tuple[StepEntry, ...] = ()
    checks: tuple[CheckEntry, ...] = ()
    sections: tuple[SectionEntry, ...] = ()
    metrics: str | None = None  # () -> tuple of voice_llm.core.analysis.metrics.Metric
    key_numbers: str | None = None  # () -> tuple of voice_llm.core.analysis.keynumbers.KeyNumber
    cli: str | None = None  # (parser, command: str) -> None: adds its flags to the lab's and its steps' parsers
    # (subparsers) -> None: adds whole commands (`voice-llm load`), each setting settings_of(values) -> its settings
    # and run_command(settings, progress) -> exit status on its parser (voice_llm.cli.main.cmd_capability)
    commands: str | None = None
    options: str | None = None  # (args) -> its frozen options value, kept in StepOptions.plugins[name]
    install: str | None = None  # () -> None: what `voice-llm install` fetches for it
    installs: str | None = None  # that, in words, for `voice-llm install --help` ("load the default TTS voice ...")
    artifacts: tuple[str, ...] = ()  # every file it may leave in OUT (check knows a run folder by them)
    requires: tuple[str, ...] = field(default=())  # other capabilities whose public face it uses
    # (out_a: Path, out_b: Path) -> None, or {"kind", "lines": [str], ...}: its own part of `voice-llm compare A B`
    # for what the core's metrics cannot hold (two load sweeps, step by step); None when neither folder is its kind
    compare: str | None = None
    # Its sections of compare.html (voice_llm.core.report.compare_page), as ``sections`` are of report.html: each
    # builder takes what its ``compare`` returned (the dict whose "kind" is this capability's name) and returns a
    # chart (voice_llm.core.report.style.Chart) or the section's HTML; drawn only when ``compare`` returned one.
    compare_sections: tuple[SectionEntry, ...] = ()
    # (folder: RunFolder) -> voice_llm.core.analysis.keynumbers.Headline | None: the caller's number of a run whose artifact
    # holds it in no fixed place (a load sweep's first dialing step), asked when no ``headline`` key number was
    # measured; None when its artifact is absent or holds no heard gap
    headline: str | None = None


_disabled: set[str] = set()


def _named_in_env() -> list[str]:
    return [n.strip() for n in os.environ.get(WITHOUT_ENV, "").split(",") if n.strip()]


def _without() -> set[str]:
    return set(_named_in_env()) | _disabled


def registered() -> tuple[Capability, ...]:
    """Every registered capability, also those left out."""
    return tuple(importlib.import_module(package).CAPABILITY for package in CAPABILITIES)


def unknown_without() -> list[str]:
    """The names VOICE_LLM_WITHOUT gives that are no capability's (a typo, "TTS" for "tts"): the CLI refuses them
    in one line rather than run with nothing left out."""
    known = {c.name for c in registered()}
    return [name for name in _named_in_env() if name not in known]


def left_out() -> dict[str, str]:
    """Each capability left out, with why: named in VOICE_LLM_WITHOUT (or registry.without), or it requires one
    that is left out (followed through: a capability needing one that needs a left-out one goes too)."""
    every = registered()
    named = _without()
    reasons = {c.name: f"the {c.name} capability is left out" for c in every if c.name in named}
    changed = True
    while changed:
        changed = False
        for capability in every:
            if capability.name in reasons:
                continue
            missing = [r for r in capability.requires if r in reasons]
            if missing:
                reasons[capability.name] = (f"{capability.name} needs {', '.join(missing)}, which "
                                            f"{'is' if len(missing) == 1 else 'are'} left out")
                changed = True
    return reasons


def capabilities() -> tuple[Capability, ...]:
    """The registered capabilities that are not left out, in registry order. A capability left out takes those
    that require it with it."""
    out = left_out()
    return tuple(c for c in registered() if c.name not in out)


def names() -> tuple[str, ...]:
    return tuple(c.name for c in capabilities())


def enabled(name: str) -> bool:
    return name in names()


class UnresolvedReference(ImportError):
    """A "module:function" reference names no function: the module is not there, or has no such name."""


def resolve(reference: Reference) -> Callable[..., Any]:
    """The function ``reference`` names ("module:function", imported now), or the function itself."""
    if callable(reference):
        return reference
    module, _, attribute = reference.partition(":")
    if not module or not attribute:
        raise UnresolvedReference(f"not a 'module:function' reference: {reference!r}")
    try:
        found = getattr(importlib.import_module(module), attribute, None)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if not (module == missing or module.startswith(f"{missing}.")):  # the module is there; what it imports is not
            raise
        raise UnresolvedReference(f"{reference}: there is no module {module}") from None
    if not callable(found):
        raise UnresolvedReference(f"{reference}: {module} has no function {attribute}")
    return found


def references(capability: Capability) -> Iterator[tuple[str, Reference]]:
    """Every reference ``capability`` makes, as (what, reference): each check, section and step module (its
    ``run``), and the metrics, key_numbers, cli, commands, options, install, compare and headline functions."""
    for entry in capability.checks:
        yield f"check {entry.name!r}", entry.function
    for section in capability.sections:
        yield f"section {section.name!r}", section.builder
    for section in capability.compare_sections:
        yield f"compare section {section.name!r}", section.builder
    for step in capability.steps:
        yield f"step {step.name!r}", f"{step.module}:run"
    for field_name in ("metrics", "key_numbers", "cli", "commands", "options", "install", "compare", "headline"):
        reference = getattr(capability, field_name)
        if reference is not None:
            yield field_name, reference


def unresolved(capability: Capability) -> list[str]:
    """One line per reference of ``capability`` that does not resolve to a function (empty: every one does).
    A step's module must have ``run``. Imports the capability's modules (not for a run: for a test, a check)."""
    wrong = []
    for what, reference in references(capability):
        try:
            resolve(reference)
        except (UnresolvedReference, AttributeError, TypeError) as exc:
            wrong.append(f"{capability.name}: {what}: {exc}")
    return wrong


@contextmanager
def without(*capability_names: str) -> Iterator[None]:
    """Leave ``capability_names`` out while the block runs (in this process), as if they were not registered."""
    before = set(_disabled)
    _disabled.update(capability_names)
    try:
        yield
    finally:
        _disabled.clear()
        _disabled.update(before)
