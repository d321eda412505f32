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
from dataclasses import fields
from pathlib import Path
from typing import Any

from voice_llm.core.errors import EXIT_INTERRUPTED, EXIT_NO_VERDICT, EXIT_OK, EXIT_REPORT_INCOMPLETE
from voice_llm.core.run import flags
from voice_llm.capabilities.load import stats, locust_users_path
from voice_llm.capabilities.load.doc import judged_on
from voice_llm.capabilities.load.plan import (DEFAULT_BARGE_IN_SHARE, DEFAULT_CALLERS, DEFAULT_MASTER_PORT,
                                 DEFAULT_SLO_FIRST_SENTENCE_MS, DEFAULT_SLO_HEARD_MS, DEFAULT_STEP_S, DEFAULT_WARMUP_S,
                                 DIAL_CALLERS, DIAL_DEADLINE_S, DIAL_STEP_S, DIAL_TURNS, DIAL_WARMUP_S,
                                 AGENT_LOAD_MAX_TOKENS, DIAL_LINE_SETS, DIAL_LINES, LOAD_MAX_TOKENS, LOAD_THINK_SCALE,
                                 SPEECH_WORDS_PER_S)
from voice_llm.capabilities.load.run import run_load
from voice_llm.capabilities.load.settings import LoadSettings
from voice_llm.capabilities.load.stats import slots_label
from voice_llm.core.scenario import dialogue as dialogues
from voice_llm.core.server.config import DEFAULT_CTX, DEFAULT_PORT, api_key_from_env
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `load` subcommand's own flags (add_commands adds the common ones: --out, --url, --kb, --api-key...)."""
    p.add_argument("--callers", type=flags.int_list, default=None,
                   help=f"steps of concurrent callers, upward (default {_csv(DEFAULT_CALLERS)}; --dial {_csv(DIAL_CALLERS)})")
    p.add_argument("--max-callers", type=flags.positive_int, default=64, help="never run a step with more callers than this")
    p.add_argument("--step-s", type=flags.positive_number, default=None,
                   help=f"the longest measured window per step (s; default {DEFAULT_STEP_S:g}, --dial {DIAL_STEP_S:g}): "
                        f"it ends sooner, once {stats.MIN_JUDGED_TURNS} judged turns are in")
    p.add_argument("--warmup-s", type=flags.non_negative_number, default=None,
                   help=f"dropped window at the start of each step (s; default {DEFAULT_WARMUP_S:g}, --dial {DIAL_WARMUP_S:g})")
    dial = p.add_argument_group("dialing callers: each caller a real call on the line (voice-llm dial), judged at its ear")
    dial.add_argument("--dial", metavar="URL", default=None,
                      help="the agent's WebSocket, e.g. ws://127.0.0.1:18300/ of `voice-llm agent --max-calls 8 "
                           f"--max-tokens {AGENT_LOAD_MAX_TOKENS}` (short replies: a step is judged in minutes; add "
                           "--otlp http://HOST:PORT with --otlp-listen for its stage times) on an LLM server with a "
                           "slot per caller (`voice-llm up --slots 4 --ctx 16384`: with one slot, calls queue and "
                           "re-prefill each other's history); no LLM server is started or asked")
    dial.add_argument("--slo-heard-ms", type=flags.positive_number, default=DEFAULT_SLO_HEARD_MS,
                      help="heard-gap budget: goodput counts turns heard within it; the sweep stops when p90 exceeds it")
    dial.add_argument("--dial-turns", type=flags.positive_int, default=DIAL_TURNS,
                      help=f"caller lines per call (default {DIAL_TURNS}: short calls, a verdict in minutes)")
    dial.add_argument("--dial-lines", choices=DIAL_LINE_SETS, default=DIAL_LINES,
                      help=f"the caller's lines (dial --caller-lines; default {DIAL_LINES}: short clinic questions, "
                           "about a second each; clinic: the dialogue's longer ones)")
    dial.add_argument("--dial-barge-in-turns", type=_turn_list, default=(),
                      help="turns whose reply the caller cuts into (default none)")
    dial.add_argument("--dial-protocol", choices=("twilio", "pcm"), default="twilio", help="the line (default twilio)")
    dial.add_argument("--dial-deadline", dest="dial_deadline_s", type=flags.positive_number, default=DIAL_DEADLINE_S,
                      help="dial --deadline: the longest wait for the handshake, a reply, a reply's end (s)")
    dial.add_argument("--otlp-listen", metavar="HOST:PORT", default=None,
                      help="receive the agent's OTel spans of every call here (start the agent with --otlp "
                           "http://HOST:PORT): each step gets the agent's stage times and the stage that grew most")
    p.add_argument("--slo-first-sentence-ms", type=flags.positive_number, default=DEFAULT_SLO_FIRST_SENTENCE_MS,
                   help="first-sentence budget: goodput counts turns within it; the sweep stops when p90 exceeds it")
    p.add_argument("--no-stop", action="store_true", help="run every step even past the budget")
    p.add_argument("--workers", type=flags.positive_int, default=2, help="local Locust worker processes")
    p.add_argument("--slots", type=flags.int_list, default=None,
                   help="managed server: one sweep per slot count (-np), e.g. 1,4; each slot gets a 4096 context "
                        "(default: the managed server running on --port as it is, else 1,4)")
    p.add_argument("--port", type=flags.port_number, default=DEFAULT_PORT, help="port of the managed server")
    p.add_argument("--ctx", type=flags.positive_int, default=DEFAULT_CTX, help="at least this context (default: 4096 per slot)")
    p.add_argument("--threads", type=flags.positive_int, help="CPU threads for the managed server")
    p.add_argument("--model", help="GGUF model file for the managed server")
    p.add_argument("--server-bin", help="llama-server binary for the managed server")
    p.add_argument("--dialogue", default=dialogues.DEFAULT_DIALOGUE,
                   help=f"bundled dialogue, or {dialogues.LAB_TTFT} (the ttft step's request, cache off, as a call)")
    p.add_argument("--docs", type=flags.non_negative_int, default=dialogues.DEFAULT_DOCS, help="KB documents in the system prompt")
    p.add_argument("--max-tokens", type=flags.positive_int,
                   help=f"cap each answer (default: the dialogue's, at most {LOAD_MAX_TOKENS}: short replies for load)")
    p.add_argument("--think-scale", type=flags.non_negative_number, default=LOAD_THINK_SCALE,
                   help="multiply every think time, the caller's line and listening to the answer (0: none; 1: as long "
                        "as speaking takes)")
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


def _csv(values: tuple[int, ...]) -> str:
    return ",".join(str(v) for v in values)


def _turn_list(text: str) -> tuple[int, ...]:
    return () if text.strip().lower() in ("", "none") else tuple(flags.int_list(text))


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
        judged = ", ".join(f"{s['judged']} at {s['callers']} callers" for s in sweep["steps"]) or "no step"
        return (f"{where}: no verdict: each step was judged on fewer than {minimum} turns ({judged}), the "
                f"fewest on which one late turn still passes {100 * verdict['goodput_target']:.0f} % goodput; "
                f"{_more_turns(doc, sweep, minimum)}")
    limit = f", limited by {verdict['limited_by']}" if verdict["limited_by"] else ""
    limit += _stage(verdict.get("saturating_stage"), bool(verdict["limited_by"]))
    if verdict["max_callers"] == 0 and not verdict.get("saturating_stage"):
        limit += stats.largest_stage_words(sweep["steps"])
    rests = (f"{verdict['judged_turns']} judged turns at {verdict['max_callers']} callers" if verdict["max_callers"]
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
    grew = (f"{label} at {saturating['callers']} callers (+{saturating['growth_ms']:.0f} ms median from "
            f"{saturating['from_callers']} caller{'' if saturating['from_callers'] == 1 else 's'})")
    return f": {grew}" if limited else f"; the agent's stage that grew most: {grew}"


def _none_passed(sweep: dict[str, Any], minimum: int) -> str:
    """Why the verdict is 0: the first judged step failed early (more misses than the target
    allows in ``minimum`` turns) or on its ``minimum`` judged turns."""
    verdict = sweep["verdict"]
    first = next(s for s in sweep["steps"] if stats.decided(s, "failed_early" in verdict))
    if first["callers"] in (verdict.get("failed_early") or []):
        return (f"no step passed: at {first['callers']} callers {first['judged'] - first['good']} of "
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


