"""`load`'s run: every sweep in one run session (voice_llm.core.run.session.Session), as the lab's steps are.

``run_load(LoadSettings)`` beside the lab's ``run_lab(LabSettings)``; its hooks into the session's phases:
bring-up, the managed server once per ``--slots`` value (stopped after its sweep when this run started it) or the
--url given; preflight, the lab's context check (voice_llm.core.run.preflight: the planned call's longest turn against
the context of one slot, and of the managed servers still to come) before any turn; the first server's probe and
identity are the run's (load.json joins the lab's run when it is the same server, model and KB, and refuses to
mix with another's unless --new-run); step, one sweep through the Locust master subprocess; close, however the
sweeps end: load_samples.csv, load.json and the probe's capabilities.json written from what was measured, before
run.json is finished; after, report.html with the load section.

This module never imports locust (see voice_llm.capabilities.load.runner).
"""

from __future__ import annotations

import contextlib
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from voice_llm.core.analysis import noise
from voice_llm.core.checks.core import run_checks
from voice_llm.core.client.api import ServerClient
from voice_llm.core.errors import ConfigError, ContextLimitError, VoiceLLMError
from voice_llm.core.run import flags, preflight
from voice_llm.capabilities.load.document import load_document, sweep_document
from voice_llm.capabilities.load.settings import DEFAULT_SLOTS, LoadSettings
from voice_llm.capabilities.dial import DialOptions
from voice_llm.capabilities.load.plan import (AGENT_LOAD_MAX_TOKENS, DEFAULT_MASTER_PORT, DIAL_STT, DIAL_THINK_MS,
                                              DIAL_THINK_SHARE, LOAD_MAX_TOKENS, REFUSED_PAUSE_S, CallerConfig,
                                              SweepPlan)
from voice_llm.capabilities.load import proccpu, stages, stats
from voice_llm.capabilities.load.runner import LoadError, SweepInterrupted, run_sweep
from voice_llm.capabilities.load.samples import write_samples
from voice_llm.capabilities.load.speech import answer_speech_rate
from voice_llm.capabilities.load.stats import slots_label
from voice_llm.core.report.page import render_report
from voice_llm.core.run import meta as runmeta, session
from voice_llm.core.scenario import dialogue as dialogues
from voice_llm.core.scenario.kb import default_kb_dir, load_kb
from voice_llm.core.server import lifecycle as server
from voice_llm.core.server.config import DEFAULT_CTX, DEFAULT_PORT, ServerSettings, default_out_dir, is_loopback
from voice_llm.core.sse import StreamError
from voice_llm.core.util import procfs
from voice_llm.core.util.artifacts import LOAD, LOAD_SAMPLES, write_json
from voice_llm.core.util.progress import NullProgress, Progress

CTX_PER_SLOT = 4096  # the lab's whole context per slot: the 12-document call's last turn needs ~3500 tokens with its answers
STEP = "load"  # its name in run.json


@dataclass(frozen=True)
class LoadResult:
    out: Path
    doc: dict[str, Any] | None  # load.json as written; None when nothing was measured
    load_path: Path | None
    samples_path: Path | None
    report_html: Path | None = None
    render_error: str | None = None  # the measurements are saved, but report.html could not be drawn
    interrupted: bool = False  # Ctrl-C or SIGTERM ended it; what was measured is saved (``kept`` says what)
    kept: str = ""


# --- what the callers say, and the sweep ---------------------------------------------------------------------------


def caller_config(settings: LoadSettings, url: str, out: Path) -> tuple[CallerConfig, dict[str, Any]]:
    dialogue = dialogues.load_dialogue(settings.dialogue)
    if settings.max_tokens is not None:
        dialogue = replace(dialogue, max_tokens=settings.max_tokens)
    elif dialogue.name != dialogues.LAB_TTFT:  # lab-ttft is the lab's own request, unchanged
        # short replies for load (plan.LOAD_MAX_TOKENS says why): the first sentence is measured the same
        dialogue = replace(dialogue, max_tokens=min(dialogue.max_tokens, LOAD_MAX_TOKENS))
    docs = load_kb(settings.kb, need=settings.docs)[:settings.docs] if dialogue.use_docs else []
    rate, source = answer_speech_rate(out)
    config = CallerConfig(
        url=url, system=dialogues.system_prompt(dialogue, docs), turns=dialogue.turns,
        max_tokens=dialogue.max_tokens, history=dialogue.history, cache_prompt=dialogue.cache_prompt,
        answer_words_per_s=rate, caller_words_per_s=settings.caller_words_per_s, think_scale=settings.think_scale,
        barge_in_share=settings.barge_in, timeout_s=settings.timeout,
    )
    described = {
        "dialogue": dialogue.name, "docs": len(docs), "turns": len(dialogue.turns), "max_tokens": dialogue.max_tokens,
        "history": dialogue.history, "cache_prompt": dialogue.cache_prompt, "barge_in_share": settings.barge_in,
        "think": {"answer_words_per_s": rate, "answer_rate_source": source,
                  "caller_words_per_s": settings.caller_words_per_s, "think_scale": settings.think_scale},
    }
    return config, described


def dial_caller(settings: LoadSettings) -> tuple[CallerConfig, DialOptions, dict[str, Any]]:
    """Dialing callers: the call each makes, dial's own settings (DialOptions: what load decides of the call, the
    rest dial's declared defaults), handed to every call whole as JSON (`dial --settings FILE`:
    voice_llm.capabilities.load.dialing); the text caller's config travels empty: no LLM request is made."""
    assert settings.dial is not None  # --url beside it and the barge-in turns are refused by LoadSettings (exit 2)
    try:
        # its turns and barge-in plan asked for (as flags are): a later call saying the lines a worker kept
        # (--caller-audio) keeps them rather than the folder's
        dial: DialOptions = flags.build(DialOptions, {
            "url": settings.dial, "protocol": settings.dial_protocol, "turns": settings.dial_turns,
            "barge_in_turns": tuple(settings.dial_barge_in_turns), "deadline_s": settings.dial_deadline_s,
            "caller_lines": settings.dial_lines, "think_ms": DIAL_THINK_MS, "think_share": DIAL_THINK_SHARE,
            "stt": DIAL_STT, "turns_given": True, "barge_in_given": True})
    except ConfigError as exc:  # what dial would refuse of every call (a deadline shorter than its own waits)
        raise ConfigError(f"--dial: every call would be refused: {exc}") from None
    described = {"mode": "dial", "url": settings.dial, "protocol": dial.protocol, "turns": dial.turns,
                 "barge_in_turns": list(dial.barge_in_turns), "deadline_s": dial.deadline_s,
                 "refused_pause_s": REFUSED_PAUSE_S, "lines": dial.caller_lines,
                 "think": {"think_ms": dial.think_ms, "think_share": dial.think_share,
                           "rule": f"after dial's reply-end silence ({dial.reply_end_ms:g} ms heard silent, the "
                                   "buffer idle): think_ms + think_share x the reply as heard (first to last sound)"},
                 "agent_max_tokens_advised": AGENT_LOAD_MAX_TOKENS,
                 "how": "each caller: one `voice-llm dial URL --stt none` subprocess per call, one call after "
                        "another; the first call of each worker synthesizes the lines (Piper), later calls say "
                        "that call's caller WAVs (--caller-audio); a turn starts at the caller's speech end"}
    return CallerConfig(url=settings.dial, system="", turns=()), dial, described


def sweep_plan(settings: LoadSettings, caller: CallerConfig, slots: int | None) -> SweepPlan:
    callers = tuple(sorted({n for n in settings.callers if n <= settings.max_callers}))
    if not callers:
        raise ConfigError(f"no step of --callers is within --max-callers {settings.max_callers}")
    remote = settings.master
    return SweepPlan(
        caller=caller, callers=callers, step_s=settings.step_s, warmup_s=settings.warmup_s,
        slo_first_sentence_ms=settings.slo_first_sentence_ms, local_workers=0 if remote else settings.workers,
        expect_workers=settings.expect_workers if remote else settings.workers,
        bind_host=settings.master_bind_host if remote else "127.0.0.1",
        # local workers connect to a free port unless --master-port names one (then it is that port or an error)
        master_port=(settings.master_port or DEFAULT_MASTER_PORT) if remote else (settings.master_port or 0),
        stop_on_budget=settings.stop_on_budget, slots=slots,
        quiet=settings.quiet, slo_heard_ms=settings.slo_heard_ms,
    )


def plan_of(settings: LoadSettings, caller: CallerConfig, dial: DialOptions | None) -> SweepPlan:
    """The sweep's plan before its server is known: a step's window ends as soon as it holds enough judged turns
    for a verdict (stats.MIN_JUDGED_TURNS; --step-s is the longest window), in both modes."""
    plan = replace(sweep_plan(settings, caller, None), dial=dial, enough_judged=stats.MIN_JUDGED_TURNS)
    if dial is not None:  # the drain waits for the calls still running: each wait of a call is up to its deadline
        plan = replace(plan, drain_timeout_s=max(plan.drain_timeout_s, (2 * dial.turns + 1) * dial.deadline_s + 30.0))
    return plan


# --- the servers ----------------------------------------------------------------------------------------------------


def managed_as_it_runs(settings: LoadSettings, notify: Callable[[str], None]) -> LoadSettings:
    """No --slots, --url or --dial: the managed llama-server already running on --port is swept as it is (its
    slots and context, as with --url: `voice-llm up --slots 4 --ctx 16384` then `voice-llm load`), and left
    running; with none running, one managed server per DEFAULT_SLOTS value, each stopped after its sweep."""
    if settings.slots is not None or settings.url or settings.dial is not None:
        return settings if settings.slots is not None else replace(settings, slots=DEFAULT_SLOTS)
    record = server.read_record(settings.port)
    if record is None or not server.is_alive(record):
        return replace(settings, slots=DEFAULT_SLOTS)
    notify(f"sweeping the managed llama-server already running on port {record.port} as it is "
           f"({slots_label(record.slots)}, -c {record.ctx}); --slots N sweeps managed servers of its own")
    return replace(settings, url=record.url, slots=(record.slots,))


def managed_settings(settings: LoadSettings, slots: int) -> ServerSettings:
    return ServerSettings(port=settings.port, ctx=max(settings.ctx, slots * CTX_PER_SLOT), slots=slots,
                          threads=settings.threads, api_key=settings.api_key)


def _refuse_other_managed(settings: LoadSettings, wanted: ServerSettings) -> None:
    """A managed server already on --port with other slots or context cannot be swept (server.start would say only
    that its settings differ): name what each of its slots holds and the ways on, before anything starts."""
    record = server.read_record(wanted.port)
    if record is None or not server.is_alive(record) or (record.slots, record.ctx) == (wanted.slots, wanted.ctx):
        return
    same = managed_settings(settings, record.slots)
    sweep_it = f"sweep it with --slots {record.slots}, " if (same.slots, same.ctx) == (record.slots, record.ctx) else ""
    raise ConfigError(
        f"a managed llama-server already runs on port {record.port} with {slots_label(record.slots)} and -c "
        f"{record.ctx} ({record.ctx // record.slots} tokens per slot), and this sweep needs {slots_label(wanted.slots)} "
        f"and -c {wanted.ctx} ({wanted.ctx // wanted.slots} tokens per slot): {sweep_it}measure that server as "
        f"it is with --url {record.url} (its context is checked first), or stop it first "
        f"(`voice-llm down --port {record.port}`)")


@dataclass(frozen=True)
class _Server:
    target: session.Target
    started: bool  # this run started it, and stops it after its sweep
    pid: int | None


def _bring_up(settings: LoadSettings, slots: int | None, progress: Progress) -> _Server:
    """The server of one sweep: the --url given, or the managed one with ``slots`` slots (run.session.bring_up)."""
    if settings.url:
        return _Server(session.given_target(settings.url), False, local_listener_pid(settings.url))
    assert slots is not None
    wanted = managed_settings(settings, slots)
    _refuse_other_managed(settings, wanted)
    # A managed server already running with other settings is an error that names them (server.start).
    started = session.bring_up(wanted, settings.server_bin, settings.model, progress)
    return _Server(session.managed_target(started), not started.already_running, started.record.pid)


def measured_stack_pids(dial_url: str, **found: Any) -> set[int]:
    """The pids of a dialed agent on this machine and of its LLM server (listening on the agent's --url), as load's
    per-step CPU finds them (proccpu.find; ``found``: its /proc readers, or a test's): the stack under test."""
    return {pid for tracked in proccpu.find(dial_url, (), 0, **found) if tracked.role in ("agent", "server")
            for pid in tracked.pids}


def local_listener_pid(url: str) -> int | None:
    """The pid of the server at ``url`` when it listens on this machine (loopback), so its CPU counts as the run's
    own in the noise warning; None when it is elsewhere or /proc does not show it."""
    port = proccpu.loopback_port(url)
    return procfs.listener_pid(port) if port is not None else None


# --- the context of one slot, before any turn ------------------------------------------------------------------


def planned_requests(caller: CallerConfig, described: dict[str, Any]) -> list[preflight.PlannedRequest]:
    return preflight.call_requests(described["dialogue"], caller.system, caller.turns, caller.max_tokens, caller.history)


def _too_long_for_load(fit: preflight.ContextFit, described: dict[str, Any], where: str, slots: int | None,
                       fix: str) -> str:
    per_slot = f"gives each slot {fit.n_ctx} tokens" + (f" ({slots_label(slots)})" if slots else "")
    return (f"the {described['dialogue']} call's longest request ({fit.request}, with {described['docs']} KB documents "
            f"and {fit.reserved_tokens} tokens kept for its answers of up to {described['max_tokens']} tokens) needs "
            f"{fit.tokens} tokens ({fit.prompt_tokens} {fit.how_counted()}), and {where} {per_slot}: every turn "
            f"would be refused (HTTP 400). {fix}")


def _fix(settings: LoadSettings, fit: preflight.ContextFit, slots: int | None) -> str:
    fewer = f"or fewer documents (--docs, now {settings.docs})"
    want = preflight.suggested_ctx(fit.tokens, slots or 1)
    if settings.url:
        try:
            port = urllib.parse.urlsplit(settings.url).port
        except ValueError:
            port = None
        where = f" --port {port}" if port else ""
        return (f"Start the server with a context of more than {fit.tokens} tokens per slot, e.g. "
                f"`voice-llm up{where} --slots {slots or 1} --ctx {want} --restart` (each slot gets --ctx / --slots; "
                f"--restart replaces a server already running there), {fewer}")
    return (f"Run load with --ctx {want} (the managed server gets --ctx or {CTX_PER_SLOT} tokens per slot, "
            f"whichever is more), {fewer}")


def check_context(settings: LoadSettings, client: ServerClient, url: str, slots: int | None, caller: CallerConfig,
                  described: dict[str, Any], later: list[tuple[int, int]]) -> str | None:
    """Refuse (ContextLimitError) before any turn if the call's longest request does not fit one slot of the server
    ``client`` asks, or of a managed server still to come (``later``: its slots and context per slot, counted with
    this server's tokenizer: the same model). The same check as the lab's (voice_llm.core.run.preflight). Returns a note
    for the user when the context cannot be checked."""
    fit = preflight.longest_fit(client, planned_requests(caller, described))
    if fit is None:
        return (f"the server at {url} does not say its context per slot (no /props n_ctx: not a llama-server?): "
                "the call's prompt length is not checkable; going on")
    where = f"the server at {url}" if settings.url else f"the managed server on port {settings.port}"
    for n_ctx, slot_count, place in ((fit.n_ctx, slots, where),
                                     *((c, n, f"the managed server for the {slots_label(n)} sweep") for n, c in later)):
        candidate = replace(fit, n_ctx=n_ctx)
        if not candidate.fits:
            raise ContextLimitError(_too_long_for_load(candidate, described, place, slot_count,
                                                       _fix(settings, candidate, slot_count)))
    return None if fit.counted else (f"the server at {url} has no /tokenize: the call's prompt was estimated at "
                                     f"{fit.prompt_tokens} tokens from its bytes (fits {fit.n_ctx} per slot)")


# --- the run ---------------------------------------------------------------------------------------------------


@dataclass
class LoadRun:
    """What `load` measured so far: kept and written whatever ends the command (a verdict, a failure, a signal)."""

    described: dict[str, Any] = field(default_factory=dict)
    sweeps: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    interrupted: str | None = None  # None: every sweep ran to its end
    server_pids: set[int] = field(default_factory=set)  # measured servers on this machine (noise: their own CPU)
    receiver: Any = None  # dialing callers with --otlp-listen: the run's OTLP receiver (voice_llm.capabilities.load.stages)
    attached: list[stages.Attached] = field(default_factory=list)
    otlp_address: str | None = None  # HOST:PORT it listens on (the port bound, for --otlp-listen HOST:0)
    slots: int | None = None  # the slots of the server being swept
    # what was written (by the session's close hook)
    doc: dict[str, Any] | None = None
    load_path: Path | None = None
    samples_path: Path | None = None

    def add(self, plan: SweepPlan, result: dict[str, Any], slots: int | None, url: str) -> None:
        if self.receiver is not None:  # the agent's stage times onto the turns, before any step is summarized
            self.attached.append(stages.attach(result["samples"], self.receiver.spans()))
        doc, rows = sweep_document(plan, result, slots, url)
        self.sweeps.append(doc)
        self.samples.extend(rows)

    @property
    def measured(self) -> bool:
        return bool(self.samples) or any(sweep["steps"] for sweep in self.sweeps)

    @property
    def steps(self) -> int:
        return sum(len(sweep["steps"]) for sweep in self.sweeps)


def run_load(settings: LoadSettings, progress: Progress | None = None,
             notify: Callable[[str], None] | None = None) -> LoadResult:
    """Every sweep (one per slot count, or one against --url) in one run session: whatever ends it (a verdict, a
    failure, Ctrl-C or SIGTERM), what was measured is written (load_samples.csv, load.json, run.json, marked
    interrupted or failed) before the failure goes on; Ctrl-C returns a result that says so."""
    progress = progress or NullProgress()
    notify = notify or (lambda line: None)
    settings = managed_as_it_runs(settings, notify)
    out = settings.out.expanduser()
    # Bad flags, dialogue or KB are named before any server starts or any file is written.
    dial: DialOptions | None = None  # with --dial, the call; caller.url is then the agent's (dial_caller)
    if settings.dial is not None:
        caller, dial, described = dial_caller(settings)
    else:
        caller, described = caller_config(settings, "", out)
    base_plan = plan_of(settings, caller, dial)
    run = LoadRun(described=described)
    planned: list[int | None] = [None] if settings.url or dial else list(settings.slots or DEFAULT_SLOTS)
    t0 = time.perf_counter()
    sampler = noise.LoadSampler(lambda: run.server_pids)

    def servers() -> Iterator[contextlib.AbstractContextManager[session.Target]]:
        if dial is not None:
            # the agent is the one measured, and its LLM server (found as the per-step CPU finds it: listening on
            # the agent's --url) is part of the measured stack: their CPU is the run's own in the noise warning,
            # not another process's (a 2-caller step's agent and server alone make a 2-core box look loaded)
            run.server_pids.update(measured_stack_pids(caller.url))
            yield contextlib.nullcontext(session.given_target(caller.url))
            return
        for slots in planned:
            yield _server_of(settings, slots, progress, run)

    def check(client: ServerClient, target: session.Target, first: bool) -> None:
        if dial is not None:
            return  # no LLM request is made: nothing to fit into a context
        if settings.url:
            run.slots = target.facts.total_slots
        # Before the first turn of each sweep; the first also checks the managed servers still to come.
        later = [(n, managed_settings(settings, n).ctx // n) for n in planned[1:] if n is not None] \
            if first and not settings.url else []
        note = check_context(settings, client, target.url, run.slots, caller, run.described, later)
        if note:
            notify(note)

    def sweep(live: session.Live) -> None:
        if dial is not None:
            _sweep(base_plan, settings, run, None, caller.url)
            return
        assert live.probed is not None
        model = live.probed.capabilities.model  # every request names the model the probe found, as the lab's do
        plan = replace(base_plan, caller=replace(caller, url=live.target.url, model=model), slots=run.slots)
        _sweep(plan, settings, run, run.slots, live.target.url)

    def close(live: session.Live, error: BaseException | None) -> None:
        """load_samples.csv, load.json and the probe's capabilities.json, in that order (the samples before the
        document that summarizes them); also for an interrupted or failed run, marked so in both and run.json."""
        if error is not None:
            if not run.measured:
                return  # nothing to keep: the folder stays as it was
            run.interrupted = run.interrupted or ("interrupted (SIGINT or SIGTERM)"
                                                  if isinstance(error, KeyboardInterrupt) else f"failed: {error}")
        record = live.record
        live.state.step = STEP
        live.state.ran.append(STEP)
        if settings.otlp_listen is not None:
            run.described["agent_spans"] = stages.block(run.otlp_address, run.receiver, run.attached)
        run.doc = load_document(settings, run.described, run.sweeps, run.interrupted)
        run.samples_path = write_samples(live.out / LOAD_SAMPLES, run.samples)
        record.record_file(run.samples_path)
        run.load_path = write_json(live.out / LOAD, runmeta.stamp(run.doc, record.run_id))
        record.record_file(run.load_path)
        sampler.sample()  # the load now, at the end of the sweeps, as the last sample
        live.step_finished({"step": STEP, "wall_ms": (time.perf_counter() - t0) * 1000.0,
                            "server_compute_ms": None, "load_samples": list(sampler.samples)})
        live.state.failure = run.interrupted
        if isinstance(error, (VoiceLLMError, StreamError, OSError)):
            error.add_note(_kept(run, live.out).replace("marked interrupted", "marked failed"))

    def after(live: session.Live) -> LoadResult:
        assert run.doc is not None
        try:
            html: Path | None = _render(live.out)
            render_error = None
        except Exception as exc:  # drawing must never lose what was measured: the files above are written
            html, render_error = None, f"{type(exc).__name__}: {exc}"
        return LoadResult(live.out, run.doc, run.load_path, run.samples_path, html, render_error)

    plan = session.Plan(out=out, command=STEP, asked=session.Asked(settings.url, settings.api_key, settings.timeout),
                        kb=settings.kb, steps={STEP: (LOAD, LOAD_SAMPLES)}, new_run=settings.new_run,
                        wait=settings.wait_for_out, ask_server=dial is None)
    hooks = session.Hooks(servers=servers, step=sweep, preflight=check, close=close, after=after)
    if settings.otlp_listen is not None:  # with --dial alone (LoadSettings refuses it without)
        run.receiver = stages.start_receiver(settings.otlp_listen)
        host, port = run.receiver.address
        run.otlp_address = f"{host}:{port}"
        notify(f"the agent's spans: start it with --otlp http://{run.otlp_address}")
    try:
        with sampler:
            return session.Session(plan, progress, notify).run(hooks)
    except KeyboardInterrupt:
        return LoadResult(out, run.doc, run.load_path, run.samples_path, interrupted=True, kept=_kept(run, out))
    finally:
        if run.receiver is not None:
            run.receiver.stop()


@contextlib.contextmanager
def _server_of(settings: LoadSettings, slots: int | None, progress: Progress,
               run: LoadRun) -> Iterator[session.Target]:
    """One sweep's server (the session's bring-up): stopped after its sweep when this run started it."""
    up = _bring_up(settings, slots, progress)
    if up.pid is not None:
        run.server_pids.add(up.pid)
    run.slots = slots
    try:
        yield up.target
    finally:
        if up.started:
            server.down(settings.port)


def _sweep(plan: SweepPlan, settings: LoadSettings, run: LoadRun, slots: int | None, url: str) -> None:
    try:
        result = run_sweep(plan, settings.api_key)
    except (SweepInterrupted, LoadError) as exc:
        if exc.partial is not None:
            run.add(plan, exc.partial, slots, url)
            run.interrupted = exc.partial.get("interrupted")
        run.interrupted = run.interrupted or ("interrupted (SIGINT or SIGTERM)" if isinstance(exc, SweepInterrupted)
                                              else f"failed: {exc}")
        run.interrupted += f", in the sweep of {slots_label(slots) if plan.dial is None else 'the agent at ' + url}"
        raise
    run.add(plan, result, slots, url)


def _kept(run: LoadRun, out: Path) -> str:
    if not run.measured:
        return "nothing was measured yet, so nothing was written; files already in the folder are untouched"
    return (f"kept {out / LOAD} ({run.steps} complete steps in {len(run.sweeps)} sweeps, marked interrupted) and "
            f"{out / LOAD_SAMPLES} ({len(run.samples)} turns so far)")


def _render(out: Path) -> Path:
    """report.html again, with the load section (the lab's sections from the files already in OUT)."""
    return render_report(out, run_checks(out))
