"""`voice-llm load`, the command: its flags, what the user reads, and the exit status (the one table of every
command, voice_llm.core.errors.EXIT_TABLE: EXIT_OK every sweep reached a verdict; EXIT_FAILURE something failed, what
was measured is kept; EXIT_REPORT_INCOMPLETE saved, but report.html could not be drawn, as the lab's;
EXIT_NO_VERDICT measured, but a sweep has no verdict; EXIT_INTERRUPTED Ctrl-C or SIGTERM, what was measured kept).

The flags are added by :func:`add_commands` (the capability's ``commands=``); :func:`main` turns them into a
:class:`voice_llm.capabilities.load.run.LoadSettings` and calls :func:`voice_llm.capabilities.load.run.run_load`: nothing below this module
takes argparse. `--worker` only execs a Locust worker for a master on another machine. Never imports locust.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from voice_llm.core.errors import EXIT_INTERRUPTED, EXIT_NO_VERDICT, EXIT_OK, EXIT_REPORT_INCOMPLETE
from voice_llm.core.run import flags
from voice_llm.capabilities.load import stats, locust_users_path
from voice_llm.capabilities.load.doc import judged_on
from voice_llm.capabilities.load.plan import DEFAULT_MASTER_PORT, LOAD_MAX_TOKENS, LOAD_THINK_SCALE
from voice_llm.capabilities.load.run import run_load
from voice_llm.capabilities.load.settings import LoadSettings
from voice_llm.capabilities.load.stats import slots_label
from voice_llm.core.server.config import api_key_from_env
from voice_llm.core.util.artifacts import LOAD, LOAD_SAMPLES
from voice_llm.core.util.progress import Progress


def add_commands(sub: Any) -> None:
    """The `load` command (``sub``: the CLI's subparsers), with every flag it reads and its handler."""
    help_text = "how many callers a server takes within the first-sentence budget (Locust)"
    p = sub.add_parser("load", help=help_text, description=help_text, epilog=textwrap.fill(TEXT_DEFAULTS_EPILOG, 79))
    flags.out_option(p)
    flags.request_options(p, deadline=False)  # load reads --timeout (each caller's CallerConfig.timeout_s) only
    flags.kb_option(p)
    flags.wait_option(p)
    flags.api_key_option(p)
    flags.new_run_option(p)
    flags.quiet_option(p)
    add_arguments(p)
    p.set_defaults(run_command=main, settings_of=settings_from)


# What the defaults are made for, and what they gave here (BENCHMARKS.md "text-mode load: a verdict in minutes").
TEXT_DEFAULTS_EPILOG = (
    f"The defaults are made for a verdict in minutes: a step's window ends at its {stats.MIN_JUDGED_TURNS}th judged "
    f"turn (--step-s is the longest) or at its {stats.ALLOWED_MISSES + 1}nd missed one (it fails early), "
    f"answers of up to {LOAD_MAX_TOKENS} tokens, think time x{LOAD_THINK_SCALE:g}; one caller's turn takes ~5 s on an "
    "idle 2-core box (20 turns in ~100 s). Measured: after `voice-llm up --slots 4 --ctx 16384`, `voice-llm load` "
    "gave its verdict in 2 min 25 s on a 2-core box shared with four other servers (load 7). With no --url or "
    "--slots, load sweeps the managed server running on --port as it is.")


# The command's own flags, derived from LoadSettings' declarations, in the order and groups `load --help` shows.
SWEEP_FLAGS = flags.flags_of(LoadSettings, ("callers", "max_callers", "step_s", "warmup_s"))
DIAL_FLAGS = flags.flags_of(LoadSettings, ("dial", "slo_heard_ms", "dial_turns", "dial_lines", "dial_barge_in_turns",
                                           "dial_protocol", "dial_deadline_s", "otlp_listen"))
SERVER_FLAGS = flags.flags_of(LoadSettings, ("slo_first_sentence_ms", "stop_on_budget", "workers", "slots", "port", "ctx",
                                             "threads", "model", "server_bin", "dialogue", "docs", "max_tokens",
                                             "think_scale", "barge_in", "caller_words_per_s"))
MODE_FLAGS = flags.flags_of(LoadSettings, ("master", "worker"))  # one or the other
DISTRIBUTED_FLAGS = flags.flags_of(LoadSettings, ("expect_workers", "master_host", "master_bind_host", "master_port"))
# The settings whose flags are the core's, shared by every command that writes a run (add_commands adds them).
SHARED_FLAGS = flags.flags_of(LoadSettings, ("out", "url", "timeout", "kb_dir", "wait_for_out", "new_run", "quiet"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `load` subcommand's own flags (add_commands adds the common ones: --out, --url, --kb, --api-key...)."""
    SWEEP_FLAGS.add(p)
    DIAL_FLAGS.add(p.add_argument_group("dialing callers: each caller a real call on the line (voice-llm dial), "
                                        "judged at its ear"))
    SERVER_FLAGS.add(p)
    MODE_FLAGS.add(p.add_mutually_exclusive_group())
    DISTRIBUTED_FLAGS.add(p)


def settings_from(values: Mapping[str, Any]) -> LoadSettings:
    """LoadSettings from the parsed flags (a mapping of dest -> value; flags not given keep the defaults)."""
    given = {}
    for derived in (SHARED_FLAGS, SWEEP_FLAGS, DIAL_FLAGS, SERVER_FLAGS, MODE_FLAGS, DISTRIBUTED_FLAGS):
        given |= derived.given(values)
    if isinstance(given.get("out"), Path):
        given["out"] = given["out"].expanduser()
    given["api_key"] = api_key_from_env(values.get("api_key"))
    return flags.build(LoadSettings, given)


def main(settings: LoadSettings, progress: Progress) -> int:
    """The command: run_load, then what the user reads and the exit status."""
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
    command = [sys.executable, "-m", "locust", "-f", locust_users_path(), "--worker", "--master-host",
               settings.master_host, "--master-port", str(settings.master_port or DEFAULT_MASTER_PORT),
               "--loglevel", "WARNING"]
    return subprocess.call(command)


# --- what the user reads ------------------------------------------------------------------------------------


def verdict_line(doc: dict[str, Any], sweep: dict[str, Any]) -> str:
    """The verdict of one sweep, with the turns it rests on; or why there is none and how to get one."""
    verdict = sweep["verdict"]
    where = slots_label(sweep["slots"]) if sweep["slots"] is not None else sweep["url"]
    judged = judged_on(doc)
    if judged.dialing:
        where = f"the agent at {sweep['url']}"
    minimum = verdict.get("min_judged_turns", stats.MIN_JUDGED_TURNS)
    if verdict["max_callers"] is None:
        judged = ", ".join(f"{s['judged']} at {stats.callers_text(s['callers'])}" for s in sweep["steps"]) or "no step"
        return (f"{where}: no verdict: each step was judged on fewer than {minimum} turns ({judged}), the "
                f"fewest on which one late turn still passes {100 * verdict['goodput_target']:.0f} % goodput; "
                f"{_more_turns(doc, sweep, minimum)}")
    limit = f", limited by {verdict['limited_by']}" if verdict["limited_by"] else ""
    limit += _stage(verdict.get("saturating_stage"), bool(verdict["limited_by"]))
    if verdict["max_callers"] == 0 and not verdict.get("saturating_stage"):
        limit += stats.largest_stage_words(sweep["steps"])
    rests = (f"{verdict['judged_turns']} judged turns at {stats.callers_text(verdict['max_callers'])}" if verdict["max_callers"]
             else _none_passed(sweep, minimum))
    budget = f"{judged.name} <= {judged.slo_ms or 0.0:.0f} ms"
    return (f"{where}: max callers = {verdict['max_callers']} ({budget} "
            f"for >= {100 * verdict['goodput_target']:.0f} % of turns; {rests}; tested up to "
            f"{verdict['tested_up_to']}{limit})")


def _stage(saturating: dict[str, Any] | None, limited: bool) -> str:
    """The agent's stage that grew most (its own spans): 'at 3 callers, STT grew most (+812 ms median from 1)'."""
    if not saturating:
        return ""
    label = stats.STAGE_LABELS.get(saturating["stage"], saturating["stage"])
    grew = (f"{label} at {stats.callers_text(saturating['callers'])} (+{saturating['growth_ms']:.0f} ms median "
            f"from {stats.callers_text(saturating['from_callers'])})")
    return f": {grew}" if limited else f"; the agent's stage that grew most: {grew}"


def _none_passed(sweep: dict[str, Any], minimum: int) -> str:
    """Why the verdict is 0: the first judged step failed early (more misses than the target
    allows in ``minimum`` turns) or on its ``minimum`` judged turns."""
    verdict = sweep["verdict"]
    first = next(s for s in sweep["steps"] if stats.decided(s, "failed_early" in verdict))
    if first["callers"] in (verdict.get("failed_early") or []):
        return (f"no step passed: at {stats.callers_text(first['callers'])} {first['judged'] - first['good']} of "
                f"{first['judged']} judged turns missed, more than the {verdict['allowed_misses']} in {minimum} the "
                "target allows")
    return f"no step passed; the steps judged on enough turns had at least {verdict['judged_turns']}"


def _more_turns(doc: dict[str, Any], sweep: dict[str, Any], minimum: int) -> str:
    """How to get enough turns: a longer measured window at the rate seen, or less think time."""
    rates = [s["judged"] / (s["window"]["end"] - s["window"]["start"]) for s in sweep["steps"]
             if s["judged"] and s["window"]["end"] > s["window"]["start"]]
    # at the slowest step's rate, with a fifth to spare, rounded up to 30 s
    longer = f"--step-s {30 * math.ceil(1.2 * minimum / min(rates) / 30)}" if rates else "a longer --step-s"
    if judged_on(doc).dialing:
        return f"lengthen the measured window ({longer}, now {doc['step_s']:g} s)"
    think = (doc.get("caller") or {}).get("think", {}).get("think_scale", 1.0)
    return (f"lengthen the measured window ({longer}, now {doc['step_s']:g} s) or let the callers think less "
            f"between turns (e.g. --think-scale {think / 4:g}, now {think:g})")


def summary_lines(doc: dict[str, Any]) -> list[str]:
    """One line per sweep: the verdict and what limited it."""
    return [verdict_line(doc, sweep) for sweep in doc["sweeps"]]


