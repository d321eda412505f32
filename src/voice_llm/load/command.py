"""`voice-llm load`: how many voice callers a server takes while the first sentence still comes within budget.

This module never imports locust (see voice_llm.load.runner): it parses the flags, starts the managed server
once per ``--slots`` value, runs one sweep per server through the Locust master subprocess, and writes
load.json and the raw samples CSV. `--worker` only execs a Locust worker for a master on another machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from voice_llm import dialogue as dialogues
from voice_llm import provision, runmeta, server
from voice_llm.api import ServerClient
from voice_llm.artifacts import LOAD, LOAD_SAMPLES, ensure_out_dir, write_json
from voice_llm.config import DEFAULT_CTX, DEFAULT_PORT, ServerSettings, api_key_from_env
from voice_llm.errors import ConfigError
from voice_llm.kb import default_kb_dir, load_kb
from voice_llm.load import stats
from voice_llm.load.plan import (DEFAULT_BARGE_IN_SHARE, DEFAULT_MASTER_PORT, DEFAULT_SLO_FIRST_SENTENCE_MS,
                                 DEFAULT_STEP_S, DEFAULT_WARMUP_S, SPEECH_WORDS_PER_S, CallerConfig, SweepPlan)
from voice_llm.load.runner import run_sweep
from voice_llm.load.samples import write_samples
from voice_llm.load.speech import answer_speech_rate
from voice_llm.load.stats import slots_label
from voice_llm.outlock import locked_out
from voice_llm.progress import Progress
from voice_llm.sse import ServerUnreachableError, StreamError

CTX_PER_SLOT = 4096  # each slot gets the lab's whole context: the 12-document call grows to ~3000 tokens


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
    p.add_argument("--max-callers", type=int, default=64, help="never run a step with more callers than this")
    p.add_argument("--step-s", type=float, default=DEFAULT_STEP_S, help="measured window per step (s)")
    p.add_argument("--warmup-s", type=float, default=DEFAULT_WARMUP_S, help="dropped window at the start of each step (s)")
    p.add_argument("--slo-first-sentence-ms", type=float, default=DEFAULT_SLO_FIRST_SENTENCE_MS,
                   help="first-sentence budget: goodput counts turns within it; the sweep stops when p90 exceeds it")
    p.add_argument("--no-stop", action="store_true", help="run every step even past the budget")
    p.add_argument("--workers", type=int, default=2, help="local Locust worker processes")
    p.add_argument("--slots", type=_int_list, default=(1, 4),
                   help="managed server: one sweep per slot count (-np), e.g. 1,4; each slot gets a 4096 context")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port of the managed server")
    p.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="at least this context (default: 4096 per slot)")
    p.add_argument("--threads", type=int, help="CPU threads for the managed server")
    p.add_argument("--model", help="GGUF model file for the managed server")
    p.add_argument("--server-bin", help="llama-server binary for the managed server")
    p.add_argument("--dialogue", default=dialogues.DEFAULT_DIALOGUE,
                   help=f"bundled dialogue, or {dialogues.LAB_TTFT} (the ttft step's request, cache off, as a call)")
    p.add_argument("--docs", type=int, default=dialogues.DEFAULT_DOCS, help="KB documents in the system prompt")
    p.add_argument("--max-tokens", type=int, help="cap each answer (default: the dialogue's, 64)")
    p.add_argument("--think-scale", type=float, default=1.0, help="multiply every think time (0: none)")
    p.add_argument("--barge-in", type=float, default=DEFAULT_BARGE_IN_SHARE, help="share of turns the caller cuts short")
    p.add_argument("--caller-words-per-s", type=float, default=SPEECH_WORDS_PER_S, help="how fast callers speak")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--master", action="store_true", help="run only the master; workers join from other machines")
    mode.add_argument("--worker", action="store_true", help="run one Locust worker for a master at --master-host")
    p.add_argument("--expect-workers", type=int, default=1, help="with --master: workers to wait for")
    p.add_argument("--master-host", default="127.0.0.1", help="with --worker: the master's address")
    p.add_argument("--master-bind-host", default="0.0.0.0", help="with --master: the interface workers connect to")
    p.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT, help="with --master or --worker: the master's port")


def run_worker(args: argparse.Namespace) -> int:
    """A Locust worker in the foreground; the master sends it the server's URL and the callers' settings."""
    from voice_llm.load import voice_caller_path

    command = [sys.executable, "-m", "locust", "-f", voice_caller_path(), "--worker", "--master-host",
               args.master_host, "--master-port", str(args.master_port), "--loglevel", "WARNING"]
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
    return SweepPlan(
        caller=caller, callers=callers, step_s=args.step_s, warmup_s=args.warmup_s,
        slo_first_sentence_ms=args.slo_first_sentence_ms, local_workers=0 if remote else args.workers,
        expect_workers=args.expect_workers if remote else args.workers,
        bind_host=args.master_bind_host if remote else "127.0.0.1",
        master_port=args.master_port if remote else 0, stop_on_budget=not args.no_stop, slots=slots,
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
        "started": result["started"], "ended": result["ended"], "steps": steps,
        "verdict": stats.verdict(steps, slots),
    }
    return doc, samples


def load_document(args: argparse.Namespace, described: dict[str, Any], sweeps: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "slo_first_sentence_ms": args.slo_first_sentence_ms,
        "goodput_target": stats.GOODPUT_TARGET,
        "max_error_rate": stats.MAX_ERROR_RATE,
        "generator_bound_share": stats.GENERATOR_BOUND_SHARE,
        "step_s": args.step_s, "warmup_s": args.warmup_s, "callers": list(args.callers),
        "stop_on_budget": not args.no_stop,
        "workers": "remote" if args.master else args.workers,
        "caller": described,
        "samples_csv": LOAD_SAMPLES,
        "sweeps": sweeps,
    }


def managed_settings(args: argparse.Namespace, slots: int) -> ServerSettings:
    return ServerSettings(port=args.port, ctx=max(args.ctx, slots * CTX_PER_SLOT), slots=slots,
                          threads=args.threads, api_key=api_key_from_env(args.api_key))


def start_managed(args: argparse.Namespace, slots: int, progress: Progress) -> tuple[str, bool]:
    """The managed server with ``slots`` slots: (its URL, whether this command started it and must stop it)."""
    settings = managed_settings(args, slots)
    binary = provision.ensure_server_binary(args.server_bin, progress)
    model = provision.ensure_model(args.model, progress)
    # A managed server already running with other settings is an error that names them (server.start).
    record, already = server.up(settings, binary, model, progress)
    return record.url, not already


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


def _metadata(url: str, key: str | None, managed: bool, args: argparse.Namespace) -> dict[str, Any]:
    """The run identity of the server a sweep measured (read while it is up), so load.json can join the lab's
    run in OUT when it is the same server, model and KB."""
    try:
        props = ServerClient(url, key).props()
    except StreamError:
        props = None
    facts = runmeta.ServerFacts.from_props(url, props, managed=managed, threads=getattr(args, "threads", None))
    return runmeta.collect_metadata(facts, Path(args.kb or default_kb_dir()))


def run_load(args: argparse.Namespace, out: Path, progress: Progress) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Every sweep (one per slot count, or one against --url): load.json's document, all raw samples, and the
    run metadata of the first sweep's server."""
    key = api_key_from_env(args.api_key)
    # Bad flags, dialogue or KB are named before any server starts.
    caller, described = caller_config(args, "", out)
    base_plan = sweep_plan(args, caller, None)
    sweeps: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    metadata: dict[str, Any] = {}
    for slots in ((None,) if args.url else args.slots):
        started = False
        if args.url:
            url, slots = args.url, served_slots(args.url, key)
        else:
            url, started = start_managed(args, slots, progress)
        try:
            metadata = metadata or _metadata(url, key, not args.url, args)
            plan = replace(base_plan, caller=replace(caller, url=url), slots=slots)
            result = run_sweep(plan, key)
        finally:
            if started:
                server.down(args.port)
        doc, rows = sweep_document(plan, result, slots, url)
        sweeps.append(doc)
        samples.extend(rows)
    return load_document(args, described, sweeps), samples, metadata


def summary_lines(doc: dict[str, Any]) -> list[str]:
    """One line per sweep: the verdict and what limited it."""
    lines = []
    for sweep in doc["sweeps"]:
        verdict = sweep["verdict"]
        where = slots_label(sweep["slots"]) if sweep["slots"] is not None else sweep["url"]
        limit = f", limited by {verdict['limited_by']}" if verdict["limited_by"] else ""
        lines.append(f"{where}: max callers = {verdict['max_callers']} (first sentence <= "
                     f"{doc['slo_first_sentence_ms']:.0f} ms for >= {100 * verdict['goodput_target']:.0f} % of turns; "
                     f"tested up to {verdict['tested_up_to']}{limit})")
    return lines


def cmd_load(args: argparse.Namespace, progress: Progress) -> int:
    if args.worker:
        return run_worker(args)
    out = ensure_out_dir(args.out.expanduser())
    t0 = time.perf_counter()
    with locked_out(out, "load", wait=args.wait):
        doc, rows, metadata = run_load(args, out, progress)
        # load.json joins the run in OUT when the (first) server is the lab's; else it starts a run of its own.
        record, note = runmeta.RunRecord.join_or_start(out, metadata, {"load": (LOAD, LOAD_SAMPLES)})
        if note:
            print(note, file=sys.stderr)
        samples_path = write_samples(out / LOAD_SAMPLES, rows)
        record.record_file(samples_path)
        load_path = write_json(out / LOAD, runmeta.stamp(doc, record.run_id))
        record.record_file(load_path)
        record.add_step({"step": "load", "wall_ms": (time.perf_counter() - t0) * 1000.0, "server_compute_ms": None})
        record.finish(["load"], None, None)
        record.save()
        html = _render(out)
    for line in summary_lines(doc):
        print(line)
    print(f"{load_path}\n{samples_path}")
    print(f"report: {html}")
    return 0


def _render(out: Path) -> Path:
    """report.html again, with the load section (the lab's sections from the files already in OUT)."""
    from voice_llm.check import run_checks
    from voice_llm.report_html import render_report  # matplotlib: only now

    return render_report(out, run_checks(out))
