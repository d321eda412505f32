"""The lab as a library call: server -> steps -> run.json -> check -> report.

    from voice_llm.core.lab import LabSettings, run_lab
    result = run_lab(LabSettings(out=Path("out")))
    result.checks, result.run["metadata"], result.report_html

``run_lab`` runs every lab step into one run; ``run_steps`` runs some steps on their own, joining the run already
in OUT when it was made against the same server, model and KB. Both go through the one run session
(voice_llm.core.run.session: OUT's lock, the server, the probe, the identity, run.json however it ends), as `load` does.
The steps are the registry's (voice_llm.core.lab.steps): a capability left out takes its steps with it.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from voice_llm.core.checks.core import CheckResult, require_something_to_check, run_checks
from voice_llm.core.errors import ConfigError, VoiceLLMError
from voice_llm.core.client.api import ServerClient
from voice_llm.core.run.context import LabContext, StepOptions
from voice_llm.core.run.preflight import check_context_fits
from voice_llm.core.lab.steps import kb_steps, lab_steps, steps as registered_steps
from voice_llm.core.report.page import render_report
from voice_llm.core.run import meta as runmeta, session
from voice_llm.core.scenario import brief
from voice_llm.core.scenario.kb import default_kb_dir, load_kb
from voice_llm.core.server.config import ServerSettings
from voice_llm.core.util.artifacts import REPORT, REPORT_HTML
from voice_llm.core.util.progress import NullProgress, Progress

Notify = Callable[[str], None]
PROBE_RAW = session.PROBE_RAW


@dataclass(frozen=True)
class LabSettings:
    """Everything a lab run needs. ``url`` None means the managed llama-server on ``server.port`` (started if it
    is not running, with ``server_bin``/``model`` or the cached build and the default model)."""

    out: Path
    kb_dir: Path | None = None
    url: str | None = None
    server: ServerSettings = field(default_factory=ServerSettings)
    server_bin: str | None = None
    model: str | None = None
    request_model: str | None = None  # the model name sent in requests; None: the first id of /v1/models
    api_key: str | None = field(default=None, repr=False)
    steps: tuple[str, ...] | None = None  # None: every lab step registered when the run starts
    options: StepOptions = field(default_factory=StepOptions)
    wait_for_out: bool = False  # another run holds OUT: wait for it instead of refusing
    restart_server: bool = False  # the managed server runs with other settings: restart it instead of refusing
    render_html: bool = True
    new_run: bool = False  # a step alone: replace a run in OUT made against another server instead of refusing

    @property
    def kb(self) -> Path:
        return Path(self.kb_dir) if self.kb_dir else default_kb_dir()


@dataclass(frozen=True)
class StepTiming:
    step: str
    wall_ms: float
    server_compute_ms: float

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "wall_ms": self.wall_ms, "server_compute_ms": self.server_compute_ms}


@dataclass(frozen=True)
class LabResult:
    out: Path
    run: dict[str, Any]  # run.json as written
    written: tuple[Path, ...]  # the artifacts the steps wrote, in order
    checks: tuple[CheckResult, ...] = ()
    report_html: Path | None = None
    server_url: str = ""
    note: str | None = None  # said to the user (a new run started over another one, ...)

    @property
    def run_id(self) -> str:
        return self.run[runmeta.RUN_ID]

    @property
    def passed(self) -> bool:
        return all(check.ok for check in self.checks)


def _asked(settings: LabSettings) -> session.Asked:
    return session.Asked(settings.url, settings.api_key, settings.options.timeout, settings.options.deadline_s)


def _target(settings: LabSettings, progress: Progress, notify: Notify, start_server: bool) -> session.Target:
    if settings.url:
        return session.given_target(settings.url)
    if start_server:
        started = session.bring_up(settings.server, settings.server_bin, settings.model, progress,
                                   restart=settings.restart_server)
        notify(session.started_line(started))
        return session.managed_target(started)
    return session.running_target(settings.server.url)


def _check_context(settings: LabSettings, steps: Sequence[str], client: ServerClient, n_ctx: int | None) -> None:
    """Before the first request: the longest prompt of the steps that attach documents fits the server's context
    (else they would fail with HTTP 400 after minutes of work). ``n_ctx``: from the /props already read."""
    if kb_steps() & set(steps):
        check_context_fits(client, load_kb(settings.kb, need=brief.CACHE_DOCS), n_ctx)


def run_step(name: str, ctx: LabContext) -> tuple[list[Path], StepTiming]:
    step = registered_steps()[name]
    run = importlib.import_module(step.module).run
    ctx.progress.start(f"{name}: {step.title}")
    before = ctx.ledger.total_ms
    t0 = time.perf_counter()
    written = run(ctx)
    ctx.commit_streams()  # a step that wrote no JSON (sse): its streams take their final names now it succeeded
    wall = (time.perf_counter() - t0) * 1000.0
    ctx.progress.finish(", ".join(path.name for path in written))
    return written, StepTiming(name, wall, ctx.ledger.total_ms - before)


def _run_steps_in(ctx: LabContext, live: session.Live, steps: Sequence[str]) -> list[Path]:
    """Run ``steps`` in order in the session's run, each step's timing recorded as it finishes
    (:meth:`voice_llm.core.run.session.Live.step_finished`). For the lab (a whole run) its wall time against the
    server's compute is the run's."""
    written: list[Path] = []
    t0 = time.perf_counter()

    def summary() -> dict[str, Any]:
        wall = (time.perf_counter() - t0) * 1000.0
        compute = ctx.ledger.total_ms
        return {"wall_ms": wall, "server_compute_ms": compute, "requests": ctx.ledger.requests,
                "wall_over_compute": wall / compute if compute else None}

    if live.plan.whole_run:
        live.state.summary = summary
    for name in steps:
        live.state.step = name
        live.state.ran.append(name)
        paths, timing = run_step(name, ctx)
        written += paths
        # The load right after each step: the noise warning's evidence of what else ran during the run.
        live.step_finished({**timing.as_dict(), "load_average": runmeta.load_average()})
    return written


def _context(settings: LabSettings, live: session.Live, progress: Progress) -> LabContext:
    # The steps read what the server exposes from the context (which numbers it gives, the model name every
    # request carries); a probe that learned nothing leaves them behaving as for llama-server.
    probed = live.probed
    return LabContext(out=live.out, client=live.client, kb_dir=settings.kb, progress=progress,
                      server_log=live.target.log, options=settings.options, run=live.record,
                      capabilities=probed.informative if probed is not None else None)


def prepare_steps(options: StepOptions, steps: Sequence[str]) -> None:
    """What each planned step needs must be here before anything is asked or written: each step's ``prepare``
    hook (voice_llm.core.lab.steps: the speak step loads its TTS engine and --voice there, converse finds its STT).
    Every step is asked, so one message names all that is missing (the step that needs it in each)."""
    table = registered_steps()
    missing: list[tuple[str, VoiceLLMError]] = []
    for name in steps:
        prepare = getattr(importlib.import_module(table[name].module), "prepare", None)
        if prepare is None:
            continue
        try:
            prepare(options)
        except VoiceLLMError as exc:
            missing.append((name, exc))
    if len(missing) == 1:
        name, exc = missing[0]
        exc.add_note(f"needed by the {name} step; nothing was asked or written")
        raise exc
    if missing:
        raise ConfigError("the planned steps need what is not here: " + "; ".join(
            f"{name}: {exc}" for name, exc in missing) + "; nothing was asked or written")


def _needs_server(steps: Sequence[str]) -> bool:
    table = registered_steps()
    return any(table[name].needs_server for name in steps)


def _unknown(steps: Sequence[str]) -> None:
    table = registered_steps()
    missing = [name for name in steps if name not in table]
    if missing:
        raise ConfigError(f"no such step: {', '.join(missing)} (the registered steps: {', '.join(table)})")


def _plan_of(settings: LabSettings, command: str, steps: Sequence[str], whole_run: bool) -> session.Plan:
    ask = _needs_server(steps)
    # A run plans what its commands plan: a step alone plans itself (a lone `dial` planned the lab's steps too, and
    # `check` then listed health, sse, ... as "planned steps not run"); a later command joining the run adds its own
    # (RunRecord.join_or_start).
    planned = _plan(steps)
    return session.Plan(out=settings.out, command=command, asked=_asked(settings), kb=settings.kb, steps=planned,
                        whole_run=whole_run, new_run=settings.new_run, ask_server=ask,
                        request_model=settings.request_model, wait=settings.wait_for_out)


def _servers(settings: LabSettings, progress: Progress, notify: Notify, start_server: bool,  # type: ignore[no-untyped-def]
             steps: Sequence[str]):
    """The session's bring-up hook: the one server of a lab or a step (nothing to stop afterwards). Steps that ask
    no server (report alone) keep no server log: the managed server running now on that port measured nothing of
    this run (its log copied into OUT by `voice-llm report` was another server's evidence in the run's folder)."""
    def target() -> session.Target:
        found = _target(settings, progress, notify, start_server)
        return found if _needs_server(steps) else replace(found, log=None)
    return lambda: [contextlib.nullcontext(target())]


def _preflight(settings: LabSettings, steps: Sequence[str]) -> Callable[[ServerClient, session.Target, bool], None]:
    return lambda client, target, first: _check_context(settings, steps, client, target.facts.n_ctx)


def run_lab(settings: LabSettings, progress: Progress | None = None, notify: Notify | None = None) -> LabResult:
    """The whole lab: bring the server up (or use ``settings.url``), run the steps into a new run, write
    run.json, check the files against each other and render report.html."""
    progress = progress or NullProgress()
    notify = notify or (lambda message: None)
    steps = settings.steps if settings.steps is not None else lab_steps()
    _unknown(steps)
    # What each step needs, the options and the KB first: a missing package, a bad --voice or KB folder is named
    # before the server start, a request or a file.
    prepare_steps(settings.options, steps)
    load_kb(settings.kb, need=12)
    written: list[Path] = []

    def step(live: session.Live) -> None:
        written.extend(_run_steps_in(_context(settings, live, progress), live, steps))

    def after(live: session.Live) -> LabResult:
        checks = tuple(run_checks(live.out))
        html = render(live.out, checks) if settings.render_html else None
        return LabResult(live.out, live.record.doc, tuple(written), checks, html, live.target.url)

    plan = _plan_of(settings, "lab", steps, whole_run=True)
    hooks = session.Hooks(servers=_servers(settings, progress, notify, start_server=True, steps=steps), step=step,
                          preflight=_preflight(settings, steps), after=after)
    return session.Session(plan, progress, notify).run(hooks)


def run_steps(settings: LabSettings, steps: Sequence[str], progress: Progress | None = None,
              notify: Notify | None = None) -> LabResult:
    """Some steps on their own against a running server; they join the run in OUT when the server, model and
    KB match. A run there made against another server is refused before the first measuring request
    (voice_llm.core.run.meta.OtherRunError), unless ``settings.new_run``: then it is replaced once the first step has
    finished (``LabResult.note`` says so), and a step that fails leaves it as it was. A step that joins a run
    whose report.json exists brings report.json (and report.html, when there is one) up to date with what it
    measured."""
    progress = progress or NullProgress()
    notify = notify or (lambda message: None)
    _unknown(steps)
    if set(steps) == {"report"}:  # the report of nothing: refused as `check` refuses it, before OUT is touched
        require_something_to_check(settings.out)
    prepare_steps(settings.options, steps)
    if kb_steps() & set(steps):  # a bad KB folder is named before anything is asked or written
        load_kb(settings.kb, need=12)
    notes: list[str] = []
    written: list[Path] = []
    refresh = False

    def told(message: str) -> None:
        notes.append(message)
        notify(message)

    def step(live: session.Live) -> None:
        nonlocal refresh
        joined = not notes and REPORT in (live.record.doc.get("artifacts") or {})
        # The report follows the step in a run that has one: report.json must equal its sources again.
        refresh = joined and "report" not in steps
        to_run = [*steps, "report"] if refresh else list(steps)
        written.extend(_run_steps_in(_context(settings, live, progress), live, to_run))

    def after(live: session.Live) -> LabResult:
        html = None
        if settings.render_html and ("report" in steps or (refresh and (live.out / REPORT_HTML).is_file())):
            html = render(live.out, tuple(run_checks(live.out)))  # report.json and the page that shows it
        return LabResult(live.out, live.record.doc, tuple(written), (), html, live.target.url,
                         notes[0] if notes else None)

    plan = _plan_of(settings, " ".join(steps), steps, whole_run=False)
    hooks = session.Hooks(servers=_servers(settings, progress, notify, start_server=False, steps=steps), step=step,
                          preflight=_preflight(settings, steps), after=after)
    return session.Session(plan, progress, told).run(hooks)


def _plan(steps: Sequence[str]) -> dict[str, tuple[str, ...]]:
    table = registered_steps()
    return {name: table[name].artifacts for name in dict.fromkeys(steps)}


def render(out: Path, checks: Sequence[CheckResult]) -> Path:
    """report.html from the files in OUT and the checks of them."""
    return render_report(out, checks)
