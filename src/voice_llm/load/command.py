"""`voice-llm load`: how many voice callers a server takes while the first sentence still comes within budget.

This module never imports locust (see voice_llm.load.runner): it parses the flags, starts the managed server
once per ``--slots`` value, runs one sweep per server through the Locust master subprocess, and writes
load.json and the raw samples CSV. `--worker` only execs a Locust worker for a master on another machine.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from voice_llm.scenario import dialogue as dialogues
from voice_llm.analysis import noise
from voice_llm.run import meta as runmeta
from voice_llm.server import lifecycle as server, provision
from voice_llm.util import procfs
from voice_llm.client.api import ServerClient
from voice_llm.cli.argtypes import (non_negative_int, non_negative_number, port_number, positive_int, positive_number,
                                share)
from voice_llm.util.artifacts import LOAD, LOAD_SAMPLES, ensure_out_dir, write_json
from voice_llm.client.capabilities import model_ids
from voice_llm.server.config import DEFAULT_CTX, DEFAULT_PORT, ServerSettings, api_key_from_env, is_loopback
from voice_llm.errors import ConfigError, ContextLimitError, VoiceLLMError
from voice_llm.scenario.kb import default_kb_dir, load_kb
from voice_llm.lab import preflight
from voice_llm.load import stats
from voice_llm.load.plan import (DEFAULT_BARGE_IN_SHARE, DEFAULT_MASTER_PORT, DEFAULT_SLO_FIRST_SENTENCE_MS,
                                 DEFAULT_STEP_S, DEFAULT_WARMUP_S, SPEECH_WORDS_PER_S, CallerConfig, SweepPlan)
from voice_llm.load.runner import LoadError, SweepInterrupted, run_sweep
from voice_llm.load.samples import write_samples
from voice_llm.load.speech import answer_speech_rate
from voice_llm.load.stats import slots_label
from voice_llm.run.lock import locked_out
from voice_llm.util.progress import Progress
from voice_llm.sse import ServerUnreachableError, StreamError

# Exit statuses of `voice-llm load` (cli.py passes them through): every sweep reached a verdict; something failed
# (the measurements made before are kept and the message says so); measured, but a sweep has no verdict (too few
# judged turns: the line says how to get one); interrupted by Ctrl-C or SIGTERM (what was measured is kept).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_NO_VERDICT = 4
EXIT_INTERRUPTED = 130

CTX_PER_SLOT = 4096  # the lab's whole context per slot: the 12-document call's last turn needs ~3500 tokens with its answers


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of whole numbers: {text!r}") from exc
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"needs numbers >= 1: {text!r}")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `load` subcommand's flags (cli.py adds the common ones: --out, --url, --kb, --port, --api-key...)."""
    p.add_argument("--callers", type=_int_list, default=(1, 2, 4, 8), help="steps of concurrent callers, upward (1,2,4,8)")
    p.add_argument("--max-callers", type=positive_int, default=64, help="never run a step with more callers than this")
    p.add_argument("--step-s", type=positive_number, default=DEFAULT_STEP_S, help="measured window per step (s)")
    p.add_argument("--warmup-s", type=non_negative_number, default=DEFAULT_WARMUP_S, help="dropped window at the start of each step (s)")
    p.add_argument("--slo-first-sentence-ms", type=positive_number, default=DEFAULT_SLO_FIRST_SENTENCE_MS,
                   help="first-sentence budget: goodput counts turns within it; the sweep stops when p90 exceeds it")
    p.add_argument("--no-stop", action="store_true", help="run every step even past the budget")
    p.add_argument("--workers", type=positive_int, default=2, help="local Locust worker processes")
    p.add_argument("--slots", type=_int_list, default=(1, 4),
                   help="managed server: one sweep per slot count (-np), e.g. 1,4; each slot gets a 4096 context")
    p.add_argument("--port", type=port_number, default=DEFAULT_PORT, help="port of the managed server")
    p.add_argument("--ctx", type=positive_int, default=DEFAULT_CTX, help="at least this context (default: 4096 per slot)")
    p.add_argument("--threads", type=positive_int, help="CPU threads for the managed server")
    p.add_argument("--model", help="GGUF model file for the managed server")
    p.add_argument("--server-bin", help="llama-server binary for the managed server")
    p.add_argument("--dialogue", default=dialogues.DEFAULT_DIALOGUE,
                   help=f"bundled dialogue, or {dialogues.LAB_TTFT} (the ttft step's request, cache off, as a call)")
    p.add_argument("--docs", type=non_negative_int, default=dialogues.DEFAULT_DOCS, help="KB documents in the system prompt")
    p.add_argument("--max-tokens", type=positive_int, help="cap each answer (default: the dialogue's, 64)")
    p.add_argument("--think-scale", type=non_negative_number, default=1.0, help="multiply every think time (0: none)")
    p.add_argument("--barge-in", type=share, default=DEFAULT_BARGE_IN_SHARE, help="share of turns the caller cuts short")
    p.add_argument("--caller-words-per-s", type=positive_number, default=SPEECH_WORDS_PER_S, help="how fast callers speak")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--master", action="store_true", help="run only the master; workers join from other machines")
    mode.add_argument("--worker", action="store_true", help="run one Locust worker for a master at --master-host")
    p.add_argument("--expect-workers", type=positive_int, default=1, help="with --master: workers to wait for")
    p.add_argument("--master-host", default="127.0.0.1", help="with --worker: the master's address")
    p.add_argument("--master-bind-host", default="0.0.0.0", help="with --master: the interface workers connect to")
    p.add_argument("--master-port", type=port_number,
                   help=f"the port the master listens on for workers (--master, --worker: default "
                        f"{DEFAULT_MASTER_PORT}; local workers: a free port unless given)")


def run_worker(args: argparse.Namespace) -> int:
    """A Locust worker in the foreground; the master sends it the server's URL and the callers' settings."""
    from voice_llm.load import voice_caller_path

    command = [sys.executable, "-m", "locust", "-f", voice_caller_path(), "--worker", "--master-host",
               args.master_host, "--master-port", str(args.master_port or DEFAULT_MASTER_PORT), "--loglevel", "WARNING"]
    return subprocess.call(command)


def caller_config(args: argparse.Namespace, url: str, out: Path) -> tuple[CallerConfig, dict[str, Any]]:
    dialogue = dialogues.load_dialogue(args.dialogue)
    if args.max_tokens is not None:
        if args.max_tokens < 1:
            raise ConfigError(f"--max-tokens must be at least 1, not {args.max_tokens}")
        dialogue = replace(dialogue, max_tokens=args.max_tokens)
    docs = load_kb(Path(args.kb or default_kb_dir()), need=args.docs)[:args.docs] if dialogue.use_docs else []
    rate, source = answer_speech_rate(out)
    config = CallerConfig(
        url=url, system=dialogues.system_prompt(dialogue, docs), turns=dialogue.turns,
        max_tokens=dialogue.max_tokens, history=dialogue.history, cache_prompt=dialogue.cache_prompt,
        answer_words_per_s=rate, caller_words_per_s=args.caller_words_per_s, think_scale=args.think_scale,
        barge_in_share=args.barge_in, timeout_s=args.timeout,
    )
    described = {
        "dialogue": dialogue.name, "docs": len(docs), "turns": len(dialogue.turns), "max_tokens": dialogue.max_tokens,
        "history": dialogue.history, "cache_prompt": dialogue.cache_prompt, "barge_in_share": args.barge_in,
        "think": {"answer_words_per_s": rate, "answer_rate_source": source,
                  "caller_words_per_s": args.caller_words_per_s, "think_scale": args.think_scale},
    }
    return config, described


def sweep_plan(args: argparse.Namespace, caller: CallerConfig, slots: int | None) -> SweepPlan:
    callers = tuple(sorted({n for n in args.callers if n <= args.max_callers}))
    if not callers:
        raise ConfigError(f"no step of --callers is within --max-callers {args.max_callers}")
    if args.step_s <= 0 or args.warmup_s < 0:
        raise ConfigError("--step-s must be > 0 and --warmup-s >= 0")
    remote = args.master
    if not remote and args.workers < 1:
        raise ConfigError("--workers must be at least 1 (or use --master with remote workers)")
    if args.master_port is not None and not 0 < args.master_port < 65536:
        raise ConfigError(f"--master-port must be between 1 and 65535, not {args.master_port}")
    return SweepPlan(
        caller=caller, callers=callers, step_s=args.step_s, warmup_s=args.warmup_s,
        slo_first_sentence_ms=args.slo_first_sentence_ms, local_workers=0 if remote else args.workers,
        expect_workers=args.expect_workers if remote else args.workers,
        bind_host=args.master_bind_host if remote else "127.0.0.1",
        # local workers connect to a free port unless --master-port names one (then it is that port or an error)
        master_port=(args.master_port or DEFAULT_MASTER_PORT) if remote else (args.master_port or 0),
        stop_on_budget=not args.no_stop, slots=slots,
        quiet=args.quiet,
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


def load_document(args: argparse.Namespace, described: dict[str, Any], sweeps: list[dict[str, Any]],
                  interrupted: str | None = None) -> dict[str, Any]:
    return {
        "slo_first_sentence_ms": args.slo_first_sentence_ms,
        "goodput_target": stats.GOODPUT_TARGET,
        "max_error_rate": stats.MAX_ERROR_RATE,
        "generator_bound_share": stats.GENERATOR_BOUND_SHARE,
        "min_judged_turns": stats.MIN_JUDGED_TURNS,
        "step_s": args.step_s, "warmup_s": args.warmup_s, "callers": list(args.callers),
        "stop_on_budget": not args.no_stop,
        "workers": "remote" if args.master else args.workers,
        "caller": described,
        "samples_csv": LOAD_SAMPLES,
        # null: every planned sweep ran to its end; else why it ended early (the sweeps and steps here are complete)
        "interrupted": interrupted,
        "sweeps": sweeps,
    }


def managed_settings(args: argparse.Namespace, slots: int) -> ServerSettings:
    return ServerSettings(port=args.port, ctx=max(args.ctx, slots * CTX_PER_SLOT), slots=slots,
                          threads=args.threads, api_key=api_key_from_env(args.api_key))


def _refuse_other_managed(args: argparse.Namespace, settings: ServerSettings) -> None:
    """A managed server already on --port with other slots or context cannot be swept (server.start would say only
    that its settings differ): name what each of its slots holds and the ways on, before anything starts."""
    record = server.read_record(settings.port)
    if record is None or not server.is_alive(record) or (record.slots, record.ctx) == (settings.slots, settings.ctx):
        return
    same = managed_settings(args, record.slots)
    sweep_it = f"sweep it with --slots {record.slots}, " if (same.slots, same.ctx) == (record.slots, record.ctx) else ""
    raise ConfigError(
        f"a managed llama-server already runs on port {record.port} with {slots_label(record.slots)} and -c "
        f"{record.ctx} ({record.ctx // record.slots} tokens per slot), and this sweep needs {slots_label(settings.slots)} "
        f"and -c {settings.ctx} ({settings.ctx // settings.slots} tokens per slot): {sweep_it}measure that server as "
        f"it is with --url {record.url} (its context is checked first), or stop it first "
        f"(`voice-llm down --port {record.port}`)")


def start_managed(args: argparse.Namespace, slots: int, progress: Progress) -> tuple[str, bool, int]:
    """The managed server with ``slots`` slots: (its URL, whether this command started it and must stop it, its pid)."""
    settings = managed_settings(args, slots)
    _refuse_other_managed(args, settings)
    binary = provision.ensure_server_binary(args.server_bin, progress)
    model = provision.ensure_model(args.model, progress)
    # A managed server already running with other settings is an error that names them (server.start).
    record, already = server.up(settings, binary, model, progress)
    return record.url, not already, record.pid


def served_slots(url: str, api_key: str | None) -> int | None:
    """The slots a server at --url says it has (/props); None for a server that does not say."""
    try:
        props = ServerClient(url, api_key).props()
    except StreamError as exc:
        if isinstance(exc, ServerUnreachableError):
            raise
        return None
    slots = props.get("total_slots") if isinstance(props, dict) else None
    return slots if isinstance(slots, int) else None


def served_model(url: str, api_key: str | None) -> str | None:
    """The model name every request carries: the first id of /v1/models (as the lab sends it); None if the server
    does not list one (the request then names no model, which llama-server accepts)."""
    try:
        _, doc = ServerClient(url, api_key).get_json("/v1/models")
    except StreamError:
        return None
    ids = model_ids(doc)
    return ids[0] if ids else None


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


def _metadata(url: str, key: str | None, managed: bool, args: argparse.Namespace) -> dict[str, Any]:
    """The run identity of the server a sweep measured (read while it is up), so load.json can join the lab's
    run in OUT when it is the same server, model and KB."""
    try:
        props = ServerClient(url, key).props()
    except StreamError:
        props = None
    facts = runmeta.ServerFacts.from_props(url, props, managed=managed, threads=getattr(args, "threads", None))
    return runmeta.collect_metadata(facts, Path(args.kb or default_kb_dir()))


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


def _fix(args: argparse.Namespace, fit: preflight.ContextFit, slots: int | None) -> str:
    fewer = f"or fewer documents (--docs, now {args.docs})"
    want = preflight.suggested_ctx(fit.tokens, slots or 1)
    if args.url:
        try:
            port = urllib.parse.urlsplit(args.url).port
        except ValueError:
            port = None
        where = f" --port {port}" if port else ""
        return (f"Start the server with a context of more than {fit.tokens} tokens per slot, e.g. "
                f"`voice-llm up{where} --slots {slots or 1} --ctx {want} --restart` (each slot gets --ctx / --slots; "
                f"--restart replaces a server already running there), {fewer}")
    return (f"Run load with --ctx {want} (the managed server gets --ctx or {CTX_PER_SLOT} tokens per slot, "
            f"whichever is more), {fewer}")


def check_context(args: argparse.Namespace, url: str, key: str | None, slots: int | None, caller: CallerConfig,
                  described: dict[str, Any], later: list[tuple[int, int]]) -> str | None:
    """Refuse (ContextLimitError) before any turn if the call's longest request does not fit one slot of the server
    at ``url``, or of a managed server still to come (``later``: its slots and context per slot, counted with this
    server's tokenizer: the same model). The same check as the lab's (voice_llm.lab.preflight). Returns a note
    for the user when the context cannot be checked."""
    client = ServerClient(url, key, timeout=args.timeout)
    fit = preflight.longest_fit(client, planned_requests(caller, described))
    if fit is None:
        return (f"the server at {url} does not say its context per slot (no /props n_ctx: not a llama-server?): "
                "the call's prompt length is not checkable; going on")
    where = f"the server at {url}" if args.url else f"the managed server on port {args.port}"
    for n_ctx, slot_count, place in ((fit.n_ctx, slots, where),
                                     *((c, n, f"the managed server for the {slots_label(n)} sweep") for n, c in later)):
        candidate = replace(fit, n_ctx=n_ctx)
        if not candidate.fits:
            raise ContextLimitError(_too_long_for_load(candidate, described, place, slot_count,
                                                       _fix(args, candidate, slot_count)))
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


def _notify(args: argparse.Namespace, line: str) -> None:
    if not args.quiet:
        print(f"load: {line}", file=sys.stderr)


def run_load(args: argparse.Namespace, out: Path, progress: Progress, run: LoadRun | None = None) -> LoadRun:
    """Every sweep (one per slot count, or one against --url), gathered in ``run`` as each ends, so that an
    exception (Ctrl-C, SIGTERM, a failure) leaves in it everything measured before."""
    run = run if run is not None else LoadRun()
    key = api_key_from_env(args.api_key)
    # Bad flags, dialogue or KB are named before any server starts.
    caller, described = caller_config(args, "", out)
    run.described = described
    base_plan = sweep_plan(args, caller, None)
    planned = list((None,) if args.url else args.slots)
    for index, slots in enumerate(planned):
        started = False
        if args.url:
            url, slots = args.url, served_slots(args.url, key)
            pid = local_listener_pid(url)
        else:
            url, started, pid = start_managed(args, slots, progress)
        if pid is not None:
            run.server_pids.add(pid)
        try:
            # Before the first turn of each sweep; the first also checks the managed servers still to come.
            later = [] if index or args.url else [(n, managed_settings(args, n).ctx // n) for n in planned[1:]]
            note = check_context(args, url, key, slots, caller, described, later)
            if note:
                _notify(args, note)
            run.metadata = run.metadata or _metadata(url, key, not args.url, args)
            model = served_model(url, key)
            plan = replace(base_plan, caller=replace(caller, url=url, model=model), slots=slots)
            try:
                result = run_sweep(plan, key)
            except (SweepInterrupted, LoadError) as exc:
                if exc.partial is not None:
                    run.add(plan, exc.partial, slots, url)
                    run.interrupted = exc.partial.get("interrupted")
                run.interrupted = run.interrupted or ("interrupted (SIGINT or SIGTERM)" if isinstance(exc, SweepInterrupted)
                                                      else f"failed: {exc}")
                run.interrupted += f", in the sweep of {slots_label(slots)}"
                raise
        finally:
            if started:
                server.down(args.port)
        run.add(plan, result, slots, url)
    return run


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


def save_run(args: argparse.Namespace, out: Path, run: LoadRun, started_at: str, load_start: list[float] | None,
             wall_ms: float, load_samples: list[dict[str, float]]) -> tuple[dict[str, Any], Path, Path]:
    """load_samples.csv, load.json and run.json, in that order (the samples before the document that
    summarizes them); also for an interrupted or failed run, marked so in load.json and run.json."""
    doc = load_document(args, run.described, run.sweeps, run.interrupted)
    # load.json joins the run in OUT when the (first) server is the lab's; else it starts a run of its own.
    before = runmeta.RunRecord.load(out)
    record, note = runmeta.RunRecord.join_or_start(out, run.metadata, {"load": (LOAD, LOAD_SAMPLES)})
    if before is None or before.run_id != record.run_id:  # a new run: it began when load began, not now
        record.doc["started_at"], record.doc["load_average_start"] = started_at, load_start
    if note:
        print(note, file=sys.stderr)
    samples_path = write_samples(out / LOAD_SAMPLES, run.samples)
    record.record_file(samples_path)
    load_path = write_json(out / LOAD, runmeta.stamp(doc, record.run_id))
    record.record_file(load_path)
    record.add_step({"step": "load", "wall_ms": wall_ms, "server_compute_ms": None, "load_samples": load_samples})
    record.finish(["load"], "load" if run.interrupted else None, run.interrupted)
    record.save()
    return doc, load_path, samples_path


def _kept(run: LoadRun, out: Path) -> str:
    if not run.measured:
        return "nothing was measured yet, so nothing was written; files already in the folder are untouched"
    return (f"kept {out / LOAD} ({run.steps} complete steps in {len(run.sweeps)} sweeps, marked interrupted) and "
            f"{out / LOAD_SAMPLES} ({len(run.samples)} turns so far)")


def cmd_load(args: argparse.Namespace, progress: Progress) -> int:
    if args.worker:
        return run_worker(args)
    out = ensure_out_dir(args.out.expanduser())
    t0 = time.perf_counter()
    started_at, load_start = runmeta.now_iso(), runmeta.load_average()
    run = LoadRun()
    with locked_out(out, "load", wait=args.wait):
        with noise.LoadSampler(lambda: run.server_pids) as sampler:
            try:
                run_load(args, out, progress, run)
            except KeyboardInterrupt:
                run.interrupted = run.interrupted or "interrupted (SIGINT or SIGTERM)"
                failure: BaseException | None = KeyboardInterrupt()
            except (VoiceLLMError, StreamError, OSError) as exc:
                run.interrupted = run.interrupted or f"failed: {exc}"
                failure = exc
            else:
                failure = None
        if failure is not None and not run.measured:
            if isinstance(failure, KeyboardInterrupt):
                print(f"voice-llm load: interrupted; {_kept(run, out)}", file=sys.stderr)
                return EXIT_INTERRUPTED
            raise failure
        doc, load_path, samples_path = save_run(args, out, run, started_at, load_start,
                                                (time.perf_counter() - t0) * 1000.0, sampler.samples)
        if isinstance(failure, KeyboardInterrupt):
            print(f"voice-llm load: interrupted; {_kept(run, out)}", file=sys.stderr)
            return EXIT_INTERRUPTED
        if failure is not None:
            failure.add_note(_kept(run, out).replace("marked interrupted", "marked failed"))
            raise failure
        try:
            html: Path | None = _render(out)
            render_error = None
        except Exception as exc:  # drawing must never lose what was measured: the files above are written
            html, render_error = None, f"{type(exc).__name__}: {exc}"
    for line in summary_lines(doc):
        print(line)
    print(f"{load_path}\n{samples_path}")
    if render_error is not None:
        print(f"voice-llm load: the measurements are saved ({LOAD}, {LOAD_SAMPLES}), but report.html could not be "
              f"drawn: {render_error}", file=sys.stderr)
        return EXIT_FAILED
    print(f"report: {html}")
    return EXIT_OK if all(s["verdict"]["max_callers"] is not None for s in doc["sweeps"]) else EXIT_NO_VERDICT


def _render(out: Path) -> Path:
    """report.html again, with the load section (the lab's sections from the files already in OUT)."""
    from voice_llm.checks.core import run_checks
    from voice_llm.report.page import render_report  # matplotlib: only now

    return render_report(out, run_checks(out))
