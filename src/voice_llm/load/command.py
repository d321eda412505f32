"""`voice-llm load`: how many voice callers a server takes while the first sentence still comes within budget.

``run_load(LoadSettings)`` beside the lab's ``run_lab(LabSettings)``, on the same run session
(voice_llm.run.session): OUT's lock, the managed server brought up once per ``--slots`` value (or the --url
given), the context preflight of the lab (voice_llm.lab.preflight: the planned call's longest turn against the
context of one slot) before any request, the capability probe (every request carries the model name it found),
the run's identity (load.json joins the lab's run when it is the same server, model and KB), and run.json finished
however the sweeps end. One sweep per server runs through the Locust master subprocess; load.json and the raw
samples CSV are written from what it measured.

This module never imports locust (see voice_llm.load.runner). `--worker` only execs a Locust worker for a master
on another machine. The command's flags are added by :func:`add_commands` (the capability's ``commands=``); its
handler turns them into a :class:`LoadSettings` and nothing below takes argparse.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from voice_llm.analysis import noise
from voice_llm.client.api import ServerClient
from voice_llm.errors import (EXIT_INTERRUPTED, EXIT_NO_VERDICT, EXIT_OK, EXIT_REPORT_INCOMPLETE, ConfigError,
                              ContextLimitError, VoiceLLMError)
from voice_llm.lab import flags, preflight
from voice_llm.lab.pipeline import render
from voice_llm.checks.core import run_checks
from voice_llm.load import stats, voice_caller_path
from voice_llm.load.plan import (DEFAULT_BARGE_IN_SHARE, DEFAULT_CALLERS, DEFAULT_MASTER_PORT,
                                 DEFAULT_SLO_FIRST_SENTENCE_MS, DEFAULT_STEP_S, DEFAULT_WARMUP_S, SPEECH_WORDS_PER_S,
                                 CallerConfig, SweepPlan)
from voice_llm.load.runner import LoadError, SweepInterrupted, run_sweep
from voice_llm.load.samples import write_samples
from voice_llm.load.speech import answer_speech_rate
from voice_llm.load.stats import slots_label
from voice_llm.run import meta as runmeta, session
from voice_llm.scenario import dialogue as dialogues
from voice_llm.scenario.kb import default_kb_dir, load_kb
from voice_llm.server import lifecycle as server
from voice_llm.server.config import DEFAULT_CTX, DEFAULT_PORT, ServerSettings, api_key_from_env, default_out_dir, is_loopback
from voice_llm.sse import StreamError
from voice_llm.util import procfs
from voice_llm.util.artifacts import LOAD, LOAD_SAMPLES, write_json
from voice_llm.util.progress import NullProgress, Progress

# Exit statuses of `voice-llm load` (the CLI passes them through) come from the one table of every command
# (voice_llm.errors.EXIT_TABLE): EXIT_OK every sweep reached a verdict; EXIT_FAILURE something failed (what was
# measured is kept); EXIT_REPORT_INCOMPLETE saved, but report.html could not be drawn; EXIT_NO_VERDICT measured,
# but a sweep has no verdict; EXIT_INTERRUPTED Ctrl-C or SIGTERM (what was measured is kept).

CTX_PER_SLOT = 4096  # the lab's whole context per slot: the 12-document call's last turn needs ~3500 tokens with its answers
STEP = "load"  # its name in run.json


@dataclass(frozen=True)
class LoadSettings:
    """Everything a load run needs. ``url`` None: the managed llama-server on ``port``, started once per value of
    ``slots`` (each slot with ``CTX_PER_SLOT`` tokens, or ``ctx`` when that is more) and stopped after its sweep
    when this run started it."""

    out: Path = field(default_factory=default_out_dir)
    kb_dir: Path | None = None
    url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 120.0  # each caller's request: seconds without content
    wait_for_out: bool = False
    quiet: bool = False
    # the sweep
    callers: tuple[int, ...] = DEFAULT_CALLERS
    max_callers: int = 64
    step_s: float = DEFAULT_STEP_S
    warmup_s: float = DEFAULT_WARMUP_S
    slo_first_sentence_ms: float = DEFAULT_SLO_FIRST_SENTENCE_MS
    stop_on_budget: bool = True
    workers: int = 2
    # the managed server
    slots: tuple[int, ...] = (1, 4)
    port: int = DEFAULT_PORT
    ctx: int = DEFAULT_CTX
    threads: int | None = None
    model: str | None = None  # the GGUF file of the managed server
    server_bin: str | None = None
    # the callers
    dialogue: str = dialogues.DEFAULT_DIALOGUE
    docs: int = dialogues.DEFAULT_DOCS
    max_tokens: int | None = None
    think_scale: float = 1.0
    barge_in: float = DEFAULT_BARGE_IN_SHARE
    caller_words_per_s: float = SPEECH_WORDS_PER_S
    # distributed
    master: bool = False
    worker: bool = False
    expect_workers: int = 1
    master_host: str = "127.0.0.1"
    master_bind_host: str = "0.0.0.0"
    master_port: int | None = None

    @property
    def kb(self) -> Path:
        return Path(self.kb_dir) if self.kb_dir else default_kb_dir()


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


# --- the command's flags (the capability's commands=) ------------------------------------------------------------


def add_commands(sub: Any) -> None:
    """The `load` command (``sub``: the CLI's subparsers), with every flag it reads and its handler."""
    help_text = "how many callers a server takes within the first-sentence budget (Locust)"
    p = sub.add_parser("load", help=help_text, description=help_text)
    flags.out_option(p)
    flags.request_options(p, deadline=False)  # load reads --timeout (each caller's CallerConfig.timeout_s) only
    flags.kb_option(p)
    flags.wait_option(p)
    flags.api_key_option(p)
    flags.quiet_option(p)
    add_arguments(p)
    p.set_defaults(run_command=main)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `load` subcommand's own flags (add_commands adds the common ones: --out, --url, --kb, --api-key...)."""
    p.add_argument("--callers", type=flags.int_list, default=DEFAULT_CALLERS, help="steps of concurrent callers, upward (1,2,4,8)")
    p.add_argument("--max-callers", type=flags.positive_int, default=64, help="never run a step with more callers than this")
    p.add_argument("--step-s", type=flags.positive_number, default=DEFAULT_STEP_S, help="measured window per step (s)")
    p.add_argument("--warmup-s", type=flags.non_negative_number, default=DEFAULT_WARMUP_S, help="dropped window at the start of each step (s)")
    p.add_argument("--slo-first-sentence-ms", type=flags.positive_number, default=DEFAULT_SLO_FIRST_SENTENCE_MS,
                   help="first-sentence budget: goodput counts turns within it; the sweep stops when p90 exceeds it")
    p.add_argument("--no-stop", action="store_true", help="run every step even past the budget")
    p.add_argument("--workers", type=flags.positive_int, default=2, help="local Locust worker processes")
    p.add_argument("--slots", type=flags.int_list, default=(1, 4),
                   help="managed server: one sweep per slot count (-np), e.g. 1,4; each slot gets a 4096 context")
    p.add_argument("--port", type=flags.port_number, default=DEFAULT_PORT, help="port of the managed server")
    p.add_argument("--ctx", type=flags.positive_int, default=DEFAULT_CTX, help="at least this context (default: 4096 per slot)")
    p.add_argument("--threads", type=flags.positive_int, help="CPU threads for the managed server")
    p.add_argument("--model", help="GGUF model file for the managed server")
    p.add_argument("--server-bin", help="llama-server binary for the managed server")
    p.add_argument("--dialogue", default=dialogues.DEFAULT_DIALOGUE,
                   help=f"bundled dialogue, or {dialogues.LAB_TTFT} (the ttft step's request, cache off, as a call)")
    p.add_argument("--docs", type=flags.non_negative_int, default=dialogues.DEFAULT_DOCS, help="KB documents in the system prompt")
    p.add_argument("--max-tokens", type=flags.positive_int, help="cap each answer (default: the dialogue's, 64)")
    p.add_argument("--think-scale", type=flags.non_negative_number, default=1.0, help="multiply every think time (0: none)")
    p.add_argument("--barge-in", type=flags.share, default=DEFAULT_BARGE_IN_SHARE, help="share of turns the caller cuts short")
    p.add_argument("--caller-words-per-s", type=flags.positive_number, default=SPEECH_WORDS_PER_S, help="how fast callers speak")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--master", action="store_true", help="run only the master; workers join from other machines")
    mode.add_argument("--worker", action="store_true", help="run one Locust worker for a master at --master-host")
    p.add_argument("--expect-workers", type=flags.positive_int, default=1, help="with --master: workers to wait for")
    p.add_argument("--master-host", default="127.0.0.1", help="with --worker: the master's address")
    p.add_argument("--master-bind-host", default="0.0.0.0", help="with --master: the interface workers connect to")
    p.add_argument("--master-port", type=flags.port_number,
                   help=f"the port the master listens on for workers (--master, --worker: default "
                        f"{DEFAULT_MASTER_PORT}; local workers: a free port unless given)")


# The flags whose dest is not the settings' field name.
FLAG_FIELDS = {"kb": "kb_dir", "wait": "wait_for_out"}


def settings_from(values: Mapping[str, Any]) -> LoadSettings:
    """LoadSettings from the parsed flags (a mapping of dest -> value; flags not given keep the defaults)."""
    known = {f.name for f in fields(LoadSettings)}
    given = {FLAG_FIELDS.get(key, key): value for key, value in values.items()}
    given = {key: value for key, value in given.items() if key in known and value is not None}
    if "no_stop" in values:
        given["stop_on_budget"] = not values["no_stop"]
    if isinstance(given.get("out"), Path):
        given["out"] = given["out"].expanduser()
    given["api_key"] = api_key_from_env(values.get("api_key"))
    return LoadSettings(**given)


def main(values: Mapping[str, Any], progress: Progress) -> int:
    """The command: run_load, then what the user reads and the exit status."""
    settings = settings_from(values)
    if settings.worker:
        return run_worker(settings)
    result = run_load(settings, progress, notify=lambda line: None if settings.quiet else print(f"load: {line}", file=sys.stderr))
    if result.interrupted:
        print(f"voice-llm load: interrupted; {result.kept}", file=sys.stderr)
        return EXIT_INTERRUPTED
    assert result.doc is not None and result.load_path is not None
    for line in summary_lines(result.doc):
        print(line)
    print(f"{result.load_path}\n{result.samples_path}")
    if result.render_error is not None:
        print(f"voice-llm load: the measurements are saved ({LOAD}, {LOAD_SAMPLES}), but report.html could not be "
              f"drawn: {result.render_error}", file=sys.stderr)
        return EXIT_REPORT_INCOMPLETE
    print(f"report: {result.report_html}")
    return EXIT_OK if all(s["verdict"]["max_callers"] is not None for s in result.doc["sweeps"]) else EXIT_NO_VERDICT


def run_worker(settings: LoadSettings) -> int:
    """A Locust worker in the foreground; the master sends it the server's URL and the callers' settings."""
    command = [sys.executable, "-m", "locust", "-f", voice_caller_path(), "--worker", "--master-host",
               settings.master_host, "--master-port", str(settings.master_port or DEFAULT_MASTER_PORT),
               "--loglevel", "WARNING"]
    return subprocess.call(command)


# --- what the callers say, and the sweep ---------------------------------------------------------------------------


def caller_config(settings: LoadSettings, url: str, out: Path) -> tuple[CallerConfig, dict[str, Any]]:
    dialogue = dialogues.load_dialogue(settings.dialogue)
    if settings.max_tokens is not None:
        if settings.max_tokens < 1:
            raise ConfigError(f"--max-tokens must be at least 1, not {settings.max_tokens}")
        dialogue = replace(dialogue, max_tokens=settings.max_tokens)
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


def sweep_plan(settings: LoadSettings, caller: CallerConfig, slots: int | None) -> SweepPlan:
    callers = tuple(sorted({n for n in settings.callers if n <= settings.max_callers}))
    if not callers:
        raise ConfigError(f"no step of --callers is within --max-callers {settings.max_callers}")
    if settings.step_s <= 0 or settings.warmup_s < 0:
        raise ConfigError("--step-s must be > 0 and --warmup-s >= 0")
    remote = settings.master
    if not remote and settings.workers < 1:
        raise ConfigError("--workers must be at least 1 (or use --master with remote workers)")
    if settings.master_port is not None and not 0 < settings.master_port < 65536:
        raise ConfigError(f"--master-port must be between 1 and 65535, not {settings.master_port}")
    return SweepPlan(
        caller=caller, callers=callers, step_s=settings.step_s, warmup_s=settings.warmup_s,
        slo_first_sentence_ms=settings.slo_first_sentence_ms, local_workers=0 if remote else settings.workers,
        expect_workers=settings.expect_workers if remote else settings.workers,
        bind_host=settings.master_bind_host if remote else "127.0.0.1",
        # local workers connect to a free port unless --master-port names one (then it is that port or an error)
        master_port=(settings.master_port or DEFAULT_MASTER_PORT) if remote else (settings.master_port or 0),
        stop_on_budget=settings.stop_on_budget, slots=slots,
        quiet=settings.quiet,
    )


def sweep_document(plan: SweepPlan, result: dict[str, Any], slots: int | None, url: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One sweep of load.json, every number recomputed from the raw samples (as `check` will)."""
    samples = [{**s, "slots": slots} for s in result["samples"]]
    samples.sort(key=lambda s: (s["start"], str(s["caller"])))
    steps = []
    for live in result["steps"]:
        window = live["window"]
        measured = [s for s in samples if s["step"] == live["step"] and s["phase"] == "measure"]
        summary = stats.summarize_step(measured, plan.slo_first_sentence_ms, window["end"] - window["start"])
        steps.append({"step": live["step"], "callers": live["callers"], "window": window, "cpu": live["cpu"],
                      "generator_bound": live["generator_bound"], "host": live["host"], **summary})
    doc = {
        "slots": slots, "url": url, "workers": result["workers"], "stopped": result["stopped"],
        "started": result["started"], "ended": result["ended"], "master_port": result.get("master_port"),
        "interrupted": result.get("interrupted"), "steps": steps,
        "verdict": stats.verdict(steps, slots),
    }
    return doc, samples


def load_document(settings: LoadSettings, described: dict[str, Any], sweeps: list[dict[str, Any]],
                  interrupted: str | None = None) -> dict[str, Any]:
    return {
        "slo_first_sentence_ms": settings.slo_first_sentence_ms,
        "goodput_target": stats.GOODPUT_TARGET,
        "max_error_rate": stats.MAX_ERROR_RATE,
        "generator_bound_share": stats.GENERATOR_BOUND_SHARE,
        "min_judged_turns": stats.MIN_JUDGED_TURNS,
        "step_s": settings.step_s, "warmup_s": settings.warmup_s, "callers": list(settings.callers),
        "stop_on_budget": settings.stop_on_budget,
        "workers": "remote" if settings.master else settings.workers,
        "caller": described,
        "samples_csv": LOAD_SAMPLES,
        # null: every planned sweep ran to its end; else why it ended early (the sweeps and steps here are complete)
        "interrupted": interrupted,
        "sweeps": sweeps,
    }


# --- the servers ----------------------------------------------------------------------------------------------------


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


def local_listener_pid(url: str) -> int | None:
    """The pid of the server at ``url`` when it listens on this machine (loopback), so its CPU counts as the run's
    own in the noise warning; None when it is elsewhere or /proc does not show it."""
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname or not is_loopback(parts.hostname):
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return procfs.listener_pid(port)


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
    this server's tokenizer: the same model). The same check as the lab's (voice_llm.lab.preflight). Returns a note
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
    metadata: dict[str, Any] = field(default_factory=dict)
    interrupted: str | None = None  # None: every sweep ran to its end
    record: runmeta.RunRecord | None = None  # the run the files join, once the first server is known
    probed: session.Probe | None = None  # what the first server exposes
    server_pids: set[int] = field(default_factory=set)  # measured servers on this machine (noise: their own CPU)

    def add(self, plan: SweepPlan, result: dict[str, Any], slots: int | None, url: str) -> None:
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
    # Bad flags, dialogue or KB are named before any server starts or any file is written.
    caller, described = caller_config(settings, "", settings.out.expanduser())
    base_plan = sweep_plan(settings, caller, None)
    run = LoadRun(described=described)
    t0 = time.perf_counter()
    with session.opened(settings.out, STEP, settings.wait_for_out) as out:
        failure: BaseException | None = None
        with noise.LoadSampler(lambda: run.server_pids) as sampler:
            try:
                measure(settings, out, run, caller, base_plan, progress, notify)
            except KeyboardInterrupt as exc:
                run.interrupted = run.interrupted or "interrupted (SIGINT or SIGTERM)"
                failure = exc
            except (VoiceLLMError, StreamError, OSError) as exc:
                run.interrupted = run.interrupted or f"failed: {exc}"
                failure = exc
        if run.record is None or (failure is not None and not run.measured):
            if isinstance(failure, KeyboardInterrupt):
                return LoadResult(out, None, None, None, interrupted=True, kept=_kept(run, out))
            assert failure is not None
            raise failure
        doc, load_path, samples_path = save_run(settings, run, (time.perf_counter() - t0) * 1000.0, sampler.samples)
        if isinstance(failure, KeyboardInterrupt):
            return LoadResult(out, doc, load_path, samples_path, interrupted=True, kept=_kept(run, out))
        if failure is not None:
            failure.add_note(_kept(run, out).replace("marked interrupted", "marked failed"))
            raise failure
        try:
            html: Path | None = _render(out)
            render_error = None
        except Exception as exc:  # drawing must never lose what was measured: the files above are written
            html, render_error = None, f"{type(exc).__name__}: {exc}"
    return LoadResult(out, doc, load_path, samples_path, html, render_error)


def measure(settings: LoadSettings, out: Path, run: LoadRun, caller: CallerConfig, base_plan: SweepPlan,
            progress: Progress, notify: Callable[[str], None]) -> None:
    """Each sweep's server brought up (and stopped after it when this run started it), its context checked
    before the first turn, the first one probed and made the run's identity; each sweep gathered in ``run`` as it
    ends, so that an exception leaves in it everything measured before."""
    planned: list[int | None] = [None] if settings.url else list(settings.slots)
    asked = session.Asked(settings.url, settings.api_key, settings.timeout)
    for index, slots in enumerate(planned):
        up = _bring_up(settings, slots, progress)
        if up.pid is not None:
            run.server_pids.add(up.pid)
        try:
            target, client = session.connect(up.target, asked)
            if settings.url:
                slots = target.facts.total_slots
            # Before the first turn of each sweep; the first also checks the managed servers still to come.
            later = [] if index or settings.url else [
                (n, managed_settings(settings, n).ctx // n) for n in planned[1:] if n is not None]
            note = check_context(settings, client, target.url, slots, caller, run.described, later)
            if note:
                notify(note)
            if run.probed is None:  # the first server is the run's identity
                run.probed = session.probe_server(client, None, progress, settings.url)
                run.record = _join(out, target, settings, run.probed)
            model = run.probed.capabilities.model  # every request names the model the probe found, as the lab's do
            plan = replace(base_plan, caller=replace(caller, url=target.url, model=model), slots=slots)
            _sweep(plan, settings, run, slots, target.url)
        finally:
            if up.started:
                server.down(settings.port)


def _join(out: Path, target: session.Target, settings: LoadSettings, probed: session.Probe) -> runmeta.RunRecord:
    """load.json joins the run in OUT when the (first) server is the lab's; else it starts a run of its own."""
    record, note = runmeta.RunRecord.join_or_start(out, session.identity(target, settings.kb, probed),
                                                   {STEP: (LOAD, LOAD_SAMPLES)})
    if note:
        print(note, file=sys.stderr)
    return record


def _sweep(plan: SweepPlan, settings: LoadSettings, run: LoadRun, slots: int | None, url: str) -> None:
    try:
        result = run_sweep(plan, settings.api_key)
    except (SweepInterrupted, LoadError) as exc:
        if exc.partial is not None:
            run.add(plan, exc.partial, slots, url)
            run.interrupted = exc.partial.get("interrupted")
        run.interrupted = run.interrupted or ("interrupted (SIGINT or SIGTERM)" if isinstance(exc, SweepInterrupted)
                                              else f"failed: {exc}")
        run.interrupted += f", in the sweep of {slots_label(slots)}"
        raise
    run.add(plan, result, slots, url)


def verdict_line(doc: dict[str, Any], sweep: dict[str, Any]) -> str:
    """The verdict of one sweep, with the turns it rests on; or why there is none and how to get one."""
    verdict = sweep["verdict"]
    where = slots_label(sweep["slots"]) if sweep["slots"] is not None else sweep["url"]
    minimum = verdict.get("min_judged_turns", stats.MIN_JUDGED_TURNS)
    if verdict["max_callers"] is None:
        judged = ", ".join(f"{s['judged']} at {s['callers']} callers" for s in sweep["steps"]) or "no step"
        return (f"{where}: no verdict: each step was judged on fewer than {minimum} turns ({judged}), the "
                f"fewest on which one late turn still passes {100 * verdict['goodput_target']:.0f} % goodput; "
                f"{_more_turns(doc, sweep, minimum)}")
    limit = f", limited by {verdict['limited_by']}" if verdict["limited_by"] else ""
    rests = (f"{verdict['judged_turns']} judged turns at {verdict['max_callers']} callers" if verdict["max_callers"]
             else f"no step passed; the steps judged on enough turns had at least {verdict['judged_turns']}")
    return (f"{where}: max callers = {verdict['max_callers']} (first sentence <= {doc['slo_first_sentence_ms']:.0f} ms "
            f"for >= {100 * verdict['goodput_target']:.0f} % of turns; {rests}; tested up to "
            f"{verdict['tested_up_to']}{limit})")


def _more_turns(doc: dict[str, Any], sweep: dict[str, Any], minimum: int) -> str:
    """How to get enough turns: a longer measured window at the rate seen, or less think time."""
    rates = [s["judged"] / (s["window"]["end"] - s["window"]["start"]) for s in sweep["steps"]
             if s["judged"] and s["window"]["end"] > s["window"]["start"]]
    # at the slowest step's rate, with a fifth to spare, rounded up to 30 s
    longer = f"--step-s {30 * math.ceil(1.2 * minimum / min(rates) / 30)}" if rates else "a longer --step-s"
    think = (doc.get("caller") or {}).get("think", {}).get("think_scale", 1.0)
    return (f"lengthen the measured window ({longer}, now {doc['step_s']:g} s) or let the callers think less "
            f"between turns (e.g. --think-scale {think / 4:g}, now {think:g})")


def summary_lines(doc: dict[str, Any]) -> list[str]:
    """One line per sweep: the verdict and what limited it."""
    return [verdict_line(doc, sweep) for sweep in doc["sweeps"]]


def save_run(settings: LoadSettings, run: LoadRun, wall_ms: float,
             load_samples: list[dict[str, float]]) -> tuple[dict[str, Any], Path, Path]:
    """load_samples.csv, load.json, the probe's capabilities.json and run.json, in that order (the samples before
    the document that summarizes them); also for an interrupted or failed run, marked so in load.json and run.json."""
    record = run.record
    assert record is not None
    out = record.out
    doc = load_document(settings, run.described, run.sweeps, run.interrupted)
    with session.recording(record, [STEP], whole_run=False) as state:
        state.step = STEP
        samples_path = write_samples(out / LOAD_SAMPLES, run.samples)
        record.record_file(samples_path)
        load_path = write_json(out / LOAD, runmeta.stamp(doc, record.run_id))
        record.record_file(load_path)
        if run.probed is not None:
            session.write_probe(record, run.probed)
        record.add_step({"step": STEP, "wall_ms": wall_ms, "server_compute_ms": None, "load_samples": load_samples})
        state.failure = run.interrupted
    return doc, load_path, samples_path


def _kept(run: LoadRun, out: Path) -> str:
    if not run.measured:
        return "nothing was measured yet, so nothing was written; files already in the folder are untouched"
    return (f"kept {out / LOAD} ({run.steps} complete steps in {len(run.sweeps)} sweeps, marked interrupted) and "
            f"{out / LOAD_SAMPLES} ({len(run.samples)} turns so far)")


def _render(out: Path) -> Path:
    """report.html again, with the load section (the lab's sections from the files already in OUT)."""
    return render(out, run_checks(out))
